"""Deprecated: the old path of ``flowwarden_django.workflows.storage.encryption`` (until 0.3; see
CHANGELOG.md)."""

from ..common.deprecation import moved_module

__getattr__ = moved_module(__name__, "flowwarden_django.workflows.storage.encryption")
