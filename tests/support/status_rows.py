"""Rows the status tests store by hand: what processes, checkpoints and DLQs would say."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from flowwarden_django.models import DeadLetter, StreamControl, StreamWorker
from flowwarden_django.streams import Checkpoint
from flowwarden_django.streams.backends.orm import OrmCheckpointStore

#: The fixed "now" of the status tests.
NOW = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)

PROCESSED = {"_data": "8263A1B2C3000000012B022C0100296E5A1004" + "AB" * 20 + "04"}
SEEN = {"_data": "8263A1B2C4000000022B022C0100296E5A1004" + "CD" * 20 + "04"}

_ids = itertools.count(1)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def worker(
    stream: str,
    instance: str,
    state: str,
    *,
    role: str = "",
    updated: float = 1,
    last_event: float | None = None,
    **counters: object,
) -> StreamWorker:
    """A ``StreamWorker`` row last refreshed *updated* seconds before ``NOW``."""
    return StreamWorker.objects.create(
        stream_name=stream,
        instance_id=instance,
        state=state,
        role=role,
        started_at=ago(3600),
        last_event_at=None if last_event is None else ago(last_event),
        updated_at=ago(updated),
        **counters,
    )


def control(stream: str, *, paused: bool = False) -> StreamControl:
    return StreamControl.objects.create(
        stream_name=stream, paused=paused, updated_by="ops", updated_at=ago(60)
    )


def checkpoint(
    stream: str,
    *,
    processed: float | None = None,
    seen: float | None = None,
    heartbeat: float | None = None,
) -> None:
    """Save a checkpoint in the ORM store with anchors *processed*/*seen* seconds old."""
    OrmCheckpointStore().save(
        Checkpoint(
            stream_name=stream,
            instance_id="worker-a",
            last_processed_token=None if processed is None else PROCESSED,
            last_processed_at=None if processed is None else ago(processed),
            last_seen_token=None if seen is None else SEEN,
            last_seen_at=None if seen is None else ago(seen),
            last_heartbeat_at=None if heartbeat is None else ago(heartbeat),
        )
    )


def dead_letter(stream: str, status: str = DeadLetter.Status.PENDING) -> DeadLetter:
    """One ``DeadLetter`` row, stored directly."""
    return DeadLetter.objects.create(
        id=f"dl-{next(_ids)}",
        stream_name=stream,
        operation_type="insert",
        error_type="builtins.RuntimeError",
        error_message="boom",
        status=status,
        first_attempt_at=ago(120),
        last_attempt_at=ago(100),
        created_at=ago(100),
    )
