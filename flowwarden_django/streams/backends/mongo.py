"""Checkpoint store on MongoDB, in the reference's ``_fw_checkpoints`` layout.

Document: ``{_id: stream, instanceId, lastSeenToken, lastSeenTimestamp,
lastProcessedToken, lastProcessedTimestamp, lastHeartbeatTimestamp, metadata,
initialSync}`` with tokens and the initial copy's progress as sub-documents, plus
``lastProcessedKey``: the processed token's BSON bytes. The server's equality on
sub-documents treats ``NumberInt(5)`` and ``NumberLong(5)`` as equal; the guard of
the history-lost reset compares these bytes instead, so it is exact.

Partial writes are single ``update_one(..., upsert=True)`` calls with a partial
``$set``. The reset puts its guard in the update filter; when the guard does not
match, a second upsert writes only the seen pair, so a concurrently re-acquired
processed anchor is never removed.

``save_initial_sync`` is one ``update_one`` whose filter holds its condition
(``initialSync.batch`` equal to the expected batch, or ``initialSync`` null or
absent), with ``upsert=True`` when no progress is expected: a duplicate-key error
then means the record exists and failed the condition, or was created meanwhile
by another writer; the same update without upsert decides on the existing record.

The async operations (``afind``, ``asave``…) are native: the same filters and
update documents (built once, by the helpers below) on pymongo's
``AsyncMongoClient``, one per running event loop (see
:meth:`MongoCollection.async_collection`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from django.core import checks

from ..checkpoint import (
    PROCESSED_PAIR,
    SEEN_PAIR,
    Checkpoint,
    anchor_fields,
    as_utc,
    check_initial_sync_write,
    check_reset,
    heartbeat_fields,
    plain_progress,
)
from ..stores import store_setting
from ..tokens import Token, encode_token, normalize_token
from ._calls import Operation, call
from ._extras import ms_precision
from ._mongo_common import FindAll, MongoCollection, mongo_option_checks
from ._native_checkpoint import NativeCheckpointStore

DEFAULT_COLLECTION = "_fw_checkpoints"

SEEN_TOKEN, SEEN_AT = "lastSeenToken", "lastSeenTimestamp"
PROCESSED_TOKEN, PROCESSED_AT, PROCESSED_KEY = (
    "lastProcessedToken",
    "lastProcessedTimestamp",
    "lastProcessedKey",
)
HEARTBEAT_AT = "lastHeartbeatTimestamp"
INITIAL_SYNC = "initialSync"


def _key(token: Token | None) -> Any:
    from bson import Binary

    data = encode_token(token)
    return None if data is None else Binary(data)


def _processed_equals(expected: Token | None) -> dict[str, Any]:
    """A filter true while the stored processed token is exactly *expected*.

    Compares ``lastProcessedKey`` (BSON bytes); a document written without the key
    (the reference's layout, or by hand) is compared on the token itself.
    """
    if expected is None:
        return {PROCESSED_TOKEN: None}
    return {
        "$or": [
            {PROCESSED_KEY: _key(expected)},
            {PROCESSED_KEY: {"$exists": False}, PROCESSED_TOKEN: normalize_token(expected)},
        ]
    }


# -- the filters and update documents, shared by the sync and async operations -------

#: The document field of each ``Checkpoint`` time a partial write sets.
_TIME_FIELDS = {
    "last_seen_at": SEEN_AT,
    "last_processed_at": PROCESSED_AT,
    "last_heartbeat_at": HEARTBEAT_AT,
}

Write = tuple[dict[str, Any], dict[str, Any]]  # (filter, update or replacement document)


def _set_or_unset(fields: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """An update document that sets the non-null fields and removes the null ones."""
    update: dict[str, dict[str, Any]] = {}
    for name, value in fields.items():
        if value is None:
            update.setdefault("$unset", {})[name] = ""
        else:
            update.setdefault("$set", {})[name] = value
    return update


def _replacement(checkpoint: Checkpoint) -> Write:
    """``save``: the whole document, for ``replace_one(..., upsert=True)``."""
    document: dict[str, Any] = {
        "instanceId": checkpoint.instance_id,
        SEEN_TOKEN: normalize_token(checkpoint.last_seen_token),
        SEEN_AT: ms_precision(checkpoint.last_seen_at),
        PROCESSED_TOKEN: normalize_token(checkpoint.last_processed_token),
        PROCESSED_KEY: _key(checkpoint.last_processed_token),
        PROCESSED_AT: ms_precision(checkpoint.last_processed_at),
        HEARTBEAT_AT: ms_precision(checkpoint.last_heartbeat_at),
        "metadata": dict(checkpoint.metadata),
        INITIAL_SYNC: plain_progress(checkpoint.initial_sync),
    }
    document = {k: v for k, v in document.items() if v is not None}
    return {"_id": checkpoint.stream_name}, document


def _partial(stream_name: str, fields: Mapping[str, Any]) -> Write:
    """A partial write of these checked ``Checkpoint`` fields, for
    ``update_one(upsert=True)``: the processed token goes with its key."""
    document: dict[str, Any] = {}
    for name, value in fields.items():
        if name == "last_seen_token":
            document[SEEN_TOKEN] = normalize_token(value)
        elif name == "last_processed_token":
            document[PROCESSED_TOKEN] = normalize_token(value)
            document[PROCESSED_KEY] = _key(value)
        else:
            document[_TIME_FIELDS[name]] = ms_precision(value)
    return {"_id": stream_name}, _set_or_unset(document)


def _reset(
    stream_name: str,
    fresh_seen_token: Token | None,
    expected_dead_processed: Token | None,
    at: datetime,
) -> tuple[Write, Write]:
    """The history-lost reset: the guarded update (new seen pair, processed removed),
    and the seen-only upsert written when the guard matches nothing."""
    check_reset(stream_name, fresh_seen_token, expected_dead_processed, at)
    fresh = normalize_token(fresh_seen_token)
    stamp = ms_precision(at) if fresh is not None else None
    seen = _set_or_unset({SEEN_TOKEN: fresh, SEEN_AT: stamp, HEARTBEAT_AT: stamp})
    guarded = {
        **seen,
        "$unset": {
            **seen.get("$unset", {}),
            PROCESSED_TOKEN: "",
            PROCESSED_KEY: "",
            PROCESSED_AT: "",
        },
    }
    guard = {"_id": stream_name, **_processed_equals(expected_dead_processed)}
    return (guard, guarded), ({"_id": stream_name}, seen)


def _initial_sync(
    stream_name: str, progress: Mapping[str, Any] | None, expected_batch: int | None
) -> Write:
    """``save_initial_sync``: the filter holding its condition, and the update."""
    check_initial_sync_write(stream_name, progress, expected_batch)
    if expected_batch is None:
        condition = {"_id": stream_name, INITIAL_SYNC: None}  # null or absent
    else:
        condition = {"_id": stream_name, f"{INITIAL_SYNC}.batch": expected_batch}
    return condition, _set_or_unset({INITIAL_SYNC: plain_progress(progress)})


def _initial_sync_written(result: Any) -> bool:
    """Whether the ``update_one`` of ``save_initial_sync`` wrote (matched or inserted)."""
    return result.matched_count == 1 or result.upserted_id is not None


def _upsert(write: Callable[..., Write], *args: Any) -> Operation[None]:
    """The upserting ``update_one`` of the partial write ``write(*args)``."""
    yield call("update_one", *write(*args), upsert=True)


def _reset_operation(
    stream_name: str,
    fresh_seen_token: Token | None,
    expected_dead_processed: Token | None,
    at: datetime,
) -> Operation[None]:
    guarded, seen_only = _reset(stream_name, fresh_seen_token, expected_dead_processed, at)
    if (yield call("update_one", *guarded)).matched_count == 0:
        # Guard mismatch (a fresh anchor was re-acquired) or no record: seen only.
        yield call("update_one", *seen_only, upsert=True)


def _initial_sync_operation(
    stream_name: str, progress: Mapping[str, Any] | None, expected_batch: int | None
) -> Operation[bool]:
    from pymongo.errors import DuplicateKeyError

    update = _initial_sync(stream_name, progress, expected_batch)
    try:
        result = yield call("update_one", *update, upsert=expected_batch is None)
    except DuplicateKeyError:
        # The record exists: it has progress, or another writer created it after
        # the filter missed. Decide on the record as it is now.
        result = yield call("update_one", *update)
    return _initial_sync_written(result)


class MongoCheckpointStore(MongoCollection, NativeCheckpointStore):
    """Stores checkpoints in a MongoDB collection (``_fw_checkpoints`` by default).

    Connect with a ``url`` (its default database is used unless ``database`` is
    given) or hand over a ready pymongo-compatible ``client``. Writes use
    ``w="majority"`` unless ``write_concern`` says otherwise.

    The async operations (``afind``, ``asave``…) are native: the same filters and
    update documents on pymongo's ``AsyncMongoClient``, one per running event loop,
    made from ``url`` and ``client_options``. Given a ready ``client`` instead, they
    fall back to the default: the sync operation on the default executor.
    """

    default_collection = DEFAULT_COLLECTION

    def __init__(
        self,
        url: str | None = None,
        database: str | None = None,
        collection: str = DEFAULT_COLLECTION,
        client: Any = None,
        write_concern: str | int = "majority",
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        MongoCollection.__init__(
            self, url, client, database, collection, write_concern, client_options
        )

    # -- the store operations, each run by the sync and the async API --------------

    def _save_operation(self, checkpoint: Checkpoint) -> Operation[None]:
        yield call("replace_one", *_replacement(checkpoint), upsert=True)

    def _find_operation(self, stream_name: str) -> Operation[Checkpoint | None]:
        document = yield call("find_one", {"_id": stream_name})
        return None if document is None else self._to_checkpoint(document)

    def _to_checkpoint(self, document: Mapping[str, Any]) -> Checkpoint:
        return Checkpoint(
            stream_name=document["_id"],
            instance_id=document.get("instanceId"),
            last_seen_token=normalize_token(document.get(SEEN_TOKEN)),
            last_seen_at=as_utc(document.get(SEEN_AT)),
            last_processed_token=normalize_token(document.get(PROCESSED_TOKEN)),
            last_processed_at=as_utc(document.get(PROCESSED_AT)),
            last_heartbeat_at=as_utc(document.get(HEARTBEAT_AT)),
            metadata=document.get("metadata") or {},
            initial_sync=document.get(INITIAL_SYNC),
        )

    def _delete_operation(self, stream_name: str) -> Operation[None]:
        yield call("delete_one", {"_id": stream_name})

    def _list_checkpoints_operation(self) -> Operation[list[Checkpoint]]:
        documents = yield FindAll({"filter": {}}, ("_id", 1))
        return [self._to_checkpoint(doc) for doc in documents]

    def _save_seen_operation(self, stream_name: str, *args: Any) -> Operation[None]:
        return _upsert(_partial, stream_name, anchor_fields(SEEN_PAIR, stream_name, *args))

    def _save_processed_operation(self, stream_name: str, *args: Any) -> Operation[None]:
        return _upsert(_partial, stream_name, anchor_fields(PROCESSED_PAIR, stream_name, *args))

    def _save_heartbeat_operation(self, stream_name: str, at: datetime) -> Operation[None]:
        return _upsert(_partial, stream_name, heartbeat_fields(stream_name, at))

    _reset_after_history_lost_operation = staticmethod(_reset_operation)
    _save_initial_sync_operation = staticmethod(_initial_sync_operation)

    # -- configuration checks ----------------------------------------------------

    @classmethod
    def check_options(cls, alias: str, options: Mapping[str, Any]) -> list[checks.CheckMessage]:
        return mongo_option_checks(store_setting(alias), cls.__name__, options)


# The dead-letter store and lock service of this backend live in their own modules.
from ._mongo_dlq import MongoDlqStore as MongoDlqStore  # noqa: E402
from ._mongo_locks import MongoLockService as MongoLockService  # noqa: E402
