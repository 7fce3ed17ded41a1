"""Tests of the operational endpoints, ``flowwarden_django.views`` and ``.urls``:
``/flowwarden/health/`` and ``/flowwarden/metrics/``, what they report and to whom."""
