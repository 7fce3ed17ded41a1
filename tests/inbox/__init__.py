"""Tests of the approver's inbox, ``flowwarden_django.inbox`` (test client and browser)."""
