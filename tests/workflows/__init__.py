"""Tests of ``flowwarden_django.workflows``: engine, snapshots, approvals, providers."""
