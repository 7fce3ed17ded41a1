"""Checks of the bounds on silent network partitions (``common/network.py``): the
PostgreSQL connections of ``DATABASES`` notice one within ``DEAD_CONNECTION_TIMEOUT``
(W501, ``check --deploy`` only), and so do the broker and result backend connections
of the project's Celery app when the package uses Celery (W510, ``check --deploy``
only)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib.util import find_spec
from typing import Any

from django.conf import settings
from django.core import checks

from ..common.durations import parse_duration
from ..common.network import SERVER_IDLE_SETTING, postgres_options
from ..conf import SETTING_NAME, fw_settings


@checks.register(deploy=True)
def check_postgres_keepalives(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``check --deploy``: W501 for a PostgreSQL database whose ``OPTIONS`` leave libpq's
    keepalive timings or ``tcp_user_timeout`` unset (or turn keepalives off): a silent
    partition then blocks a query for the kernel's retransmission timeout (~15 min);
    or whose ``options`` do not set ``idle_in_transaction_session_timeout``: the
    server then keeps the locks of a transaction cut off mid-way for as long."""
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
        missing = {key: value for key, value in wanted.items() if _lacks(options, key)}
        if not missing:
            continue
        literal = ", ".join(f'"{key}": {json.dumps(value)}' for key, value in missing.items())
        messages.append(
            checks.Warning(
                f'DATABASES["{alias}"]["OPTIONS"] lacks {", ".join(missing)}: on a silent '
                "network partition (no reset: a link, a NAT entry or a load balancer's flow "
                "gone) a query waits for the kernel's TCP timeout, about 15 minutes, and a "
                "workflow runner or stream hangs that long instead of "
                f'{bound:g} s ({SETTING_NAME}["DEAD_CONNECTION_TIMEOUT"]).',
                hint=f'Add to DATABASES["{alias}"]["OPTIONS"]: {{{literal}}} (libpq '
                "parameters; tcp_user_timeout is in milliseconds and needs PostgreSQL 12+ "
                f"client libraries; add {SERVER_IDLE_SETTING} to options you already "
                "have).",
                id="flowwarden_django.W501",
            )
        )
    return messages


def _lacks(options: Mapping[str, Any], key: str) -> bool:
    """Whether *options* lack what :func:`postgres_options` sets for *key*: the key, a
    true ``keepalives``, ``idle_in_transaction_session_timeout`` in ``options``."""
    if key not in options:
        return True
    if key == "keepalives":
        return not options[key]
    if key == "options":
        return SERVER_IDLE_SETTING not in str(options[key])
    return False


@checks.register(deploy=True)
def check_celery_connections(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``check --deploy``: W510 when the package uses Celery (``WORKFLOW_EXECUTION``,
    ``CELERY_RUN_STREAMS`` or a stream with ``execution="celery"``) and the loaded
    Celery app leaves its broker heartbeat, or its Redis broker's or result backend's
    timeouts and keepalives, at Celery's defaults: a process that publishes or waits
    for a result then hangs on a silent partition for minutes. Workers set them at
    start (``integrations.celery.bootstep``); the other processes need the app's own."""
    if not isinstance(getattr(settings, SETTING_NAME, {}), Mapping) or not find_spec("celery"):
        return []
    try:
        bound = parse_duration(fw_settings.DEAD_CONNECTION_TIMEOUT)
    except (TypeError, ValueError):
        return []  # E010 says so
    if bound <= 0 or not _uses_celery():
        return []
    from celery import _state, current_app

    from ..integrations.celery.network import literal, missing_settings

    if not any(app.set_as_current for app in _state._get_active_apps()):
        return []  # W202 says so
    missing = missing_settings(current_app.conf, bound)
    if not missing:
        return []
    return [
        checks.Warning(
            f"The Celery app leaves {', '.join(missing)} at Celery's defaults: on a silent "
            "network partition from the broker or the result backend, a process that "
            "publishes a task or waits for its result hangs for minutes (AMQP: two missed "
            "120 s heartbeats; Redis: the kernel's TCP timeout, about 15 minutes) instead "
            f'of {bound:g} s ({SETTING_NAME}["DEAD_CONNECTION_TIMEOUT"]).',
            hint="Call flowwarden_django.integrations.celery.configure_network(app) where "
            "the app is built (after config_from_object), or set: "
            f"{literal(missing)} (broker_transport_options: merge these keys into yours).",
            id="flowwarden_django.W510",
        )
    ]


def _uses_celery() -> bool:
    """Whether workflow steps or stream events of this project go through Celery."""
    execution = str(fw_settings.WORKFLOW_EXECUTION)
    if execution == "celery" or execution.endswith(".CeleryExecutionProvider"):
        return True
    if fw_settings.CELERY_RUN_STREAMS:
        return True
    from ..streams.registry import stream_registry

    declared = stream_registry.declarations()
    return any(getattr(spec, "execution", "") == "celery" for spec in declared)
