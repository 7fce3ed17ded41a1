"""System-check helpers shared by the backends that need optional packages."""

from __future__ import annotations

from datetime import datetime
from importlib.util import find_spec

from django.core import checks

from ..stores import store_setting


def missing_extra(alias: str, package: str, extra: str, backend: str) -> checks.Error | None:
    """An E005 error when *package* cannot be imported, else ``None``."""
    if find_spec(package) is not None:
        return None
    return checks.Error(
        f"{store_setting(alias)} uses {backend}, which needs the '{package}' package.",
        hint=f'pip install "flowwarden-django[{extra}]"',
        id="flowwarden_django.E005",
    )


def ms_precision(value: datetime | None) -> datetime | None:
    """Truncate a datetime to whole milliseconds, the precision Redis and MongoDB keep."""
    if value is None:
        return None
    return value.replace(microsecond=value.microsecond // 1000 * 1000)
