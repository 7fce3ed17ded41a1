"""Each store operation written once, for both APIs: the backends' sans-I/O calls.

A backend operation is a generator that yields the client calls it needs (a
:class:`Call`, or a backend's own request such as a Redis pipeline) and receives
each call's result, or has its error thrown in, then returns the operation's
result. It does no I/O itself. The sync method runs it with :func:`run` on the
blocking client; its async twin with :func:`arun` on the running loop's native
async client, where every call is awaited. So the filters, updates, scripts and
the decisions between the calls (retry without upsert on a duplicate key, a
second write when a guard missed) exist once, and the two APIs cannot drift.

``run`` and ``arun`` are ``streams.core.driving``'s ``drive`` and ``adrive``: the
runtime's core decisions are driven the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

from ..core.driving import adrive, drive

T = TypeVar("T")

#: A store operation: yields client calls, receives their results, returns its own.
Operation = Generator[Any, Any, T]


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """``client.<method>(*args, **kwargs)`` on the sync client, awaited on the async one."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def on(self, target: Any) -> Any:
        """Make the call on *target* (a sync client: the result; an async one: the
        awaitable)."""
        return getattr(target, self.method)(*self.args, **self.kwargs)


def call(method: str, *args: Any, **kwargs: Any) -> Call:
    """A :class:`Call` of *method* with these arguments."""
    return Call(method, args, kwargs)


class NativeOperations:
    """What a store with native sync and async clients runs its operations with.

    ``_run`` runs an operation on the sync client; ``_arun`` on the running loop's
    async client, or, when the backend has none, closes the operation and awaits
    ``default(*args, **kwargs)`` (the bound ``super()`` method: the thread-based
    default). The backend's connection class implements both.
    """

    def _run(self, operation: Operation[T]) -> T:
        raise NotImplementedError

    async def _arun(
        self,
        operation: Operation[T],
        default: Callable[..., Awaitable[T]],
        /,
        *args: Any,
        **kwargs: Any,
    ) -> T:
        raise NotImplementedError


def run(operation: Operation[T], perform: Callable[[Any], Any]) -> T:
    """Run *operation* to its end, each request performed by ``perform(request)``."""
    return drive(operation, perform)


async def arun(operation: Operation[T], perform: Callable[[Any], Awaitable[Any]]) -> T:
    """:func:`run` with each request awaited: ``await perform(request)``."""
    return await adrive(operation, perform)
