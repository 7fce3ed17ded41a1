"""Rows of queue state written straight to the tables: runs waiting for a slot and
slots held, for the tests of what operators see of the queues (the command, the
admin, the metrics, the health report)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from flowwarden_django.models import WorkflowQueueSlot, WorkflowRun


def waiting_run(
    cid: str,
    queue: str,
    *,
    waited: float = 1.0,
    partition: str = "",
    priority: int = 0,
    workflow: str = "queued-ops",
    using: str = "default",
) -> WorkflowRun:
    """A run in ``waiting_slot`` on *queue* since *waited* seconds ago."""
    now = timezone.now()
    return WorkflowRun.objects.using(using).create(
        coordination_id=cid,
        workflow_name=workflow,
        status=WorkflowRun.Status.WAITING_SLOT,
        last_step="one",
        queue=queue,
        queue_partition=partition,
        queue_priority=priority,
        queued_at=now - timedelta(seconds=waited),
        created_at=now - timedelta(seconds=waited),
        updated_at=now - timedelta(seconds=waited),
    )


def held_slot(
    queue: str,
    number: int,
    *,
    kind: str = "concurrency",
    partition: str = "",
    for_seconds: float = 60.0,
    holder: str = "someone",
    using: str = "default",
) -> Any:
    """Slot *number* of *queue*, held for *for_seconds* more (negative: its lease ran
    out that long ago, so it is free)."""
    prefix = "run:" if kind == "concurrency" else "used:"
    return WorkflowQueueSlot.objects.using(using).create(
        queue=queue,
        partition=partition,
        kind=kind,
        number=number,
        holder=holder,
        token=f"{prefix}{queue}-{partition}-{kind}-{number}",
        held_until=timezone.now() + timedelta(seconds=for_seconds),
    )
