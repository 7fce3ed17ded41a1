"""Which transactional stream's attempt this thread is in, for the code its handler calls.

A transactional stream runs each handler call and its processed-anchor write in one
transaction on its ``transaction_using`` database (``streams.runtime.threaded``, a
dead letter's replay, an initial sync's batch). Writes the handler makes on that
database commit with the anchor, or roll back with it: exactly once. A write on
another database commits on its own, and a crash between the two commits delivers
the event again. The stream's runtime marks its attempt with ``in_transactional_attempt``
so that code the handler calls (``Workflow.send``) can tell a write that is exactly
once from one that is not, without the workflow half importing the stream half.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_local = threading.local()


@dataclasses.dataclass(frozen=True)
class StreamAttempt:
    """A transactional stream's attempt at one event: the stream's name, and the
    database alias whose transaction commits its checkpoint."""

    stream: str
    using: str


@contextmanager
def in_transactional_attempt(stream: str, using: str) -> Iterator[StreamAttempt]:
    """Mark this thread as inside stream *stream*'s transactional attempt on *using*
    (enter it inside the attempt's ``transaction.atomic``, so that the callbacks run
    on commit are outside it)."""
    previous = getattr(_local, "attempt", None)
    attempt = _local.attempt = StreamAttempt(stream, using)
    try:
        yield attempt
    finally:
        _local.attempt = previous


def current_stream_attempt() -> StreamAttempt | None:
    """The transactional stream attempt this thread is in, or ``None``."""
    return getattr(_local, "attempt", None)
