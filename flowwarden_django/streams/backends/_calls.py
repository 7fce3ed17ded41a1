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

from .._twins import native_pair
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

    The native base of an SPI (``NativeOperations`` among its direct bases) gets both
    public methods of each of the SPI's operations (its ``_thread_twinned``) from
    :func:`~.._twins.native_pair`: ``<name>`` and ``a<name>`` run the store operation
    ``_<name>_operation``. ``_run`` runs an operation on the sync client, making each
    request with ``_perform``; ``_arun`` on the running loop's async client, with what
    ``_async_performer`` gives, or, when the backend has none (``None``), closes the
    operation and awaits ``default(*args, **kwargs)`` (the bound ``super()`` method:
    the thread-based default). The backend's connection class supplies the two makers.
    """

    #: The async API runs natively, or on the default executor, in parallel: these
    #: stores never touch the Django database.
    async_thread_sensitive = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if NativeOperations in cls.__bases__:
            for name in getattr(cls, "_thread_twinned", ()):
                native_pair(cls, name, f"_{name}_operation")

    def _perform(self, request: Any) -> Any:
        """Make one request of an operation on the sync client."""
        raise NotImplementedError

    async def _async_performer(self) -> Callable[[Any], Awaitable[Any]] | None:
        """What makes a request on the running loop's async client, or ``None``."""
        raise NotImplementedError

    def _run(self, operation: Operation[T]) -> T:
        """Run a store operation on the sync client."""
        return run(operation, self._perform)

    async def _arun(
        self,
        operation: Operation[T],
        default: Callable[..., Awaitable[T]],
        /,
        *args: Any,
        **kwargs: Any,
    ) -> T:
        """Run a store operation on the async client; without one, close it and await
        ``default(*args, **kwargs)``."""
        perform = await self._async_performer()
        if perform is None:
            operation.close()
            return await default(*args, **kwargs)
        return await arun(operation, perform)


def run(operation: Operation[T], perform: Callable[[Any], Any]) -> T:
    """Run *operation* to its end, each request performed by ``perform(request)``."""
    return drive(operation, perform)


async def arun(operation: Operation[T], perform: Callable[[Any], Awaitable[Any]]) -> T:
    """:func:`run` with each request awaited: ``await perform(request)``."""
    return await adrive(operation, perform)
