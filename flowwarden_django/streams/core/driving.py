"""Running a core decision: the drivers' side of ``effects``.

``drive`` performs each effect with a plain call (the threaded runtime), ``adrive``
awaits it (the asyncio runtime). Both send the result back into the decision, or
throw the effect's exception into it, until the decision returns.

``PollCursor`` comes once per event and means the same to every driver (the cursor's
``try_next()``): with ``polls=True`` (the runtimes' consuming loops) the driver polls
the cursor itself, without a call to *perform*; a test's script sees every effect.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

from .effects import Effect, PollCursor

T = TypeVar("T")

#: A core decision: yields effects, receives their results, returns its outcome.
Decision = Generator[Effect, Any, T]


def drive(decision: Decision[T], perform: Callable[[Effect], Any], *, polls: bool = False) -> T:
    """Run *decision* to its end, performing each effect with ``perform(effect)``
    (``PollCursor`` itself with *polls*)."""
    try:
        effect = next(decision)
        while True:
            try:
                if polls and type(effect) is PollCursor:
                    result = effect.cursor.try_next()
                else:
                    result = perform(effect)
            except Exception as exc:
                effect = decision.throw(exc)
            else:
                effect = decision.send(result)
    except StopIteration as done:
        return done.value


async def adrive(
    decision: Decision[T], perform: Callable[[Effect], Awaitable[Any]], *, polls: bool = False
) -> T:
    """``drive`` for async drivers: each effect is ``await perform(effect)``."""
    try:
        effect = next(decision)
        while True:
            try:
                if polls and type(effect) is PollCursor:
                    result = await effect.cursor.try_next()
                else:
                    result = await perform(effect)
            except Exception as exc:
                effect = decision.throw(exc)
            else:
                effect = decision.send(result)
    except StopIteration as done:
        return done.value
