"""Checks of the bounds on silent network partitions (``common/network.py``): the
PostgreSQL connections of ``DATABASES`` notice one within ``DEAD_CONNECTION_TIMEOUT``
(W501, ``check --deploy`` only)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core import checks

from ..common.durations import parse_duration
from ..common.network import postgres_options
from ..conf import SETTING_NAME, fw_settings


@checks.register(deploy=True)
def check_postgres_keepalives(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``check --deploy``: W501 for a PostgreSQL database whose ``OPTIONS`` leave libpq's
    keepalive timings or ``tcp_user_timeout`` unset (or turn keepalives off): a silent
    partition then blocks a query for the kernel's retransmission timeout (~15 min)."""
    if not isinstance(getattr(settings, SETTING_NAME, {}), Mapping):
        return []
    try:
        bound = parse_duration(fw_settings.DEAD_CONNECTION_TIMEOUT)
    except (TypeError, ValueError):
        return []  # E010 says so
    if bound <= 0:
        return []
    return postgres_keepalive_warnings(settings.DATABASES, bound)


def postgres_keepalive_warnings(
    databases: Mapping[str, Mapping[str, Any]], bound: float
) -> list[checks.CheckMessage]:
    """W501 for each PostgreSQL entry of *databases* lacking what :func:`postgres_options`
    gives for *bound* seconds (each message names the alias and what to add)."""
    wanted = postgres_options(bound)
    messages: list[checks.CheckMessage] = []
    for alias, entry in databases.items():
        if "postg" not in str(entry.get("ENGINE", "")):
            continue
        options = entry.get("OPTIONS") or {}
        missing = {
            key: value
            for key, value in wanted.items()
            if key not in options or (key == "keepalives" and not options[key])
        }
        if not missing:
            continue
        literal = ", ".join(f'"{key}": {value}' for key, value in missing.items())
        messages.append(
            checks.Warning(
                f'DATABASES["{alias}"]["OPTIONS"] lacks {", ".join(missing)}: on a silent '
                "network partition (no reset: a link, a NAT entry or a load balancer's flow "
                "gone) a query waits for the kernel's TCP timeout, about 15 minutes, and a "
                "workflow runner or stream hangs that long instead of "
                f'{bound:g} s ({SETTING_NAME}["DEAD_CONNECTION_TIMEOUT"]).',
                hint=f'Add to DATABASES["{alias}"]["OPTIONS"]: {{{literal}}} (libpq '
                "parameters; tcp_user_timeout is in milliseconds and needs PostgreSQL 12+ "
                "client libraries).",
                id="flowwarden_django.W501",
            )
        )
    return messages
