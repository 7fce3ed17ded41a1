"""MongoDB clients by alias: ``FLOWWARDEN["MONGO_CLIENTS"]``, one client per alias per process,
and the production change source of a stream on its client (``pymongo_source``).

``{"default": {"URL": "mongodb://host:27017/?replicaSet=rs0", "OPTIONS": {...}}}``;
``OPTIONS`` are keyword arguments of ``pymongo.MongoClient``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..common.durations import parse_duration
from ..common.network import with_mongo_timeouts
from ..conf import fw_settings
from ..exceptions import MissingExtraError
from .source import ChangeSource, PymongoChangeSource

if TYPE_CHECKING:
    from .spec import StreamSpec


def client_settings(alias: str) -> tuple[str, dict[str, Any]]:
    """The URL and options of MongoDB client *alias* in ``FLOWWARDEN["MONGO_CLIENTS"]``
    (sync and async clients are made from the same), with the timeouts of
    ``DEAD_CONNECTION_TIMEOUT`` the URL and the options do not set (``mongo_options``;
    the socket timeout leaves a change stream's ``getMore`` its ``STREAM_MAX_AWAIT_MS``)."""
    configured: Mapping[str, Any] = fw_settings.MONGO_CLIENTS or {}
    if alias not in configured:
        raise KeyError(
            f"no MongoDB client {alias!r} in FLOWWARDEN['MONGO_CLIENTS'] "
            f"(configured: {', '.join(sorted(configured)) or 'none'})"
        )
    config = configured[alias]
    url, options = config["URL"], dict(config.get("OPTIONS") or {})
    awaits = max_await_ms(fw_settings.STREAM_MAX_AWAIT_MS)
    return url, with_mongo_timeouts(url, options, max_await_ms=awaits)


class MongoClientHandler:
    """Builds and keeps one pymongo client per configured alias."""

    def __init__(self) -> None:
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __getitem__(self, alias: str) -> Any:
        client = self._clients.get(alias)
        if client is not None:
            return client
        with self._lock:
            if alias not in self._clients:
                self._clients[alias] = self._create(alias)
            return self._clients[alias]

    def _create(self, alias: str) -> Any:
        url, options = client_settings(alias)
        try:
            from pymongo import MongoClient
        except ImportError as exc:
            raise MissingExtraError("pymongo", "mongo", "Change streams") from exc
        return MongoClient(url, **options)

    def reset(self) -> None:
        """Close every client; the next access reconnects from the settings."""
        with self._lock:
            clients, self._clients = self._clients, {}
        for client in clients.values():
            client.close()


mongo_clients = MongoClientHandler()


def client_hosts(alias: str) -> str:
    """``"127.0.0.1:27017"``: where client *alias* connects, without credentials."""
    config = (fw_settings.MONGO_CLIENTS or {}).get(alias) or {}
    url = str(config.get("URL") or "")
    try:
        from pymongo.uri_parser import parse_uri

        nodes = parse_uri(url, validate=False, warn=True).get("nodelist") or []
    except Exception:  # an unparsable URL (the checks report it): say no more than that
        return "(an unreadable URL)"
    return ",".join(f"{host}:{port}" for host, port in nodes) or "(no host)"


def probe(alias: str, timeout: float = 3.0) -> str | None:
    """``None`` when client *alias*'s MongoDB answers a ``ping`` within *timeout*
    seconds, else a one-line reason (a fresh client, so the shared one keeps its own
    timeouts)."""
    config = (fw_settings.MONGO_CLIENTS or {}).get(alias)
    if config is None:
        return f"no MongoDB client {alias!r} in FLOWWARDEN['MONGO_CLIENTS']"
    try:
        from pymongo import MongoClient
    except ImportError as exc:
        raise MissingExtraError("pymongo", "mongo", "Change streams") from exc
    options = {
        **dict(config.get("OPTIONS") or {}),
        "serverSelectionTimeoutMS": int(timeout * 1000),
        "connectTimeoutMS": int(timeout * 1000),
    }
    client = None
    try:
        client = MongoClient(config["URL"], **options)
        client.admin.command("ping")
    except Exception as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        return f"{type(exc).__name__}: {first.split(', Timeout:')[0][:200]}"
    finally:
        if client is not None:
            client.close()
    return None


def pymongo_source(spec: StreamSpec) -> ChangeSource:
    """The production source of a stream: its MongoDB client alias, collection and pipeline."""
    return PymongoChangeSource(mongo_clients[spec.client], **source_options(spec))


def source_options(spec: StreamSpec) -> dict[str, Any]:
    """The arguments after the client of a pymongo source (sync or async) of *spec*."""
    return {
        "database": spec.database,
        "collection": spec.collection,
        "stream_name": spec.name,
        "pipeline": list(spec.pipeline()) if spec.pipeline is not None else [],
        "full_document": spec.full_document,
        "full_document_before_change": spec.full_document_before_change,
        "max_await_ms": max_await_ms(fw_settings.STREAM_MAX_AWAIT_MS),
    }


def max_await_ms(value: str | float) -> int:
    """``STREAM_MAX_AWAIT_MS`` in milliseconds: a number is milliseconds, text a
    duration (``"200ms"``, ``"1s"``)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return max(1, int(value))
    return max(1, int(parse_duration(value) * 1000))
