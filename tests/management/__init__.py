"""Tests of the management commands, ``flowwarden_django.management``."""
