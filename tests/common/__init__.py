"""Tests of ``flowwarden_django.common``."""
