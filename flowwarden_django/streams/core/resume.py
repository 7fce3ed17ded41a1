"""The resume cascade: where a stream's change stream opens, once for both runtimes.

``open_stream(spec)`` decides, from the saved checkpoint: the server's current
position (``LATEST``, or a first start, made durable first), the processed anchor,
else the seen anchor (a fallback the metrics report), else the stream's history-lost
strategy (``FAIL``, ``RESUME_FROM_NOW``, ``RESUME_FROM_OPLOG_START``, ``RESYNC``), with
an initial sync first when one is due. A position is only trusted once its first poll
answered: a history-lost error may come with the first ``getMore`` alone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.utils import timezone

from .. import metrics
from ..checkpoint import Checkpoint
from ..initial_sync.progress import COPYING, FIRST_START, HISTORY_LOST, ON_DEMAND
from ..source import is_history_lost
from ..spec import StreamSpec
from ..tokens import tokens_equal
from .driving import Decision
from .effects import (
    CloseCursor,
    CopyCollection,
    FindCheckpoint,
    InitialPosition,
    OldestOplogTime,
    OpenCursor,
    PollCursor,
    ResetAfterHistoryLost,
    SaveSeen,
)

logger = logging.getLogger("flowwarden_django.streams")

#: Copies in a row whose captured position left the oplog before the copy ended: then
#: RESYNC gives up (the next copy would most likely lose its position too).
MAX_COPIES_PER_OPEN = 3


class HistoryLostError(RuntimeError):
    """The stream's saved positions have left the oplog and its strategy is FAIL."""

    def __init__(self, stream: str, last_known: datetime | None) -> None:
        self.stream = stream
        self.last_known = last_known
        super().__init__(
            f"stream {stream!r}: its resume positions are no longer in the oplog "
            f"(last known position {last_known or 'unknown'}). Events after it may be lost. "
            "To restart from now: `manage.py flowwarden_checkpoints reset "
            f"{stream}`, or declare the stream with "
            '@checkpoint(on_history_lost="RESUME_FROM_NOW") or "RESUME_FROM_OPLOG_START".'
        )


class OplogTooShortError(HistoryLostError):
    """RESYNC cannot win: each copy outlasts the oplog window, so its captured position
    is gone before it ends."""

    def __init__(self, stream: str, copies: int) -> None:
        self.stream = stream
        self.last_known = None
        RuntimeError.__init__(
            self,
            f"stream {stream!r}: {copies} copies in a row outlasted the oplog window (the "
            "position captured before each copy had left the oplog when it ended), so "
            "RESYNC stops here. Enlarge the oplog (replSetResizeOplog, or "
            "oplogMinRetentionHours) so it holds more than one copy's time, or make the copy "
            "faster (a larger copy_batch_size, a quicker on_snapshot), then restart the "
            "stream: the next copy starts over.",
        )


class Opened:
    """Where the cascade opened the stream: the cursor, the event its first poll
    returned, the position the stream may certify as seen (``certified``), the
    processed anchor the server confirmed (``confirmed_processed``), and, after an
    oplog-start replay, the dead anchor the first certification replaces through the
    guarded reset (``recovery_expected``)."""

    def __init__(
        self,
        cursor: Any,
        *,
        first_event: Mapping[str, Any] | None = None,
        certified: Mapping[str, Any] | None = None,
        recovery_expected: tuple[Mapping[str, Any] | None] | None = None,
    ) -> None:
        self.cursor = cursor
        self.first_event = first_event
        self.certified = certified
        self.confirmed_processed: Mapping[str, Any] | None = None
        self.recovery_expected = recovery_expected


def open_arguments(effect: OpenCursor) -> dict[str, Any]:
    """The keyword arguments of ``ChangeSource.open`` for *effect* (the ones it sets)."""
    arguments: dict[str, Any] = {}
    if effect.resume_after is not None:
        arguments["resume_after"] = effect.resume_after
    if effect.start_at_operation_time is not None:
        arguments["start_at_operation_time"] = effect.start_at_operation_time
    return arguments


def copy_reason(spec: StreamSpec, saved: Checkpoint | None) -> str | None:
    """Why the stream copies its collection before streaming, or ``None``: a copy in
    progress continues; a ``COPY_EXISTING`` stream without any anchor copies (its
    first start)."""
    policy = spec.checkpoint
    progress = saved.initial_sync if saved is not None else None
    if progress is not None and progress.get("phase") == COPYING:
        reason = str(progress.get("reason") or FIRST_START)
        if policy.copies or reason == ON_DEMAND:
            return reason
        logger.warning(
            "stream %r: an initial sync is in progress but the stream no longer declares "
            "COPY_EXISTING or RESYNC; it is left unfinished",
            spec.name,
        )
        return None
    if policy.start_position != "COPY_EXISTING":
        return None
    if saved is None or (saved.last_processed_token is None and saved.last_seen_token is None):
        return FIRST_START
    return None


