"""Tests of ``flowwarden_django.streams``: runtime, manager, stores and their contracts."""
