"""Running a core decision: the drivers' side of ``effects``.

``drive`` performs each effect with a plain call (the threaded runtime), ``adrive``
awaits it (the asyncio runtime). Both send the result back into the decision, or
throw the effect's exception into it, until the decision returns.

``PollCursor`` and ``HandleEvent`` come once per event: a runtime's consuming loop
passes ``fast``, a function for each of those effect types, which the driver calls
instead of the general *perform* (its dispatch costs more than the call); a test's
script sees every effect. For ``adrive`` a fast function returns either an awaitable
to await or, when it could do the work without suspending (an event pymongo
already fetched), the result itself: no coroutine is made.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping
from types import CoroutineType
from typing import Any, TypeVar

from .effects import Effect

T = TypeVar("T")

#: A core decision: yields effects, receives their results, returns its outcome.
Decision = Generator[Effect, Any, T]


#: Functions of the effects a driver performs most often, by effect type.
FastPaths = Mapping[type, Callable[[Any], Any]]

_NO_FAST_PATHS: FastPaths = {}


def drive(
    decision: Decision[T], perform: Callable[[Effect], Any], *, fast: FastPaths = _NO_FAST_PATHS
) -> T:
    """Run *decision* to its end, performing each effect with ``perform(effect)``, or
    with ``fast[type(effect)](effect)`` when *fast* has its type."""
    try:
        effect = next(decision)
        while True:
            try:
                direct = fast.get(type(effect))
                result = perform(effect) if direct is None else direct(effect)
            except Exception as exc:
                effect = decision.throw(exc)
            else:
                effect = decision.send(result)
    except StopIteration as done:
        return done.value


async def adrive(
    decision: Decision[T],
    perform: Callable[[Effect], Awaitable[Any]],
    *,
    fast: FastPaths = _NO_FAST_PATHS,
) -> T:
    """``drive`` for async drivers: each effect is ``await perform(effect)``, or its
    function in *fast*, whose result is awaited when it is awaitable."""
    try:
        effect = next(decision)
        while True:
            try:
                direct = fast.get(type(effect))
                if direct is None:
                    result = await perform(effect)
                else:
                    result = direct(effect)
                    if type(result) is CoroutineType or hasattr(result, "__await__"):
                        result = await result
            except Exception as exc:
                effect = decision.throw(exc)
            else:
                effect = decision.send(result)
    except StopIteration as done:
        return done.value
