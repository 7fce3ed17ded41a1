"""Tests of ``flowwarden_django.integrations``: Celery."""
