"""Dead-letter store on MongoDB, in the reference's ``_fw_dlq`` layout.

Document: ``{_id, streamName, operationType, documentKey, fullDocument,
resumeToken, error: {type, message, stackTrace}, attempts, status,
firstAttemptAt, lastAttemptAt, createdAt, expiresAt, metadata}`` plus the replay
fields ``replayCount``, ``lastReplayedAt``, ``resolvedAt``, ``resolvedBy`` and
``note``. BSON values are stored as BSON, so they keep their types.

Indexes, created once on first use: a TTL index on ``expiresAt``
(``expireAfterSeconds: 0``, so the server deletes an entry once it expires;
the reference's rc.2 fix) and ``{streamName: 1, status: 1}`` for ``count``.
``save`` is one ``replace_one(upsert=True)``; each status change is one
``update_one`` whose filter holds the expected statuses, so it is a
compare-and-set. ``count`` is ``count_documents`` (never an estimate).

The async operations are native: the same filters and update documents (built once,
by the helpers below) on pymongo's ``AsyncMongoClient``, one per running event loop
(see :meth:`MongoCollection.async_collection`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from django.core import checks

from ..checkpoint import as_utc
from ..dlq import PENDING, DeadLetter, DlqPolicy, ErrorInfo
from ..stores import dlq_stores
from ..tokens import normalize_token
from ._calls import Operation, call
from ._dlq_common import (
    StatusChange,
    check_aware,
    check_entry,
    check_limit,
)
from ._extras import ms_precision
from ._mongo_common import FindAll, MongoCollection, mongo_option_checks
from ._native_dlq import NativeDlqStore

DEFAULT_COLLECTION = "_fw_dlq"

#: The indexes the store creates: (keys, options).
INDEXES = (
    ([("expiresAt", 1)], {"expireAfterSeconds": 0}),
    ([("streamName", 1), ("status", 1)], {}),
)


def _error(error: ErrorInfo) -> dict[str, Any]:
    return {"type": error.type, "message": error.message, "stackTrace": error.stack_trace}


def _document(entry: DeadLetter) -> dict[str, Any]:
    return {
        "streamName": entry.stream_name,
        "operationType": entry.operation_type,
        "documentKey": normalize_token(entry.document_key),
        "fullDocument": normalize_token(entry.full_document),
        "resumeToken": normalize_token(entry.resume_token),
        "error": _error(entry.error),
        "attempts": entry.attempts,
        "status": entry.status,
        "firstAttemptAt": ms_precision(entry.first_attempt_at),
        "lastAttemptAt": ms_precision(entry.last_attempt_at),
        "createdAt": ms_precision(entry.created_at),
        "expiresAt": ms_precision(entry.expires_at),
        "metadata": dict(entry.metadata),
        "replayCount": entry.replay_count,
        "lastReplayedAt": ms_precision(entry.last_replayed_at),
        "resolvedAt": ms_precision(entry.resolved_at),
        "resolvedBy": entry.resolved_by,
        "note": entry.note,
    }


def _entry(document: Mapping[str, Any]) -> DeadLetter:
    error = document.get("error") or {}
    return DeadLetter(
        id=document["_id"],
        stream_name=document["streamName"],
        operation_type=document["operationType"],
        document_key=normalize_token(document.get("documentKey")),
        full_document=normalize_token(document.get("fullDocument")),
        resume_token=normalize_token(document.get("resumeToken")),
        error=ErrorInfo(error.get("type", ""), error.get("message", ""), error.get("stackTrace")),
        attempts=document.get("attempts", 0),
        status=document.get("status", PENDING),
        first_attempt_at=as_utc(document["firstAttemptAt"]),
        last_attempt_at=as_utc(document["lastAttemptAt"]),
        created_at=as_utc(document["createdAt"]),
        expires_at=as_utc(document.get("expiresAt")),
        metadata=document.get("metadata") or {},
        replay_count=document.get("replayCount", 0),
        last_replayed_at=as_utc(document.get("lastReplayedAt")),
        resolved_at=as_utc(document.get("resolvedAt")),
        resolved_by=document.get("resolvedBy", ""),
        note=document.get("note", ""),
    )


# -- the filters and update documents, shared by the sync and async operations -------

Write = tuple[dict[str, Any], dict[str, Any]]  # (filter, update or replacement document)


def _replacement(entry: DeadLetter) -> Write:
    """``save``: the whole document, for ``replace_one(..., upsert=True)``."""
    check_entry(entry)
    return {"_id": entry.id}, _document(entry)


def _stream_query(stream_name: str, status: str | None, limit: int | None) -> dict[str, Any] | None:
    """The ``find`` arguments of ``find_by_stream``; ``None`` when it finds nothing."""
    check_limit(limit)
    if limit == 0:
        return None  # a MongoDB limit of 0 means "no limit"
    query: dict[str, Any] = {"streamName": stream_name}
    if status is not None:
        query["status"] = status
    return {"filter": query, "sort": [("createdAt", -1), ("_id", 1)], "limit": limit or 0}


def _pending(stream_name: str) -> dict[str, Any]:
    """The filter ``count`` counts."""
    return {"streamName": stream_name, "status": PENDING}


def _status_write(change: StatusChange) -> Write:
    """The compare-and-set of a status change: the expected statuses are in the filter."""
    update: dict[str, Any] = {
        "$set": {"status": change.status, **change.document_fields(ms_precision, _error)}
    }
    if change.replayed is not None:
        update["$inc"] = {"replayCount": 1}
    return {"_id": change.entry_id, "status": {"$in": list(change.allowed)}}, update


def _expired(now: datetime) -> dict[str, Any]:
    """The filter ``purge_expired`` deletes."""
    check_aware(now, "now")
    return {"expiresAt": {"$lt": now}}


# -- the operations, each run by the sync and the async API (see ``_calls``) ---------


def _save(entry: DeadLetter, policy: DlqPolicy) -> Operation[None]:
    yield call("replace_one", *_replacement(entry), upsert=True)


def _find_by_id(entry_id: str) -> Operation[DeadLetter | None]:
    document = yield call("find_one", {"_id": entry_id})
    return None if document is None else _entry(document)


def _find_by_stream(
    stream_name: str, status: str | None, limit: int | None
) -> Operation[list[DeadLetter]]:
    query = _stream_query(stream_name, status, limit)
    if query is None:
        return []
    return [_entry(document) for document in (yield FindAll(query))]


def _count(stream_name: str) -> Operation[int]:
    return (yield call("count_documents", _pending(stream_name)))


def _matched(write: Callable[..., Write], *args: Any) -> Operation[bool]:
    """``update_one(*write(*args))``: whether it matched the entry."""
    return (yield call("update_one", *write(*args))).matched_count == 1


def _purge_expired(now: datetime) -> Operation[int]:
    return (yield call("delete_many", _expired(now))).deleted_count


def _delete(entry_id: str) -> Operation[None]:
    yield call("delete_one", {"_id": entry_id})


class MongoDlqStore(MongoCollection, NativeDlqStore):
    """Stores dead letters in a MongoDB collection (``_fw_dlq`` by default).

    Connect with a ``url`` (its default database is used unless ``database`` is
    given) or hand over a ready pymongo-compatible ``client``. Writes use
    ``w="majority"`` unless ``write_concern`` says otherwise. For a collection
    per stream (the reference's ``@MongoDlqOptions``), configure one
    ``DLQ_STORES`` alias per collection and name it in the stream's
    ``dead_letter_queue(store=...)``.

    The async operations are native, on pymongo's ``AsyncMongoClient`` (one per
    running event loop, made from ``url`` and ``client_options``) with the same
    filters and updates; given a ready ``client``, they fall back to the default
    (the sync operation on the default executor).
    """

    default_collection = DEFAULT_COLLECTION

    def prepare(self, collection: Any) -> None:
        """Create the indexes when the collection is first opened."""
        self.create_indexes(collection)

    async def aprepare(self, collection: Any) -> None:
        """Create the indexes when the async collection is first used."""
        await self.acreate_indexes(collection)

    @staticmethod
    def create_indexes(collection: Any) -> None:
        """Create the TTL index on ``expiresAt`` and the ``{streamName, status}`` index
        (a no-op when they exist)."""
        for keys, options in INDEXES:
            collection.create_index(keys, **options)

    @staticmethod
    async def acreate_indexes(collection: Any) -> None:
        """:meth:`create_indexes` on an async collection."""
        for keys, options in INDEXES:
            await collection.create_index(keys, **options)

    # -- the store operations, each run by the sync and the async API --------------

    _save_operation = staticmethod(_save)
    _find_by_id_operation = staticmethod(_find_by_id)
    _find_by_stream_operation = staticmethod(_find_by_stream)
    _count_operation = staticmethod(_count)
    _purge_expired_operation = staticmethod(_purge_expired)
    _delete_operation = staticmethod(_delete)

    def _change_status(self, change: StatusChange) -> Operation[bool]:
        return _matched(_status_write, change)

    # -- configuration checks ----------------------------------------------------

    @classmethod
    def check_options(cls, alias: str, options: Mapping[str, Any]) -> list[checks.CheckMessage]:
        return mongo_option_checks(dlq_stores.alias_setting(alias), cls.__name__, options)
