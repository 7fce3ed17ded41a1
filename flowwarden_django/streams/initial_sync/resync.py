"""Resync on demand: copy a stream's collection again, then stream from a fresh position.

What an operator asks with ``manage.py flowwarden_streams resync STREAM`` or the
Streams console's Resync button, as a Debezium operator triggers an incremental
snapshot. :func:`request_resync` writes an initial-sync progress record in phase
``copying`` with the reason ``on demand`` (one conditional ``save_initial_sync``, so
two requests cannot both start one) and asks every process running the stream to
restart it. On its next start the stream finds the record and copies (see
``initial_sync``): it captures the change stream's current position, hands every
document to its snapshot handler, then streams after that position. If no process
runs the stream, the copy starts when one does.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.utils import timezone

from ...models import StreamControl
from ..checkpoint import NoopCheckpointStore, progress_batch
from ..registry import StreamRegistry, stream_registry
from ..spec import StreamSpec
from ..stores import checkpoint_stores
from .progress import COPYING, ON_DEMAND

logger = logging.getLogger("flowwarden_django.streams")


class ResyncError(ValueError):
    """A resync that cannot be asked for; the message says why and what to do."""


def resync_refusal(spec: StreamSpec) -> str | None:
    """Why *spec* cannot be resynced, or ``None`` when it can."""
    if spec.checkpoint.start_position == "LATEST":
        return (
            f"stream {spec.name!r} starts at LATEST and keeps no checkpoint, so it has "
            "nowhere to keep a copy's progress; declare it with @checkpoint()"
        )
    if spec.snapshot_handler() is None:
        return (
            f"stream {spec.name!r} has no handler for copied documents: give it "
            "on_snapshot(doc, ctx) (or on_insert / on_change)"
        )
    if isinstance(checkpoint_stores[spec.checkpoint_store], NoopCheckpointStore):
        return (
            f"stream {spec.name!r} uses the no-op checkpoint store {spec.checkpoint_store!r}, "
            "which keeps no progress; point it at a real checkpoint store"
        )
    return None


def request_resync(
    name: str,
    *,
    by: str = "",
    now: datetime | None = None,
    registry: StreamRegistry | None = None,
) -> None:
    """Ask for a re-copy of stream *name*'s collection (see the module docstring).

    Raises :class:`ResyncError` for an unknown stream, one that cannot copy, or one
    already copying (its copy goes on by itself).
    """
    specs = (registry or stream_registry).specs()
    if name not in specs:
        declared = ", ".join(sorted(specs)) or "none"
        raise ResyncError(f"no stream named {name!r}; declared: {declared}")
    spec = specs[name]
    refusal = resync_refusal(spec)
    if refusal is not None:
        raise ResyncError(refusal)
    now = now or timezone.now()
    store = checkpoint_stores[spec.checkpoint_store]
    saved = store.find(name)
    progress = saved.initial_sync if saved is not None else None
    if progress is not None and progress.get("phase") == COPYING:
        raise ResyncError(
            f"stream {name!r} is already copying ({progress.get('reason')}, "
            f"{progress.get('copied', 0)} documents so far); the copy continues by itself"
        )
    stored_batch = progress_batch(progress)
    request = {
        "phase": COPYING,
        "batch": 0 if stored_batch is None else stored_batch + 1,
        "last_id": None,
        "copied": 0,
        "estimated": None,
        "started_at": None,
        "updated_at": None,
        "finished_at": None,
        "reason": ON_DEMAND,
        "requested_by": by,
        "requested_at": now.isoformat(),
    }
    if not store.save_initial_sync(name, request, expected_batch=stored_batch):
        raise ResyncError(
            f"stream {name!r}: its initial-sync progress changed while asking; try again"
        )
    StreamControl.request(name, by=by, at=now, restart_requested_at=now)
    logger.warning("stream %r: resync requested%s", name, f" by {by}" if by else "")
