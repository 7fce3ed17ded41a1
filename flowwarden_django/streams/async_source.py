"""Change streams through pymongo's ``AsyncMongoClient``: the async runtime's source.

``AsyncPymongoChangeSource`` mirrors :class:`~.source.PymongoChangeSource` (same
pipeline, ``fullDocument`` options, bootstrap command and cursor comments) with
``await collection.watch(...)``. Its cursors are pymongo's ``AsyncChangeStream``:
``alive``, ``resume_token``, ``await try_next()``, ``await close()``.

Clients come from ``FLOWWARDEN["MONGO_CLIENTS"]``, as the sync ``clients.py``
builds them, but an ``AsyncMongoClient`` belongs to one event loop: they are kept
per loop and alias (:data:`async_mongo_clients`).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping
from typing import Any, Protocol

from ..exceptions import MissingExtraError
from .clients import client_settings
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
    """The async counterpart of :class:`~.source.ChangeSource` (no initial sync yet)."""

    async def open(
        self,
        *,
        resume_after: Mapping[str, Any] | None = None,
        start_after: Mapping[str, Any] | None = None,
        start_at_operation_time: Any = None,
    ) -> AsyncChangeCursor: ...

    async def initial_position(self) -> Mapping[str, Any]: ...

    async def oldest_oplog_time(self) -> Any: ...


class AsyncMongoClientHandler:
    """One ``AsyncMongoClient`` per configured alias per running event loop."""

    def __init__(self) -> None:
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Any]] = (
            weakref.WeakKeyDictionary()
        )

    def __getitem__(self, alias: str) -> Any:
        loop = asyncio.get_running_loop()
        clients = self._clients.setdefault(loop, {})
        client = clients.get(alias)
        if client is None:
            client = clients[alias] = self._create(alias)
        return client

    def _create(self, alias: str) -> Any:
        url, options = client_settings(alias)
        try:
            from pymongo import AsyncMongoClient
        except ImportError as exc:
            raise MissingExtraError("pymongo", "mongo", "Change streams") from exc
        return AsyncMongoClient(url, **options)

    async def aclose(self) -> None:
        """Close the running loop's clients (call it before the loop ends)."""
        clients = self._clients.pop(asyncio.get_running_loop(), {})
        for client in clients.values():
            await client.close()


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
    from .manager import source_options

    return AsyncPymongoChangeSource(async_mongo_clients[spec.client], **source_options(spec))
