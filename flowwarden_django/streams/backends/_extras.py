"""System-check helpers shared by the backends that need optional packages."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from importlib.util import find_spec
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import connections


def missing_extra(setting: str, package: str, extra: str, backend: str) -> checks.Error | None:
    """An E005 error naming *setting* (the alias's setting path) when *package* cannot
    be imported, else ``None``."""
    if find_spec(package) is not None:
        return None
    return checks.Error(
        f"{setting} uses {backend}, which needs the '{package}' package.",
        hint=f'pip install "flowwarden-django[{extra}]"',
        id="flowwarden_django.E005",
    )


def check_using(
    options_setting: str,
    options: Mapping[str, Any],
    supports: Callable[[Any], bool],
    backend: str,
    other: str,
    needs: str = "",
) -> list[checks.CheckMessage]:
    """The option check of an ORM backend (*options_setting*: where its ``OPTIONS``
    are): E006 when ``using`` is not a database alias, E007 when ``supports`` is false
    of its connection (*backend* does not support it, *needs* says why; the hint
    names *other*, the other kind of backend to use)."""
    using = options.get("using")
    if using is None:
        return []
    setting = f'{options_setting}["OPTIONS"]["using"]'
    if using not in settings.DATABASES:
        return [
            checks.Error(
                f"{setting} = {using!r} is not a database alias.",
                hint=f"Use one of: {', '.join(sorted(settings.DATABASES))}.",
                id="flowwarden_django.E006",
            )
        ]
    connection = connections[using]
    if supports(connection):
        return []
    return [
        checks.Error(
            f"{setting} = {using!r} is a {connection.vendor} database, which {backend} "
            f"does not support{needs}.",
            hint=f"Use PostgreSQL, SQLite or MySQL/MariaDB, or another {other}.",
            id="flowwarden_django.E007",
        )
    ]


def ms_precision(value: datetime | None) -> datetime | None:
    """Truncate a datetime to whole milliseconds, the precision Redis and MongoDB keep."""
    if value is None:
        return None
    return value.replace(microsecond=value.microsecond // 1000 * 1000)
