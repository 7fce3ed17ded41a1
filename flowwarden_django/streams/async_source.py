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
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ..conf import fw_settings
from ..exceptions import MissingExtraError
from .source import CURSOR_COMMENT_PREFIX
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
        configured: Mapping[str, Any] = fw_settings.MONGO_CLIENTS or {}
        if alias not in configured:
            raise KeyError(
                f"no MongoDB client {alias!r} in FLOWWARDEN['MONGO_CLIENTS'] "
                f"(configured: {', '.join(sorted(configured)) or 'none'})"
            )
        config = configured[alias]
        try:
            from pymongo import AsyncMongoClient
        except ImportError as exc:
            raise MissingExtraError("pymongo", "mongo", "Change streams") from exc
        return AsyncMongoClient(config["URL"], **dict(config.get("OPTIONS") or {}))

    async def aclose(self) -> None:
        """Close the running loop's clients (call it before the loop ends)."""
        clients = self._clients.pop(asyncio.get_running_loop(), {})
        for client in clients.values():
            await client.close()


async_mongo_clients = AsyncMongoClientHandler()


class AsyncPymongoChangeSource:
    """Change streams on one collection through ``AsyncCollection.watch()``."""

    def __init__(
        self,
        client: Any,
        database: str | None,
        collection: str,
        *,
        stream_name: str,
        pipeline: Sequence[Mapping[str, Any]] = (),
        full_document: str = "default",
        full_document_before_change: str = "off",
        max_await_ms: int = 1000,
    ) -> None:
        self.client = client
        self.database = client[database] if database else client.get_default_database()
        self.collection = self.database[collection]
        self.stream_name = stream_name
        self.pipeline = list(pipeline)
        self.full_document = None if full_document == "default" else full_document
        self.full_document_before_change = (
            None if full_document_before_change == "off" else full_document_before_change
        )
        self.max_await_ms = max_await_ms

    async def open(
        self,
        *,
        resume_after: Mapping[str, Any] | None = None,
        start_after: Mapping[str, Any] | None = None,
        start_at_operation_time: Any = None,
    ) -> AsyncChangeCursor:
        return await self.collection.watch(
            self.pipeline,
            full_document=self.full_document,
            full_document_before_change=self.full_document_before_change,
            resume_after=resume_after,
            start_after=start_after,
            start_at_operation_time=start_at_operation_time,
            max_await_time_ms=self.max_await_ms,
            comment=f"{CURSOR_COMMENT_PREFIX}{self.stream_name}",
        )

    def _change_stream_stage(self) -> dict[str, Any]:
        stage: dict[str, Any] = {}
        if self.full_document:
            stage["fullDocument"] = self.full_document
        if self.full_document_before_change:
            stage["fullDocumentBeforeChange"] = self.full_document_before_change
        return stage

    async def initial_position(self) -> Mapping[str, Any]:
        # batchSize 0: the reply carries the position and no event (see the sync source).
        reply = await self.database.command(
            "aggregate",
            self.collection.name,
            pipeline=[{"$changeStream": self._change_stream_stage()}, *self.pipeline],
            cursor={"batchSize": 0},
            comment=f"{CURSOR_COMMENT_PREFIX}bootstrap:{self.stream_name}",
        )
        cursor = reply["cursor"]
        if cursor.get("id"):
            await self.database.command("killCursors", self.collection.name, cursors=[cursor["id"]])
        token = cursor.get("postBatchResumeToken")
        if token is None:
            raise RuntimeError(
                f"stream {self.stream_name!r}: the server returned no postBatchResumeToken "
                "(change streams need MongoDB 4.0.7+ running as a replica set)"
            )
        return token

    async def oldest_oplog_time(self) -> Any:
        from pymongo.errors import PyMongoError

        try:
            first = await self.client.local["oplog.rs"].find_one({}, sort=[("$natural", 1)])
        except PyMongoError:
            return None
        return None if first is None else first.get("ts")


def async_pymongo_source(spec: StreamSpec) -> AsyncPymongoChangeSource:
    """The production async source of a stream (call it inside the running loop)."""
    from .manager import max_await_ms

    pipeline = list(spec.pipeline()) if spec.pipeline is not None else []
    return AsyncPymongoChangeSource(
        async_mongo_clients[spec.client],
        spec.database,
        spec.collection,
        stream_name=spec.name,
        pipeline=pipeline,
        full_document=spec.full_document,
        full_document_before_change=spec.full_document_before_change,
        max_await_ms=max_await_ms(fw_settings.STREAM_MAX_AWAIT_MS),
    )
