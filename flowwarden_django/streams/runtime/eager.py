"""Starting an ``async def`` handler at once, inside the step of the task that calls it.

The asyncio consumer's common event is a document handler that finishes without
suspending (it counts, it caches, it computes). Awaiting it from a coroutine made
for the event costs two coroutines per event; :func:`start` runs the handler's
coroutine to its first suspension with a plain ``send(None)`` instead. When the
handler finished, the consumer records the event without a coroutine of its own;
when it suspended, :class:`Started` is what the consumer awaits to finish it: it
passes each suspension up to the task and the task's answers (results, exceptions,
a cancellation) down to the handler, as ``await`` would have. The handler runs in
the same task and context either way.
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from types import CoroutineType
from typing import Any

#: :func:`start`'s answer for a handler that finished without suspending.
FINISHED: Any = object()


class Started:
    """A coroutine that ran to its first suspension (which yielded *first*): awaiting
    this finishes it and returns its result."""

    __slots__ = ("_coroutine", "_first")

    def __init__(self, coroutine: Coroutine[Any, Any, Any], first: Any) -> None:
        self._coroutine = coroutine
        self._first = first

    def __await__(self) -> Generator[Any, Any, Any]:
        coroutine, yielded = self._coroutine, self._first
        while True:
            try:
                sent = yield yielded
            except GeneratorExit:
                coroutine.close()
                raise
            except BaseException as exc:  # a cancellation, thrown in by the task
                try:
                    yielded = coroutine.throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    yielded = coroutine.send(sent)
                except StopIteration as done:
                    return done.value


def start(awaitable: Any) -> Any:
    """Run *awaitable* (what an ``async def`` handler returned) to its first suspension:
    :data:`FINISHED` when it returned meanwhile (its result is dropped, as a
    handler's is), else something to await to finish it. Its exception propagates."""
    if type(awaitable) is not CoroutineType:
        return awaitable  # another awaitable: awaited as it is
    try:
        first = awaitable.send(None)
    except StopIteration:
        return FINISHED
    return Started(awaitable, first)
