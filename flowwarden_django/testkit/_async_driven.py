"""Drive a store's async API from sync tests: what the async contract twins run.

``async_driven(store, operations)`` returns a stand-in for *store* whose sync
operations each call the store's ``a…`` variant, awaited on an event loop through
``asgiref.sync.async_to_sync``. The sync contract then runs unchanged against the
stand-in, so every one of its scenarios (errors, events, threads racing) checks the
async API. ``async_to_sync`` runs the coroutine on a fresh event loop and runs a
``thread_sensitive`` ``sync_to_async`` call back on the calling thread, so an ORM
store keeps the test's connection (and, in a non-transactional test, its atomic
block), and the race tests' threads still race.

Everything that is not a listed operation (listeners, capability flags, options,
``close``) is the store's own attribute.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from asgiref.sync import async_to_sync


def _awaited(variant: Callable[..., Any]) -> Callable[..., Any]:
    """A sync function that awaits ``variant(...)`` on an event loop."""
    if not inspect.iscoroutinefunction(variant):
        raise TypeError(f"{variant!r} is not a coroutine function (async def)")
    return async_to_sync(variant)


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
            call = _awaited(getattr(driven, self._operations[name]))
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
