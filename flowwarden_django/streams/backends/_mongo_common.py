"""The MongoDB connection every Mongo backend shares: a lazily opened collection."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from django.core import checks

from ..stores import store_setting
from ._extras import missing_extra

#: The database used when neither ``database`` nor the URL names one.
DEFAULT_DATABASE = "flowwarden"


class MongoCollection:
    """Connects on first use to one collection, from a ``url`` (its default database
    unless ``database`` is given) or a ready pymongo-compatible ``client``, with
    ``write_concern`` on every write. ``close()`` closes only a client it made.

    Backends subclass it and may override :meth:`prepare` (run once, on the freshly
    opened collection, before anyone uses it: creating indexes, say).
    """

    def __init__(
        self,
        url: str | None,
        client: Any,
        database: str | None,
        collection: str,
        write_concern: str | int = "majority",
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        if (url is None) == (client is None):
            raise TypeError("give exactly one of url and client")
        self.url = url
        self.database_name = database
        self.collection_name = collection
        self.write_concern = write_concern
        self.client_options = dict(client_options or {})
        self._client = client
        self._owns_client = client is None
        self._collection: Any = None
        self._lock = threading.Lock()

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

    def _open(self) -> Any:
        from bson.codec_options import CodecOptions
        from pymongo.write_concern import WriteConcern

        if self._client is None:
            from pymongo import MongoClient

            self._client = MongoClient(self.url, **self.client_options)
        if self.database_name is not None:
            database = self._client[self.database_name]
        else:
            database = self._client.get_default_database(default=DEFAULT_DATABASE)
        return database.get_collection(
            self.collection_name,
            codec_options=CodecOptions(),
            write_concern=WriteConcern(w=self.write_concern),
        )

    def close(self) -> None:
        """Close the client if this object made it; the next use reconnects."""
        if self._owns_client and self._client is not None:
            self._client.close()
        self._client = None if self._owns_client else self._client
        self._collection = None


def check_connection_options(
    cls: type, alias: str, options: Mapping[str, Any]
) -> list[checks.CheckMessage]:
    """The option checks of a MongoDB backend: the extra is installed and ``url`` is a
    MongoDB connection string (or a ``client`` is given)."""
    error = missing_extra(alias, "pymongo", "mongo", cls.__name__)
    if error is not None:
        return [error]
    url = options.get("url")
    if url is not None and not str(url).startswith(("mongodb://", "mongodb+srv://")):
        return [
            checks.Error(
                f'{store_setting(alias)}["OPTIONS"]["url"] = {url!r} '
                "is not a MongoDB connection string.",
                hint='Use "mongodb://host:27017/dbname?replicaSet=rs0".',
                id="flowwarden_django.E008",
            )
        ]
    if url is None and options.get("client") is None:
        return [
            checks.Error(
                f'{store_setting(alias)}["OPTIONS"] needs "url".',
                hint='Add "url": "mongodb://host:27017/dbname?replicaSet=rs0".',
                id="flowwarden_django.E004",
            )
        ]
    return []
