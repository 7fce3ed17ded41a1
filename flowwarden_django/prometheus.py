"""Deprecated alias of :mod:`flowwarden_django.integrations.prometheus` (removed in 0.2)."""

import warnings

from .integrations.prometheus import (
    REGISTRY,
    FlowwardenCollector,
    SignalMetrics,
    build_registry,
    install_receivers,
)

__all__ = [
    "REGISTRY",
    "FlowwardenCollector",
    "SignalMetrics",
    "build_registry",
    "install_receivers",
]

warnings.warn(
    "flowwarden_django.prometheus moved to flowwarden_django.integrations.prometheus; "
    "the old path goes in 0.2",
    DeprecationWarning,
    stacklevel=2,
)
