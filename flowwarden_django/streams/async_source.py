"""Change streams through pymongo's ``AsyncMongoClient``: the async runtime's source.

``AsyncPymongoChangeSource`` mirrors :class:`~.source.PymongoChangeSource` (same
pipeline, ``fullDocument`` options, bootstrap command and cursor comments) with
``await collection.watch(...)``. Its cursors are pymongo's ``AsyncChangeStream``:
``alive``, ``resume_token``, ``await try_next()``, ``await close()``.

Clients come from ``FLOWWARDEN["MONGO_CLIENTS"]``, as the sync ``clients.py``
builds them, but an ``AsyncMongoClient`` belongs to one event loop: they are kept
per loop and alias (:data:`async_mongo_clients`) and closed with their loop. The
MongoDB backends' native async operations keep their clients the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

from ..exceptions import MissingExtraError
from .clients import client_settings, source_options
from .source import CollectionStreamSettings
from .spec import StreamSpec


class AsyncChangeCursor(Protocol):
    """An open async change stream (pymongo's ``AsyncChangeStream`` has this shape)."""

    @property
    def alive(self) -> bool: ...

    @property
    def resume_token(self) -> Mapping[str, Any] | None: ...

    async def try_next(self) -> Mapping[str, Any] | None: ...

    async def close(self) -> None: ...


class AsyncChangeSource(Protocol):
    """The async counterpart of :class:`~.source.ChangeSource` (an initial sync copies
    through the sync source: see :mod:`.runtime.event_loop`)."""

    async def open(
        self,
        *,
        resume_after: Mapping[str, Any] | None = None,
        start_after: Mapping[str, Any] | None = None,
        start_at_operation_time: Any = None,
    ) -> AsyncChangeCursor: ...

    async def initial_position(self) -> Mapping[str, Any]: ...

    async def oldest_oplog_time(self) -> Any: ...


async def close_at_loop_end(
    lock: Any, held_by_loop: Any, loop: Any, entry: Any, close: Callable[[], Awaitable[Any]]
) -> AsyncIterator[None]:
    """An async generator that, when *loop* finalizes its async generators or when it
    is dropped while the loop still runs, forgets ``held_by_loop[loop]`` (under *lock*)
    if that still holds *entry* first, then awaits ``close()``."""
    try:
        yield
    finally:
        with lock:
            held = held_by_loop.get(loop)
            if held is not None and held[0] is entry:
                del held_by_loop[loop]
        await close()


class AsyncMongoClientHandler:
    """One ``AsyncMongoClient`` per key (a configured alias) per running event loop.

    A loop's clients are closed by :meth:`aclose`, or when that loop shuts its async
    generators down (``asyncio.run`` and ``async_to_sync`` do, on exit); :meth:`reset`
    lets go of every loop's clients, each then closed on its loop if that still runs.
    The MongoDB backends keep a handler of their own, with clients made from their
    ``url`` (:meth:`get`).
    """

    def __init__(self) -> None:
        self._loops: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[dict[str, Any], AsyncIterator[None]]
        ] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __getitem__(self, alias: str) -> Any:
        return self.get(alias, functools.partial(self._create, alias))

    def get(self, key: str, create: Callable[[], Any]) -> Any:
        """The running loop's client *key*, made by ``create()`` on first use there."""
        loop = asyncio.get_running_loop()
        with self._lock:
            held = self._loops.get(loop)
            if held is None:
                clients: dict[str, Any] = {}
                held = self._loops[loop] = (clients, self._closer(loop, clients))
                _start(held[1])
        clients = held[0]
        client = clients.get(key)
        if client is None:
            client = clients[key] = create()
        return client

    def _create(self, alias: str) -> Any:
        url, options = client_settings(alias)
        return new_async_client(url, options, "Change streams")

    def _closer(self, loop: asyncio.AbstractEventLoop, clients: dict[str, Any]) -> Any:
        """Closes *clients* when *loop* finalizes its async generators, or when this
        generator is dropped (:meth:`reset`) while the loop still runs."""
        close = functools.partial(_close_all, clients)  # bound now: it may run at exit
        return close_at_loop_end(self._lock, self._loops, loop, clients, close)

    async def aclose(self) -> None:
        """Close the running loop's clients (the next use there makes new ones)."""
        with self._lock:
            clients, _closer = self._loops.pop(asyncio.get_running_loop(), ({}, None))
        await _close_all(clients)

    def reset(self) -> None:
        """Let go of every loop's clients: each is closed on its loop if that still runs."""
        with self._lock:
            self._loops.clear()


def _start(closer: AsyncIterator[None]) -> None:
    """Run *closer* to its ``yield`` without awaiting: creating its first step registers
    it with the running loop's async-generator hooks (so the loop finalizes it)."""
    step = closer.__anext__()
    with contextlib.suppress(StopIteration):
        step.send(None)  # type: ignore[attr-defined]


async def _close_all(clients: dict[str, Any]) -> None:
    """Close *clients*, emptied first: whoever calls first closes them, once."""
    owned = list(clients.values())
    clients.clear()
    for client in owned:
        await client.close()


def new_async_client(url: str, options: Mapping[str, Any], feature: str) -> Any:
    """A pymongo ``AsyncMongoClient`` to *url* with *options* (those of the sync one);
    *feature* names what needs it when pymongo is missing."""
    try:
        from pymongo import AsyncMongoClient
    except ImportError as exc:
        raise MissingExtraError("pymongo", "mongo", feature) from exc
    return AsyncMongoClient(url, **options)


async_mongo_clients = AsyncMongoClientHandler()


class AsyncPymongoChangeSource(CollectionStreamSettings):
    """Change streams on one collection through ``AsyncCollection.watch()``."""

    async def open(
        self,
        *,
        resume_after: Mapping[str, Any] | None = None,
        start_after: Mapping[str, Any] | None = None,
        start_at_operation_time: Any = None,
    ) -> AsyncChangeCursor:
        arguments = self.watch_arguments(resume_after, start_after, start_at_operation_time)
        return await self.collection.watch(self.pipeline, **arguments)

    async def initial_position(self) -> Mapping[str, Any]:
        command = self.bootstrap_command()
        reply = await self.database.command("aggregate", self.collection.name, **command)
        cursor_id = reply["cursor"].get("id")
        if cursor_id:
            await self.database.command("killCursors", self.collection.name, cursors=[cursor_id])
        return self.bootstrap_position(reply)

    async def oldest_oplog_time(self) -> Any:
        from pymongo.errors import PyMongoError

        try:
            first = await self.client.local["oplog.rs"].find_one({}, sort=[("$natural", 1)])
        except PyMongoError:
            return None
        return None if first is None else first.get("ts")


def async_pymongo_source(spec: StreamSpec) -> AsyncPymongoChangeSource:
    """The production async source of a stream (call it inside the running loop)."""
    return AsyncPymongoChangeSource(async_mongo_clients[spec.client], **source_options(spec))
