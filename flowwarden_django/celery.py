"""Deprecated alias of :mod:`flowwarden_django.integrations.celery` (removed in 0.2)."""

import warnings

from .integrations.celery import StreamsBootstep, install, install_from_settings

__all__ = ["StreamsBootstep", "install", "install_from_settings"]

warnings.warn(
    "flowwarden_django.celery moved to flowwarden_django.integrations.celery; "
    "the old path goes in 0.2",
    DeprecationWarning,
    stacklevel=2,
)
