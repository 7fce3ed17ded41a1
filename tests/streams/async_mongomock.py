"""mongomock behind pymongo's async API: what the MongoDB backends' native async path
runs on in the tests (there is no async mongomock).

``AsyncMongomockClient(mongomock_client)`` has the part of ``AsyncMongoClient`` the
backends use: ``client[name]`` / ``get_default_database()``, ``get_collection()``,
``await close()``; its collections await ``find_one``, ``update_one``,
``replace_one``, ``find_one_and_update``, ``delete_one``/``delete_many``,
``count_documents``, ``create_index`` and ``insert_one``, and ``find(...)`` returns
a cursor with ``sort()``, ``await to_list()`` and ``async for``. Results and errors
(``DuplicateKeyError``…) are mongomock's, which are pymongo's.

mongomock is not thread-safe, and the async contract's race tests run event loops on
several threads: every call holds :data:`MONGOMOCK_LOCK` (as the sync path's
``SerializedCollection`` calls do). The calls run on the loop's thread and
do not yield; the tests check the backends' queries and documents on the native
path, not concurrency on a server (the live lane does that).

A backend runs on it through the seam ``MongoCollection.async_client_factory``
(:class:`NativeOnMongomock`).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from flowwarden_django.streams.checkpoint import CheckpointStore
from flowwarden_django.streams.dlq import DlqStore
from flowwarden_django.streams.locks import LockService

MONGOMOCK_LOCK = threading.RLock()

_AWAITED = frozenset(
    {
        "find_one",
        "update_one",
        "replace_one",
        "find_one_and_update",
        "delete_one",
        "delete_many",
        "count_documents",
        "create_index",
        "insert_one",
        "drop",
    }
)


def _awaitable(method: Callable[..., Any]) -> Callable[..., Any]:
    async def call(*args: Any, **kwargs: Any) -> Any:
        with MONGOMOCK_LOCK:
            return method(*args, **kwargs)

    return call


class AsyncMongomockCursor:
    """A mongomock cursor read by ``await to_list()`` or ``async for``."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    def sort(self, *args: Any, **kwargs: Any) -> AsyncMongomockCursor:
        self._cursor = self._cursor.sort(*args, **kwargs)
        return self

    async def to_list(self, length: int | None = None) -> list[Any]:
        with MONGOMOCK_LOCK:
            documents = list(self._cursor)
        return documents if length is None else documents[:length]

    async def __aiter__(self) -> AsyncIterator[Any]:
        for document in await self.to_list():
            yield document


class AsyncMongomockCollection:
    """A mongomock collection whose operations are awaited."""

    def __init__(self, collection: Any) -> None:
        self.sync = collection

    @property
    def name(self) -> str:
        return self.sync.name

    def find(self, *args: Any, **kwargs: Any) -> AsyncMongomockCursor:
        with MONGOMOCK_LOCK:
            return AsyncMongomockCursor(self.sync.find(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        if name not in _AWAITED:
            raise AttributeError(f"the async mongomock adapter has no {name!r}")
        return _awaitable(getattr(self.sync, name))


class AsyncMongomockDatabase:
    def __init__(self, database: Any) -> None:
        self.sync = database

    def get_collection(self, name: str, **options: Any) -> AsyncMongomockCollection:
        return AsyncMongomockCollection(self.sync.get_collection(name, **options))


class AsyncMongomockClient:
    """A mongomock client with the ``AsyncMongoClient`` surface the backends use."""

    def __init__(self, client: Any) -> None:
        self.sync = client
        self.closed = False

    def __getitem__(self, name: str) -> AsyncMongomockDatabase:
        return AsyncMongomockDatabase(self.sync[name])

    def get_default_database(self, default: str | None = None) -> AsyncMongomockDatabase:
        return AsyncMongomockDatabase(self.sync.get_default_database(default=default))

    async def close(self) -> None:
        self.closed = True  # the mongomock client is the sync path's: it stays open


class NativeOnMongomock:
    """Mixin for a MongoDB backend made with ``client=mongomock.MongoClient()``: its
    async operations run natively, on an :class:`AsyncMongomockClient` over that same
    client (one per event loop, as an ``AsyncMongoClient`` would be), instead of
    falling back to the thread-based default."""

    def async_client_factory(self) -> Callable[[], Any]:
        sync_client = self._client  # type: ignore[attr-defined]
        return lambda: AsyncMongomockClient(sync_client)


class NativeAsyncOnly:
    """Mixin for a test class: the async API's thread-based default (``_run_sync`` of
    the SPI base classes) fails the test, so every ``a…`` operation it runs is native."""

    @pytest.fixture(autouse=True)
    def _no_thread_path(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        refuse_thread_path(monkeypatch)
        yield


def refuse_thread_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the thread-based default of every SPI base class fail the test."""

    async def refuse(self: Any, method: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{method.__name__} ran through the thread-based default")

    for base in (CheckpointStore, DlqStore, LockService):
        monkeypatch.setattr(base, "_run_sync", refuse)
