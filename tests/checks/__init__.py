"""Tests of the system checks of the FLOWWARDEN setting, ``flowwarden_django.checks``."""
