"""Exceptions raised by flowwarden-django."""

from django.core.exceptions import ImproperlyConfigured


class InvalidCheckpointStoreError(ImproperlyConfigured):
    """A ``FLOWWARDEN["CHECKPOINT_STORES"]`` entry cannot be turned into a store."""


class MissingExtraError(ImproperlyConfigured):
    """An optional dependency is needed for the configured feature but is not installed."""

    def __init__(self, package: str, extra: str, feature: str) -> None:
        self.package = package
        self.extra = extra
        super().__init__(
            f"{feature} needs the '{package}' package: pip install \"flowwarden-django[{extra}]\""
        )
