"""Tests of the admin pages, ``flowwarden_django.admin`` (test client and browser)."""
