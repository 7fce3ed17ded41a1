"""Celery tasks: thin wrappers of the dead-letter operations of ``streams/operations/replay.py``,
and the workflow step and recovery tasks of ``provider.py``.

Found by ``app.autodiscover_tasks()`` (or registered by
``flowwarden_django.integrations.celery.install(app)``). Each returns plain JSON-serializable
data, so any result backend can keep it. ``purge_dead_letters`` and
``recover_workflows`` are meant for beat, and ``start_scheduled_workflow`` starts a
workflow from a django-celery-beat periodic task (``schedules``)::

    CELERY_BEAT_SCHEDULE = {
        "flowwarden-purge-dead-letters": {
            "task": "flowwarden_django.purge_dead_letters",
            "schedule": 3600.0,
        },
        "flowwarden-recover-workflows": {
            "task": "flowwarden_django.recover_workflows",
            "schedule": 60.0,
        },
    }

"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import shared_task
from celery.signals import before_task_publish

# The tasks import ``streams.replay`` and ``provider`` when they run:
# ``install(app)`` imports this module from the Celery app module, before Django is set up.


def _outcomes(outcomes: list[Any]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(outcome) for outcome in outcomes]


@shared_task(name="flowwarden_django.replay_dead_letters")
def replay_dead_letters(ids: list[str], store: str = "default", by: str = "") -> list[dict]:
    """Replay the dead letters *ids* of DLQ store *store*, in order; one outcome each."""
    from ...streams.operations import replay

    return _outcomes(replay.replay_dead_letters(ids, store=store, by=by))


@shared_task(name="flowwarden_django.replay_stream")
def replay_stream(
    stream: str, store: str = "default", by: str = "", limit: int | None = None
) -> list[dict]:
    """Replay the pending dead letters of *stream*, oldest first; one outcome each."""
    from ...streams.operations import replay

    return _outcomes(replay.replay_stream(stream, store=store, by=by, limit=limit))


@shared_task(name="flowwarden_django.purge_dead_letters")
def purge_dead_letters() -> dict[str, int]:
    """Delete the expired dead letters of every DLQ store; the count per store alias."""
    from ...streams.operations import replay

    return replay.purge_expired_dead_letters()


@shared_task(
    name="flowwarden_django.run_workflow_step",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    max_retries=None,  # run_step bounds its own retries
)
def run_workflow_step(
    self: Any,
    coordination_id: str,
    workflow: str | None = None,
    head: str | None = None,
    origin: str = "run",
    input: Any = None,
    version: int | None = None,
    handbacks: int = 0,
) -> dict[str, Any]:
    """Execute the next step of one workflow run and queue the step after it on
    commit; queued by ``CeleryExecutionProvider`` (see ``provider``)."""
    from .provider import run_step

    return run_step(
        self,
        coordination_id,
        workflow=workflow,
        head=head,
        origin=origin,
        input=input,
        version=version,
        handbacks=handbacks,
    )


@shared_task(name="flowwarden_django.recover_workflows", bind=True)
def recover_workflows(
    self: Any, older_than: float | None = None, limit: int | None = 100
) -> list[str]:
    """Queue the next step of every stalled running workflow run (unclaimed, or its
    claim expired, and unchanged for *older_than* seconds, by default
    ``WORKFLOW_RUN_LEASE``); the coordination ids queued."""
    from .provider import recover_workflows as sweep

    age = None if older_than is None else timedelta(seconds=older_than)
    return sweep(self.app, older_than=age, limit=limit)


@shared_task(name="flowwarden_django.start_scheduled_workflow", bind=True)
def start_scheduled_workflow(
    self: Any, workflow: str, state: Any = None, schedule: str | None = None
) -> dict[str, Any]:
    """Start *workflow* (its state a template) for the current tick of the schedule
    that sent this (an entry of Celery's ``beat_schedule`` or a django-celery-beat
    periodic task), at most once per tick (see ``schedules``). *schedule* names it when
    the message does not (both send its name in the ``periodic_task_name`` header)."""
    from datetime import datetime

    from .schedules import ScheduleError, start_scheduled

    name = getattr(self.request, "periodic_task_name", None) or schedule
    if not name:
        raise ScheduleError(
            "no schedule named: send this task from Celery beat (a beat_schedule_entry) "
            "or django-celery-beat, or pass schedule=<the schedule's name>"
        )
    stamp = getattr(self.request, SENT_AT_HEADER, None)
    sent_at = datetime.fromisoformat(stamp) if isinstance(stamp, str) else None
    return start_scheduled(name, workflow, state, sent_at=sent_at, app=self.app)


#: Stamped on every start task when it is published (by beat): its tick is the one
#: it was sent in (see ``schedules``).
SENT_AT_HEADER = "flowwarden_sent_at"


@before_task_publish.connect(weak=False, dispatch_uid="flowwarden_django.scheduled_start_sent")
def stamp_scheduled_start(
    sender: Any = None, headers: dict[str, Any] | None = None, **kwargs: Any
) -> None:
    """Stamp a start task with the time it is sent (kept by a redelivery)."""
    if sender == "flowwarden_django.start_scheduled_workflow" and headers is not None:
        headers.setdefault(SENT_AT_HEADER, datetime.now(UTC).isoformat())


@shared_task(name="flowwarden_django.expire_approvals")
def expire_approvals(limit: int = 500) -> dict[str, list[str]]:
    """The approval sweep (beat it every minute or so): expire due approvals (their
    runs resume with an ``expired`` decision or fail, per the step), cancel those
    whose run moved on, restore missing ones. What it did, by kind."""
    from ...workflows.waiting.approvals import sweep_approvals

    return sweep_approvals(limit=limit).as_dict()


@shared_task(
    name="flowwarden_django.handle_stream_event",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
)
def handle_stream_event(self: Any, stream: str, event: str, event_id: str | None = None) -> str:
    """Handle one change event of *stream* (BSON, base64) sent by its consumer
    (``execution="celery"``): ``"handled"`` or ``"skipped"`` once settled.

    A redelivered message whose first run had already answered (a pool child killed
    between storing its result and the acknowledgement) answers the same again
    without running: the consumer may already have sent the key's next event.
    """
    from ...streams.runtime.remote_runner import handle_remote_event
    from .stream_events import FAILING

    if (self.request.delivery_info or {}).get("redelivered"):
        earlier = self.app.backend.get_task_meta(self.request.id)
        if earlier.get("status") == "SUCCESS":
            return earlier["result"]
    # An attempt that fails says so on the result backend: the reader parks the key.
    return handle_remote_event(
        stream, event, event_id, on_failing=lambda: self.update_state(state=FAILING)
    )
