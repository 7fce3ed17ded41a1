"""The workflow queues' part of ``/flowwarden/health/``: a queue whose oldest waiting
step has waited longer than ``FLOWWARDEN["WORKFLOW_QUEUE_STALE_AFTER"]`` is *stale*
(its slots are not freed, its rate is too low for its load, or it is no longer
configured).

A stale queue makes the report ``degraded``, not unhealthy: the status code stays
what the streams make it, so that a backlog behind a provider's rate limit never
takes a web process out of its load balancer. Callers without health details get
counts only (no queue names); the others get each queue's counts too.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import DatabaseError
from django.utils import timezone

from ...common.durations import parse_duration
from ...conf import DEFAULTS, fw_settings
from .stats import queue_stats, stale_queues


def stale_after() -> float:
    """``WORKFLOW_QUEUE_STALE_AFTER`` in seconds (its default when it is not a positive
    duration: ``manage.py check`` reports that, E010)."""
    for value in (fw_settings.WORKFLOW_QUEUE_STALE_AFTER, DEFAULTS["WORKFLOW_QUEUE_STALE_AFTER"]):
        try:
            seconds = parse_duration(value)
        except ValueError:
            continue
        if seconds > 0:
            return seconds
    return 300.0


def queue_health(*, details: bool, now: datetime | None = None) -> dict[str, Any] | None:
    """The ``"queues"`` entry of the health report, ``None`` when no queue is
    configured (nothing is read then)::

        {"stale_after_seconds": 300.0, "waiting": 12, "stale": 1,
         "oldest_wait_seconds": 420.0,
         # with details only:
         "by_queue": {"carrier-api": {"configured": true, "slots_in_use": 5,
                                      "waiting": 12, "oldest_wait_seconds": 420.0,
                                      "stale": true}}}

    A database that cannot be read gives ``{"error": ...}`` (without details, what
    failed and the exception's class only: a driver's message may name the host).
    """
    if not fw_settings.WORKFLOW_QUEUES:
        return None
    now = now or timezone.now()
    limit = stale_after()
    try:
        found = queue_stats()
    except Exception as exc:
        if details:
            return {"error": f"{type(exc).__name__}: {exc}"}
        what = "database unavailable" if isinstance(exc, DatabaseError) else "queues unavailable"
        return {"error": f"{what} ({type(exc).__name__})"}
    stale = {queue.name for queue in stale_queues(found, limit, now)}
    waits = [wait for q in found if (wait := q.oldest_wait_seconds(now)) is not None]
    report: dict[str, Any] = {
        "stale_after_seconds": limit,
        "waiting": sum(queue.waiting for queue in found),
        "stale": len(stale),
        "oldest_wait_seconds": max(waits, default=None),
    }
    if details:
        report["by_queue"] = {
            queue.name: {
                "configured": queue.configured,
                "slots_in_use": queue.slots_in_use,
                "waiting": queue.waiting,
                "oldest_wait_seconds": queue.oldest_wait_seconds(now),
                "stale": queue.name in stale,
            }
            for queue in found
        }
    return report