def open_stream(spec: StreamSpec) -> Decision[Opened]:
    """The resume cascade (see the module)."""
    name = spec.name
    if spec.checkpoint.start_position == "LATEST":
        return Opened((yield OpenCursor()))
    saved = yield FindCheckpoint()
    reason = copy_reason(spec, saved)
    if reason is not None:
        return (yield from copy_then_open(spec, saved, reason))
    if saved is None or (saved.last_processed_token is None and saved.last_seen_token is None):
        position = yield InitialPosition()
        # A start precondition: without a durable position a crash before the first
        # saved event would lose everything since now.
        yield SaveSeen(position, timezone.now())
        return Opened((yield OpenCursor(resume_after=position)), certified=position)
    processed, seen = saved.last_processed_token, saved.last_seen_token
    if processed is not None:
        opened = yield from try_open(processed)
        if opened is not None:
            opened.confirmed_processed = processed
            return opened
    if seen is not None and not tokens_equal(seen, processed):
        opened = yield from try_open(seen)
        if opened is not None:
            if processed is not None:
                metrics.emit(metrics.resume_fallback_to_seen, name)
                logger.warning(
                    "stream %r: the processed anchor aged out of the oplog; resuming from "
                    "the last certified position (events in between were handled)",
                    name,
                )
            opened.certified = seen
            return opened
    return (yield from history_lost(spec, saved))


def try_open(token: Mapping[str, Any]) -> Decision[Opened | None]:
    """Open after *token*; ``None`` if the server no longer has it."""
    try:
        cursor = yield OpenCursor(resume_after=token)
    except Exception as exc:
        if is_history_lost(exc):
            return None
        raise
    try:
        first = yield PollCursor(cursor)
    except Exception as exc:
        yield CloseCursor(cursor)
        if is_history_lost(exc):
            return None
        raise
    return Opened(cursor, first_event=first)


def copy_then_open(
    spec: StreamSpec, saved: Checkpoint | None, reason: str, *, copies: int = 1
) -> Decision[Opened]:
    """Run (or finish) an initial sync, then open after the position it captured; if
    that position has left the oplog meanwhile, the history-lost strategy applies
    (*copies*: the copies this open has made, to stop a RESYNC that cannot win)."""
    position = yield CopyCollection(saved, reason)
    opened = yield from try_open(position)
    if opened is None:
        saved = (yield FindCheckpoint()) or Checkpoint(spec.name)
        return (yield from history_lost(spec, saved, copies=copies))
    opened.certified = position
    return opened


def history_lost(spec: StreamSpec, saved: Checkpoint, *, copies: int = 0) -> Decision[Opened]:
    """The stream's ``on_history_lost`` strategy, once its saved positions are gone."""
    name, strategy = spec.name, spec.checkpoint.on_history_lost
    metrics.emit(metrics.resume_history_lost, name)
    if strategy == "FAIL":
        known = [
            t
            for t in (saved.last_processed_at, saved.last_seen_at, saved.last_heartbeat_at)
            if t is not None
        ]
        raise HistoryLostError(name, max(known) if known else None)
    if strategy == "RESYNC":
        if copies >= MAX_COPIES_PER_OPEN:
            raise OplogTooShortError(name, copies)
        logger.warning("stream %r: history lost; copying the collection again (RESYNC)", name)
        return (yield from copy_then_open(spec, saved, HISTORY_LOST, copies=copies + 1))
    if strategy == "RESUME_FROM_OPLOG_START":
        oldest = yield OldestOplogTime()
        if oldest is not None:
            logger.warning("stream %r: history lost; replaying from the oplog start", name)
            # The dead anchors stay as the "recovery due" marker until the first
            # certified position replaces them through the guarded reset.
            return Opened(
                (yield OpenCursor(start_at_operation_time=oldest)),
                recovery_expected=(saved.last_processed_token,),
            )
    logger.warning("stream %r: history lost; resuming from now", name)
    position = yield InitialPosition()
    yield ResetAfterHistoryLost(position, saved.last_processed_token, timezone.now())
    return Opened((yield OpenCursor(resume_after=position)), certified=position)
