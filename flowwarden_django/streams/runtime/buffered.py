"""Taking the events a pymongo change stream already holds, without ``try_next()``.

``await stream.try_next()`` on pymongo's ``AsyncChangeStream`` costs three coroutines
(its timeout wrapper, ``try_next``, the cursor's ``_try_next``) per event, even when the
event is in the batch the last ``getMore`` brought: the async consumer's reading cost
half as much again as the sync one's. The sync ``ChangeStream`` (generated from the
async one, with the same bookkeeping) makes the same nested calls, without the
coroutines, for each event. pymongo has no public way to
take the rest of a batch, so :func:`buffered_poll` reads its private buffer, only when
the stream has the exact shape this module was written against (pymongo 4.x, checked
up to 4.20), and only for an event already buffered: every poll that needs the server
(an empty buffer, a closed or killed cursor, a resume, custom decoding) goes through
the public ``try_next()``, unchanged. Both consumers poll through it.

What ``try_next()`` does with a buffered event, and :func:`take` does the same: pop it,
mark the stream closed if its cursor is now dead (an ``invalidate``), and make the
stream's ``resume_token`` the event's ``_id``, or the batch's postBatchResumeToken when
the event was the batch's last one; then resume with ``resumeAfter`` and forget
``startAtOperationTime``. The anchor the consumer records stays each event's own
``_id`` (``core.anchors``): only ``resume_token``, which the idle heartbeat reads after
an empty poll, depends on the stream's bookkeeping, and that is pymongo's own rule.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from ..core.effects import PollCursor, poll_cursor

#: What a change stream must hold for :func:`take` to read it (pymongo's private names).
_STREAM_FIELDS = (
    "_cursor",
    "_closed",
    "_decode_custom",
    "_resume_token",
    "_start_at_operation_time",
    "_uses_start_after",
    "_uses_resume_after",
)
#: ... and its command cursor.
_CURSOR_FIELDS = ("_data", "_killed", "_postbatchresumetoken")


def _change_stream_types() -> tuple[type, ...]:
    """pymongo's ``AsyncChangeStream`` and ``ChangeStream`` (the sync one is generated
    from the async one: the same bookkeeping), those this pymongo has."""
    found: list[type] = []
    try:
        from pymongo.asynchronous.change_stream import AsyncChangeStream

        found.append(AsyncChangeStream)
    except ImportError:
        pass
    try:
        from pymongo.synchronous.change_stream import ChangeStream

        found.append(ChangeStream)
    except ImportError:
        pass
    return tuple(found)


def readable(stream: Any) -> bool:
    """Whether :func:`take` may read *stream*'s buffer: a pymongo ``AsyncChangeStream``
    or ``ChangeStream`` whose ``try_next`` is pymongo's own, with the private fields it
    relies on."""
    base = next((kind for kind in _change_stream_types() if isinstance(stream, kind)), None)
    if base is None:
        return False
    if type(stream).try_next is not base.try_next:
        return False  # a subclass that changes try_next is read through it
    if not all(hasattr(stream, field) for field in _STREAM_FIELDS):
        return False
    cursor = stream._cursor
    return all(hasattr(cursor, field) for field in _CURSOR_FIELDS) and isinstance(
        cursor._data, deque
    )


#: :func:`take`'s answer when the stream has no buffered event it may hand out.
NOTHING_BUFFERED: Any = object()


def take(stream: Any) -> Any:
    """The next event *stream* (see :func:`readable`) holds, with ``try_next()``'s
    bookkeeping, or :data:`NOTHING_BUFFERED` when that needs the public ``try_next()``."""
    cursor = stream._cursor  # a new one after each resume
    data = cursor._data
    if not data or stream._closed or stream._decode_custom:
        return NOTHING_BUFFERED
    change = data[0]
    try:
        resume_token = change["_id"]
    except (KeyError, TypeError):
        return NOTHING_BUFFERED  # try_next() closes the stream and raises
    data.popleft()
    if not data:
        if cursor._killed:  # the cursor is dead now (an invalidate): as try_next()
            stream._closed = True
        if cursor._postbatchresumetoken:
            resume_token = cursor._postbatchresumetoken
    stream._uses_start_after = False
    stream._uses_resume_after = True
    stream._resume_token = resume_token
    stream._start_at_operation_time = None
    return change


def buffered_poll(stream: Any) -> Callable[[PollCursor], Any]:
    """How a consumer performs ``PollCursor`` on *stream*: a buffered event taken at
    once (for the async consumer: no coroutine) when :func:`readable`, else
    ``try_next()`` (``poll_cursor``: a coroutine to await on an async stream)."""
    if not readable(stream):
        return poll_cursor

    def poll(effect: PollCursor) -> Any:
        cursor = effect.cursor
        if cursor is stream:
            change = take(cursor)
            if change is not NOTHING_BUFFERED:
                return change
        return cursor.try_next()

    return poll
