"""Drive a store's async API from sync tests: what the async contract twins run.

``async_driven(store, operations)`` returns a stand-in for *store* whose sync
operations each call the store's ``a…`` variant, awaited on an event loop through
``asgiref.sync.async_to_sync``. The sync contract then runs unchanged against the
stand-in, so every one of its scenarios (errors, events, threads racing) checks the
async API. A store whose async API never hops to the calling thread
(``async_thread_sensitive = False``: the Redis and MongoDB backends, the in-memory
ones) is awaited on one event loop per calling thread, kept for the thread's life, so
its loop-bound client (a ``redis.asyncio`` or ``AsyncMongoClient``) is made once per
thread, not once a call. Any other store goes through ``async_to_sync``, which runs a
``thread_sensitive`` ``sync_to_async`` call back on the calling thread: an ORM store
keeps the test's connection (and, in a non-transactional test, its atomic block).
Either way the race tests' threads still race, each on its own loop.

Everything that is not a listed operation (listeners, capability flags, options,
``close``) is the store's own attribute.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from asgiref.sync import async_to_sync


class _KeptLoop:
    """One thread's event loop, closed when the thread's locals go (the thread ended)."""

    def __init__(self) -> None:
        self.runner = asyncio.Runner()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.runner.close()


class _ThreadLoops(threading.local):
    """The kept event loop of each calling thread, made on first use."""

    kept: _KeptLoop | None = None

    def run(self, awaitable: Any) -> Any:
        if self.kept is None:
            self.kept = _KeptLoop()
        return self.kept.runner.run(awaitable)


_thread_loop = _ThreadLoops()


def _awaited(variant: Callable[..., Any], *, thread_sensitive: bool = True) -> Callable[..., Any]:
    """A sync function that awaits ``variant(...)``: on the calling thread's kept loop
    when the store never needs that thread back (*thread_sensitive* false), else on a
    fresh loop through ``async_to_sync``."""
    if not inspect.iscoroutinefunction(variant):
        raise TypeError(f"{variant!r} is not a coroutine function (async def)")
    if thread_sensitive:
        return async_to_sync(variant)
    return lambda *args, **kwargs: _thread_loop.run(variant(*args, **kwargs))


class AsyncDriven:
    """A stand-in whose operations go through the wrapped object's async API."""

    #: Sync operation name -> the name of its async variant.
    _operations: Mapping[str, str] = {}
    #: Sync context-manager name -> the name of its async context manager.
    _context_managers: Mapping[str, str] = {}

    def __init__(self, driven: Any) -> None:
        self.driven = driven

    def __getattr__(self, name: str) -> Any:
        driven = self.__dict__.get("driven")
        if driven is None:
            raise AttributeError(name)
        if name in self._operations:
            sensitive = getattr(driven, "async_thread_sensitive", True)
            call = _awaited(getattr(driven, self._operations[name]), thread_sensitive=sensitive)
            return functools.wraps(getattr(driven, name))(call)
        if name in self._context_managers:
            return functools.partial(self._enter, getattr(driven, self._context_managers[name]))
        return getattr(driven, name)

    @staticmethod
    @contextlib.contextmanager
    def _enter(factory: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[Any]:
        """``with`` over the async context manager ``factory(*args, **kwargs)``."""
        manager = factory(*args, **kwargs)
        value = _awaited(manager.__aenter__)()
        try:
            yield value
        except BaseException as exc:
            if not _awaited(manager.__aexit__)(type(exc), exc, exc.__traceback__):
                raise
        else:
            _awaited(manager.__aexit__)(None, None, None)

    def __repr__(self) -> str:
        return f"<async-driven {self.driven!r}>"


def async_driven(
    driven: Any, operations: Iterable[str], context_managers: Iterable[str] = ()
) -> Any:
    """A stand-in for *driven*: each of *operations* (``"save"``…) calls ``a<name>``,
    each of *context_managers* (``"guard"``) enters ``a<name>`` with ``async with``.

    Its class is named after the store's and carries the store class's
    ``supports_*`` flags, so capability checks on ``type(store)`` still hold.
    """
    cls = type(driven)
    flags = {
        name: getattr(cls, name)
        for name in dir(cls)
        if name.startswith("supports_") and isinstance(getattr(cls, name), bool)
    }
    stand_in = type(
        f"AsyncDriven{cls.__name__}",
        (AsyncDriven,),
        {
            **flags,
            "_operations": {name: f"a{name}" for name in operations},
            "_context_managers": {name: f"a{name}" for name in context_managers},
        },
    )
    return stand_in(driven)
