"""One generation of a stream's consumer, once for both runtimes: poll, handle, idle.

``consume`` runs from the opened cursor's first event until a stop (or, with
``burst``, until the stream caught up). Each event is announced, handed to the
driver (``HandleEvent``: the handler, its retries, the anchor), timed and counted;
events are settled before the next poll, so when a poll comes back empty every event
up to the cursor's postBatchResumeToken is settled, and the idle heartbeat may
certify that token. An ``invalidate`` event ends the generation (``invalidated``):
it restarts from now, or stops the stream for good after a rename or under ``FAIL``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from django.utils import timezone

from .. import metrics
from ..announcer import announcer_for
from ..spec import LIFECYCLE_OPERATIONS, StreamSpec
from .driving import Decision
from .effects import (
    AwaitWindow,
    CancelAnchors,
    DrainWindow,
    FindCheckpoint,
    FlushAnchorIfDue,
    HandleEvent,
    Idle,
    InitialPosition,
    PollCursor,
    ResetAfterHistoryLost,
    Submit,
    WindowBusy,
)
from .heartbeat import Heartbeat
from .lifecycle import RestartNow, StreamInvalidatedError, started
from .resume import Opened

logger = logging.getLogger("flowwarden_django.streams")

#: Seconds an idle poll of a parallel stream waits for its window to make progress.
WINDOW_IDLE_WAIT = 0.05


def consume(consumer: Any, opened: Opened, heartbeat: Heartbeat, *, burst: bool) -> Decision[None]:
    """Handle the events of *opened* until *consumer* stops (or, with *burst*, until a
    poll finds nothing). *consumer* counts ``heartbeats`` and, on ``consumer.counts``
    (itself, or the object that holds its counters), ``events_handled``; it says
    whether it is ``stopping`` and raises ``LeaseLostError`` from ``check_lease()``."""
    started(consumer)
    spec: StreamSpec = consumer.spec
    name = spec.name
    by_age = bool(spec.checkpoint.save_interval_seconds)  # else no flush is ever due
    beating = bool(heartbeat.interval)
    parallel = spec.windowed
    announcer = announcer_for(name)
    # Where the consumer keeps its counters: plain attributes to add to once per event.
    counts = consumer.counts
    cause = None  # the lifecycle event an invalidate follows
    cursor, event = opened.cursor, opened.first_event
    # Effects without per-event arguments, made once: they are values.
    poll, flush_if_due = PollCursor(cursor), FlushAnchorIfDue()
    while not consumer.stopping:
        if event is None:
            event = yield poll
        if event is None:
            if not cursor.alive:
                raise ConnectionError("the change stream closed")
            if parallel and (yield WindowBusy()):
                # Events are still in flight: the heartbeat may not certify the cursor's
                # position yet, and a burst has not caught up.
                yield AwaitWindow(WINDOW_IDLE_WAIT)
                yield flush_if_due
                continue
            yield flush_if_due
            writes = heartbeat.writes
            yield from heartbeat.on_idle(cursor.resume_token)
            consumer.heartbeats += heartbeat.writes - writes
            yield Idle()
            if burst:
                break
            continue
        consumer.check_lease()
        operation = event.get("operationType", "")
        if operation in LIFECYCLE_OPERATIONS:
            if parallel:
                yield DrainWindow()  # handled alone, after everything before it
            if operation == "invalidate":
                yield CancelAnchors()
                yield from invalidated(spec, event, cause or "drop")
            cause = operation
        event_id = announcer.received(event, operation)
        if parallel and operation not in LIFECYCLE_OPERATIONS:
            # The window runs it, counts it and moves the anchor once it settles.
            yield Submit(event, operation, event_id)
            if beating:
                heartbeat.last_activity = heartbeat.monotonic()
            event = None
            if by_age:
                yield flush_if_due
            continue
        began = time.perf_counter()
        outcome = yield HandleEvent(event, operation, event_id)
        announcer.processed(began, outcome)
        if outcome is None:
            # Unsettled (a stop or a lost lease cut its retries short): nothing after it
            # may be handled in this generation.
            consumer.check_lease()
            if consumer.stopping:
                break
            raise ConnectionError("an event was left unsettled; resubscribing")
        counts.events_handled += 1  # counted(consumer), inlined: once per event
        counts.last_event_stamp = time.time()
        if beating:  # the idle heartbeat's clock (nothing else reads it)
            heartbeat.last_activity = heartbeat.monotonic()
        event = None
        if by_age:
            yield flush_if_due


def announce_processed(name: str, began: float, outcome: bool | None) -> None:
    """Send ``event_processed`` for an event whose handling began at *began*
    (``time.perf_counter()``) when someone listens."""
    announcer_for(name).processed(began, outcome)


def counted(consumer: Any) -> None:
    """Count one settled event on *consumer*."""
    consumer.events_handled += 1
    consumer.last_event_stamp = time.time()


def invalidated(spec: StreamSpec, event: Mapping[str, Any], cause: str) -> Decision[None]:
    """The change stream was invalidated after *cause* (``drop``, ``rename``...).

    A drop under any strategy but ``FAIL`` resets both anchors to the server's
    current position (guarded by the dead processed anchor) and restarts from now
    (``RestartNow``). A rename, ``FAIL`` or a failed repair leaves a durable marker
    (the unusable invalidate token as seen, processed cleared), so every later start
    reaches the history-lost strategy and fails loudly, and raises
    ``StreamInvalidatedError``. The driver has cancelled the anchor policy first: no
    anchor write may land between reading the dead anchor and the guarded reset.
    """
    name = spec.name
    metrics.emit(metrics.stream_invalidated, name, cause=cause)
    saved = yield FindCheckpoint()
    dead = saved.last_processed_token if saved else None
    if cause != "rename" and spec.checkpoint.on_history_lost != "FAIL":
        try:
            fresh = yield InitialPosition()
            yield ResetAfterHistoryLost(fresh, dead, timezone.now())
        except Exception:
            logger.exception("stream %r: repairing after invalidate failed", name)
        else:
            logger.warning("stream %r: collection %s; restarting from now", name, cause)
            raise RestartNow
    yield ResetAfterHistoryLost(event["_id"], dead, timezone.now())
    raise StreamInvalidatedError(
        f"stream {name!r}: the collection was {'renamed' if cause == 'rename' else 'dropped'}"
        " (invalidate); the stream stopped. Reset its checkpoint to start it again."
    )
