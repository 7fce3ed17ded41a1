"""Tests of the REST API, ``flowwarden_django.api``."""
