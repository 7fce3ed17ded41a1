"""Values a run publishes: ``ctx.set_event(key, value)`` in a step, read with
``Workflow.for_coordination(cid).get_event(key, timeout=None)`` (``aget_event`` from
async code), as DBOS's ``set_event``/``get_event`` or a Temporal query answer.

One ``WorkflowEvent`` row per run and key, written with one upsert (the latest value
wins: a retried step sets it again). ``get_event`` returns the value, waiting up to
*timeout* seconds for one to be set by polling every ``POLL_SECONDS``; ``None`` when
none was set by then (as DBOS does), or when ``None`` was set.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections
from django.utils import timezone

from ....common.app_models import models
from ....common.user_input import MAX_PAYLOAD_BYTES, check_user_json
from ...runs.records import RunRecords
from .mailbox import check_name

#: Seconds between two reads of ``get_event`` while it waits for a value.
POLL_SECONDS = 0.05
#: The longest pause between two reads (the interval doubles up to it).
MAX_POLL_SECONDS = 0.25


def set_event(coordination_id: str, key: str, value: Any, *, using: str | None = None) -> None:
    """Set run *coordination_id*'s event *key* to *value* (JSON of at most
    ``MAX_PAYLOAD_BYTES``; ``UserJSONError`` otherwise), in the caller's transaction
    when there is one."""
    key = check_name(key, "the event key")
    value = check_user_json(value, what="the event value", max_bytes=MAX_PAYLOAD_BYTES)
    db = RunRecords(using).db
    row = models.WorkflowEvent(
        coordination_id=coordination_id, key=key, value=value, updated_at=timezone.now()
    )
    # One statement: INSERT ... ON CONFLICT (coordination_id, key) DO UPDATE (MySQL
    # and MariaDB: ON DUPLICATE KEY UPDATE, which takes no conflict target).
    target = connections[db].features.supports_update_conflicts_with_target
    models.WorkflowEvent.objects.using(db).bulk_create(
        [row],
        update_conflicts=True,
        unique_fields=["coordination_id", "key"] if target else None,
        update_fields=["value", "updated_at"],
    )


def read_event(coordination_id: str, key: str, *, using: str | None = None) -> tuple[bool, Any]:
    """``(True, value)`` when run *coordination_id* set event *key*, else
    ``(False, None)``."""
    rows = models.WorkflowEvent.objects.using(RunRecords(using).db)
    found = rows.filter(coordination_id=coordination_id, key=key).values_list("value").first()
    return (False, None) if found is None else (True, found[0])


def _seconds(timeout: float | timedelta | None) -> float:
    if timeout is None:
        return 0.0
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise ValueError(f"timeout must be seconds >= 0 or a timedelta, not {timeout!r}")
    return float(seconds)


def get_event(
    coordination_id: str,
    key: str,
    timeout: float | timedelta | None = None,
    *,
    using: str | None = None,
) -> Any:
    """The value run *coordination_id* last set for *key*; when none is set yet, wait
    for one up to *timeout* (seconds or a ``timedelta``; ``None``: not at all), then
    ``None`` (see the module)."""
    key = check_name(key, "the event key")
    deadline = time.monotonic() + _seconds(timeout)
    pause = POLL_SECONDS
    while True:
        found, value = read_event(coordination_id, key, using=using)
        left = deadline - time.monotonic()
        if found or left <= 0:
            return value
        time.sleep(min(pause, left))
        pause = min(pause * 2, MAX_POLL_SECONDS)


async def aget_event(
    coordination_id: str,
    key: str,
    timeout: float | timedelta | None = None,
    *,
    using: str | None = None,
) -> Any:
    """``get_event`` from async code: each read in the thread-sensitive executor, the
    waits between them on the event loop (holding no thread)."""
    key = check_name(key, "the event key")
    deadline = time.monotonic() + _seconds(timeout)
    read = sync_to_async(read_event, thread_sensitive=True)
    pause = POLL_SECONDS
    while True:
        found, value = await read(coordination_id, key, using=using)
        left = deadline - time.monotonic()
        if found or left <= 0:
            return value
        await asyncio.sleep(min(pause, left))
        pause = min(pause * 2, MAX_POLL_SECONDS)
