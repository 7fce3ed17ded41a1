"""The I/O a core decision asks its driver for: one small value per kind of request.

A driver performs an effect and sends back its result (or throws its exception into
the decision). The names say what the consumer's source or checkpoint store is asked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any


class Effect:
    """One request of the core to its driver."""

    __slots__ = ()


@dataclasses.dataclass(frozen=True, slots=True)
class FindCheckpoint(Effect):
    """The stream's saved ``Checkpoint`` (or ``None``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class OpenCursor(Effect):
    """A new change-stream cursor: at the server's current position (no argument),
    after *resume_after*, or at *start_at_operation_time*."""

    resume_after: Mapping[str, Any] | None = None
    start_at_operation_time: Any = None


@dataclasses.dataclass(frozen=True, slots=True)
class PollCursor(Effect):
    """The cursor's next event, or ``None`` when it has none yet."""

    cursor: Any


def poll_cursor(effect: PollCursor) -> Any:
    """Perform ``PollCursor``, as every driver does: the cursor's ``try_next()`` (a
    coroutine for an async cursor)."""
    return effect.cursor.try_next()


@dataclasses.dataclass(frozen=True, slots=True)
class CloseCursor(Effect):
    """Close the cursor."""

    cursor: Any


@dataclasses.dataclass(frozen=True, slots=True)
class InitialPosition(Effect):
    """The server's current position, as a resume token."""


@dataclasses.dataclass(frozen=True, slots=True)
class OldestOplogTime(Effect):
    """The time of the oldest oplog entry (``None`` when the server cannot say)."""


@dataclasses.dataclass(frozen=True, slots=True)
class CopyCollection(Effect):
    """Run (or finish) an initial sync for *reason*; its result is the position the
    copy captured before it started."""

    saved: Any
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class SaveSeen(Effect):
    """Write the seen anchor (and the heartbeat, at the same time)."""

    position: Mapping[str, Any]
    at: datetime


@dataclasses.dataclass(frozen=True, slots=True)
class SaveHeartbeat(Effect):
    """Write the heartbeat alone."""

    at: datetime


@dataclasses.dataclass(frozen=True, slots=True)
class ResetAfterHistoryLost(Effect):
    """The guarded reset: both anchors to *position*, only while the processed
    anchor is still *expected*."""

    position: Mapping[str, Any]
    expected: Mapping[str, Any] | None
    at: datetime


@dataclasses.dataclass(frozen=True, slots=True)
class DiscardUnusableConnections(Effect):
    """Drop the database connections a failure left broken, before the next try."""


@dataclasses.dataclass(frozen=True, slots=True)
class TryOnce(Effect):
    """One attempt at the event: the filter, the handler and (in a transactional
    stream, in the handler's transaction) the anchor; the handler's exception, or
    ``None`` once the event is settled."""

    handler: Any
    ctx: Any
    lifecycle: bool


@dataclasses.dataclass(frozen=True, slots=True)
class CallErrorHandler(Effect):
    """Call the stream's ``on_error`` handler; its answer (``None`` or an action)."""

    handler: Any
    error: Exception
    ctx: Any


@dataclasses.dataclass(frozen=True, slots=True)
class Backoff(Effect):
    """Wait *seconds* before the next attempt; True when a stop (or a lost lease) cut
    the wait short."""

    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class ParkFailedEvent(Effect):
    """Park the event for good and settle it (``events.dead_letter``, which a
    transactional stream's driver runs in one transaction)."""

    error: Exception
    ctx: Any
    lifecycle: bool


@dataclasses.dataclass(frozen=True, slots=True)
class SaveDeadLetter(Effect):
    """Write *entry* to the stream's dead-letter store."""

    entry: Any
    policy: Any


@dataclasses.dataclass(frozen=True, slots=True)
class Settle(Effect):
    """Advance the processed anchor over the event (its policy decides when to write)."""

    ctx: Any
    lifecycle: bool


# -- a consumer's life and one generation (``lifecycle``, ``generation``) ------------


@dataclasses.dataclass(frozen=True, slots=True)
class RunGeneration(Effect):
    """Open the change stream and consume it until a stop (or, with *burst*, until it
    caught up); its exception ends the generation."""

    burst: bool


@dataclasses.dataclass(frozen=True, slots=True)
class PauseBeforeRestart(Effect):
    """Wait *seconds* before the next generation; True when a stop cut the wait short."""

    seconds: float


# Made for every event: not frozen, whose __init__ costs twice as much (treat it as
# immutable all the same).
@dataclasses.dataclass(slots=True)
class HandleEvent(Effect):
    """Handle one change event: the handler, its retries, the anchor. True once
    handled, False once skipped or parked, ``None`` when a stop left it unsettled."""

    event: Mapping[str, Any]
    operation: str
    event_id: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class FlushAnchorIfDue(Effect):
    """Write the processed anchor if it has been dirty for ``save_interval_seconds``."""


@dataclasses.dataclass(frozen=True, slots=True)
class CancelAnchors(Effect):
    """Refuse every later processed-anchor write of this generation (its anchors are
    about to be replaced)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Idle(Effect):
    """The stream found nothing to handle: the driver looks after its database
    connections now and then and lets other streams run."""


# -- a stream handled in parallel (``window``) ----------------------------------------


# Made for every event: not frozen, whose __init__ costs twice as much (treat it as
# immutable all the same).
@dataclasses.dataclass(slots=True)
class Submit(Effect):
    """Hand one change event to the stream's window (``parallelism`` > 1): it runs
    when its key is free and a slot is. Waits while the window is full; raises the
    error of an event that failed for good (the window then drains)."""

    event: Mapping[str, Any]
    operation: str
    event_id: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class WindowBusy(Effect):
    """Whether the window holds an event the watermark has not passed; raises the
    error of an event that failed for good."""


@dataclasses.dataclass(frozen=True, slots=True)
class AwaitWindow(Effect):
    """Wait up to *seconds* for an event of the window to settle."""

    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class DrainWindow(Effect):
    """Wait until every event of the window is settled and its anchor recorded (a
    lifecycle event is handled alone, after everything before it)."""
