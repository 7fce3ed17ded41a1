"""The MongoDB connection every Mongo backend shares: a lazily opened collection, and
the same collection on an ``AsyncMongoClient`` per running event loop for the native
async API."""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar

from django.core import checks

from ...common.network import with_mongo_timeouts
from ..async_source import AsyncMongoClientHandler, new_async_client
from ._calls import Call
from ._extras import missing_extra

#: The database used when neither ``database`` nor the URL names one.
DEFAULT_DATABASE = "flowwarden"


@dataclasses.dataclass(frozen=True, slots=True)
class FindAll:
    """A request of a store operation: every document of ``collection.find(**query)``,
    sorted by ``sort`` (``cursor.sort``'s arguments) when given, as a list."""

    query: dict[str, Any]
    sort: tuple[Any, ...] = ()


def perform(collection: Any, request: Call | FindAll) -> Any:
    """Make *request* on a pymongo collection."""
    if isinstance(request, FindAll):
        cursor = collection.find(**request.query)
        return list(cursor.sort(*request.sort) if request.sort else cursor)
    return request.on(collection)


async def aperform(collection: Any, request: Call | FindAll) -> Any:
    """Make *request* on an ``AsyncMongoClient``'s collection."""
    if isinstance(request, FindAll):
        cursor = collection.find(**request.query)
        return await (cursor.sort(*request.sort) if request.sort else cursor).to_list()
    return await request.on(collection)


class MongoCollection:
    """Connects on first use to one collection, from a ``url`` (its default database
    unless ``database`` is given) or a ready pymongo-compatible ``client``, with
    ``write_concern`` on every write. ``close()`` closes only a client it made.

    Backends subclass it and may override :meth:`prepare` (run once, on the freshly
    opened collection, before anyone uses it: creating indexes, say) and
    :meth:`aprepare`, its async twin.

    The native async API works on :meth:`async_collection`: the same database and
    collection (codec options, write concern) on the running loop's
    ``AsyncMongoClient``, made from ``url`` and ``client_options`` as the sync client
    is. A backend handed a ready ``client`` has no settings to copy: there
    :meth:`async_collection` is ``None`` and the async operations fall back to the
    default (the sync operation on the default executor).
    """

    #: The collection used when none is named.
    default_collection: ClassVar[str]

    def __init__(
        self,
        url: str | None = None,
        client: Any = None,
        database: str | None = None,
        collection: str | None = None,
        write_concern: str | int = "majority",
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        if (url is None) == (client is None):
            raise TypeError("give exactly one of url and client")
        self.url = url
        self.database_name = database
        self.collection_name = self.default_collection if collection is None else collection
        self.write_concern = write_concern
        self.client_options = dict(client_options or {})
        self._client = client
        self._owns_client = client is None
        self._collection: Any = None
        self._lock = threading.Lock()
        self._async_clients = AsyncMongoClientHandler()
        self._async_prepared = False

    @property
    def collection(self) -> Any:
        """The pymongo collection, connected (and prepared) on first use."""
        if self._collection is None:
            with self._lock:
                if self._collection is None:
                    collection = self._open()
                    self.prepare(collection)
                    self._collection = collection
        return self._collection

    def prepare(self, collection: Any) -> None:
        """Set up a freshly opened collection (nothing by default)."""

    async def aprepare(self, collection: Any) -> None:
        """:meth:`prepare` on the async collection (nothing by default); run once."""

    def _open(self) -> Any:
        if self._client is None:
            from pymongo import MongoClient

            self._client = MongoClient(self.url, **self.timeout_options())
        return self._collection_on(self._client)

    def _collection_on(self, client: Any) -> Any:
        """This backend's collection on *client*, a ``MongoClient`` or an
        ``AsyncMongoClient``."""
        from bson.codec_options import CodecOptions
        from pymongo.write_concern import WriteConcern

        if self.database_name is not None:
            database = client[self.database_name]
        else:
            database = client.get_default_database(default=DEFAULT_DATABASE)
        return database.get_collection(
            self.collection_name,
            codec_options=CodecOptions(),
            write_concern=WriteConcern(w=self.write_concern),
        )

    def close(self) -> None:
        """Close the client if this object made it, and let go of the async clients
        (each closed on its loop if that still runs); the next use reconnects."""
        if self._owns_client and self._client is not None:
            self._client.close()
        self._client = None if self._owns_client else self._client
        self._collection = None
        self._async_clients.reset()
        self._async_prepared = False

    # -- the native async API ------------------------------------------------------

    def async_client_factory(self) -> Callable[[], Any] | None:
        """What makes the async client of an event loop: an ``AsyncMongoClient`` from
        ``url`` and ``client_options``, or ``None`` when a ready ``client`` was given
        (then the async operations fall back to the thread-based default).

        The seam of the tests: they override it to return a maker of an in-process
        fake with the ``AsyncMongoClient`` API the backends use
        (``tests/streams/async_mongomock.py``).
        """
        if self.url is None:
            return None
        url, options = self.url, self.timeout_options()
        return lambda: new_async_client(url, options, type(self).__name__)

    def timeout_options(self) -> dict[str, Any]:
        """``client_options`` with the timeouts of ``DEAD_CONNECTION_TIMEOUT`` that
        they and the URL do not set (``common.network.mongo_options``)."""
        return with_mongo_timeouts(self.url or "", self.client_options)

    async def async_collection(self) -> Any:
        """The collection on the running loop's async client (made on first use on
        that loop, prepared by :meth:`aprepare` once), or ``None`` when
        :meth:`async_client_factory` is."""
        factory = self.async_client_factory()
        if factory is None:
            return None
        collection = self._collection_on(self._async_clients.get("client", factory))
        if not self._async_prepared:
            await self.aprepare(collection)
            self._async_prepared = True
        return collection

    def _perform(self, request: Call | FindAll) -> Any:
        """Make one request of a store operation (see ``_calls``) on :attr:`collection`."""
        return perform(self.collection, request)

    async def _async_performer(self) -> Callable[[Call | FindAll], Awaitable[Any]] | None:
        """What makes a request on :meth:`async_collection`, or ``None`` without one."""
        collection = await self.async_collection()
        return None if collection is None else functools.partial(aperform, collection)

    async def aclose(self) -> None:
        """Close the running loop's async client (a client of another loop closes
        with its loop); the next async operation makes a new one."""
        await self._async_clients.aclose()


def mongo_option_checks(
    alias_setting: str, backend: str, options: Mapping[str, Any]
) -> list[checks.CheckMessage]:
    """The option checks of a MongoDB backend (*alias_setting*: the setting path of its
    alias): the extra is installed and ``url`` is a MongoDB connection string (or a
    ``client`` is given)."""
    error = missing_extra(alias_setting, "pymongo", "mongo", backend)
    if error is not None:
        return [error]
    url = options.get("url")
    if url is not None and not str(url).startswith(("mongodb://", "mongodb+srv://")):
        return [
            checks.Error(
                f'{alias_setting}["OPTIONS"]["url"] = {url!r} is not a MongoDB connection string.',
                hint='Use "mongodb://host:27017/dbname?replicaSet=rs0".',
                id="flowwarden_django.E008",
            )
        ]
    if url is None and options.get("client") is None:
        return [
            checks.Error(
                f'{alias_setting}["OPTIONS"] needs "url".',
                hint='Add "url": "mongodb://host:27017/dbname?replicaSet=rs0".',
                id="flowwarden_django.E004",
            )
        ]
    return []
