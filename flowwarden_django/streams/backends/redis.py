"""Checkpoint store on Redis: one hash per stream, the reference's layout.

Key ``{key_prefix}checkpoint:{stream}`` (prefix ``fw:`` by default), no TTL.
Fields: ``_v`` (presence marker, so an all-null record is still found),
``instanceId``, ``lastSeenToken`` and ``lastProcessedToken`` (base64 of the
token's BSON), ``lastSeenTimestamp``, ``lastProcessedTimestamp`` and
``lastHeartbeatTimestamp`` (epoch milliseconds), ``metadata`` (JSON), and
``initialSync`` (the initial copy's progress, JSON) with ``initialSyncBatch`` (its
``batch``, in decimal: what ``save_initial_sync`` compares).

Each partial write is one multi-field ``HSET``; ``save`` is ``DEL`` + ``HSET`` in
one ``MULTI``; the history-lost reset and ``save_initial_sync`` are Lua scripts,
so the guard or condition is evaluated atomically with the write. Other fields
of the hash are never touched.

The async operations (``afind``, ``asave``…) are native: the same commands and
scripts on a ``redis.asyncio`` client, one per running event loop (see
:meth:`RedisConnection.async_client`). That client is made from the ``url``, or
from the connection settings of the django-redis cache's or the given client's
pool; when those cannot be mirrored (a Sentinel or cluster pool, a custom
connection class or retry policy), the async operations fall back to the default:
the sync operation on the default executor.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core import checks

from ..checkpoint import (
    PROCESSED_PAIR,
    SEEN_PAIR,
    Checkpoint,
    anchor_fields,
    check_initial_sync_write,
    check_reset,
    heartbeat_fields,
    plain_progress,
)
from ..stores import store_setting
from ..tokens import Token, decode_token, encode_token
from ._calls import Operation, call
from ._native_checkpoint import NativeCheckpointStore
from ._redis_common import Pipeline, RedisConnection, ScanKeys, Script, redis_option_checks

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)

SEEN_TOKEN, SEEN_AT = "lastSeenToken", "lastSeenTimestamp"
PROCESSED_TOKEN, PROCESSED_AT = "lastProcessedToken", "lastProcessedTimestamp"
HEARTBEAT_AT = "lastHeartbeatTimestamp"
INITIAL_SYNC, INITIAL_SYNC_BATCH = "initialSync", "initialSyncBatch"

# KEYS[1] the hash; ARGV: expected dead processed token, fresh seen token, timestamp.
# "" stands for None: an encoded token is never empty.
RESET_AFTER_HISTORY_LOST = """
local current = redis.call('HGET', KEYS[1], 'lastProcessedToken')
local expected = ARGV[1]
local still_dead
if expected == '' then still_dead = (current == false) else still_dead = (current == expected) end
if still_dead then
  redis.call('HDEL', KEYS[1], 'lastProcessedToken', 'lastProcessedTimestamp')
end
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], 'lastSeenToken', 'lastSeenTimestamp', 'lastHeartbeatTimestamp')
  redis.call('HSET', KEYS[1], '_v', '1')
else
  redis.call('HSET', KEYS[1], '_v', '1', 'lastSeenToken', ARGV[2],
             'lastSeenTimestamp', ARGV[3], 'lastHeartbeatTimestamp', ARGV[3])
end
return 1
"""


# KEYS[1] the hash; ARGV: expected batch, new progress (JSON), its batch. "" stands
# for None: a batch is never empty, and JSON text never is.
SAVE_INITIAL_SYNC = """
local stored = redis.call('HGET', KEYS[1], 'initialSyncBatch')
if ARGV[1] == '' then
  if stored then return 0 end
elseif stored ~= ARGV[1] then
  return 0
end
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], 'initialSync', 'initialSyncBatch')
  redis.call('HSET', KEYS[1], '_v', '1')
else
  redis.call('HSET', KEYS[1], '_v', '1', 'initialSync', ARGV[2], 'initialSyncBatch', ARGV[3])
end
return 1
"""


def _encode_batch(batch: int | None) -> str:
    return "" if batch is None else str(batch)


def _encode_token(token: Token | None) -> str:
    data = encode_token(token)
    return "" if data is None else base64.b64encode(data).decode("ascii")


def _decode_token(value: bytes | None) -> dict[str, Any] | None:
    return None if not value else decode_token(base64.b64decode(value))


def _encode_time(value: datetime | None) -> str:
    return "" if value is None else str((value - _EPOCH) // _MS)


def _decode_time(value: bytes | None) -> datetime | None:
    return None if not value else _EPOCH + int(value) * _MS


#: The hash field of each ``Checkpoint`` field a partial write sets.
_HASH_FIELDS = {
    "last_seen_token": SEEN_TOKEN,
    "last_seen_at": SEEN_AT,
    "last_processed_token": PROCESSED_TOKEN,
    "last_processed_at": PROCESSED_AT,
    "last_heartbeat_at": HEARTBEAT_AT,
}


def _hash_fields(fields: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """The hash fields a partial write sets, and those it clears (stored as "nothing")."""
    encoded = {
        _HASH_FIELDS[name]: _encode_token(value) if name.endswith("_token") else _encode_time(value)
        for name, value in fields.items()
    }
    return encoded, [name for name, value in encoded.items() if not value]


def _reset_args(
    stream_name: str,
    fresh_seen_token: Token | None,
    expected_dead_processed: Token | None,
    at: datetime,
) -> list[str]:
    check_reset(stream_name, fresh_seen_token, expected_dead_processed, at)
    return [
        _encode_token(expected_dead_processed),
        _encode_token(fresh_seen_token),
        _encode_time(at),
    ]


def _initial_sync_args(
    stream_name: str, progress: Mapping[str, Any] | None, expected_batch: int | None
) -> list[str]:
    check_initial_sync_write(stream_name, progress, expected_batch)
    stored = plain_progress(progress)
    return [
        _encode_batch(expected_batch),
        "" if stored is None else json.dumps(stored),
        "" if stored is None else _encode_batch(stored["batch"]),
    ]


def _escape_glob(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


class RedisCheckpointStore(RedisConnection, NativeCheckpointStore):
    """Stores checkpoints in Redis hashes.

    Connect through a django-redis cache alias (``cache="default"``, the default),
    a ``url`` such as ``redis://127.0.0.1:6379/0``, or a ready ``client``.
    """

    def __init__(
        self,
        cache: str | None = None,
        url: str | None = None,
        key_prefix: str = "fw:",
        client: Any = None,
    ) -> None:
        RedisConnection.__init__(self, cache=cache, url=url, client=client)
        self.key_prefix = key_prefix

    def key(self, stream_name: str) -> str:
        """The hash key of one stream."""
        return f"{self.key_prefix}checkpoint:{stream_name}"

    # -- the store operations, each run by the sync and the async API --------------

    def _save_operation(self, checkpoint: Checkpoint) -> Operation[None]:
        key, mapping = self.key(checkpoint.stream_name), self._save_mapping(checkpoint)
        yield Pipeline((call("delete", key), call("hset", key, mapping=mapping)))

    @staticmethod
    def _save_mapping(checkpoint: Checkpoint) -> dict[str, str]:
        fields = {
            "instanceId": checkpoint.instance_id,
            SEEN_TOKEN: _encode_token(checkpoint.last_seen_token),
            SEEN_AT: _encode_time(checkpoint.last_seen_at),
            PROCESSED_TOKEN: _encode_token(checkpoint.last_processed_token),
            PROCESSED_AT: _encode_time(checkpoint.last_processed_at),
            HEARTBEAT_AT: _encode_time(checkpoint.last_heartbeat_at),
            "metadata": json.dumps(dict(checkpoint.metadata)) if checkpoint.metadata else None,
        }
        if checkpoint.initial_sync is not None:
            fields[INITIAL_SYNC] = json.dumps(plain_progress(checkpoint.initial_sync))
            fields[INITIAL_SYNC_BATCH] = _encode_batch(checkpoint.initial_sync["batch"])
        mapping = {"_v": "1", **{k: v for k, v in fields.items() if v}}
        if checkpoint.instance_id == "":
            mapping["instanceId"] = ""
        return mapping

    def _find_operation(self, stream_name: str) -> Operation[Checkpoint | None]:
        raw = yield call("hgetall", self.key(stream_name))
        return self._to_checkpoint(stream_name, raw)

    def _to_checkpoint(self, stream_name: str, raw: Mapping[bytes, bytes]) -> Checkpoint | None:
        if not raw:
            return None
        instance = raw.get(b"instanceId")
        metadata = raw.get(b"metadata")
        initial_sync = raw.get(INITIAL_SYNC.encode())
        return Checkpoint(
            stream_name=stream_name,
            instance_id=None if instance is None else instance.decode(),
            last_seen_token=_decode_token(raw.get(SEEN_TOKEN.encode())),
            last_seen_at=_decode_time(raw.get(SEEN_AT.encode())),
            last_processed_token=_decode_token(raw.get(PROCESSED_TOKEN.encode())),
            last_processed_at=_decode_time(raw.get(PROCESSED_AT.encode())),
            last_heartbeat_at=_decode_time(raw.get(HEARTBEAT_AT.encode())),
            metadata=json.loads(metadata) if metadata else {},
            initial_sync=json.loads(initial_sync) if initial_sync else None,
        )

    def _delete_operation(self, stream_name: str) -> Operation[None]:
        yield call("delete", self.key(stream_name))

    def _list_checkpoints_operation(self) -> Operation[list[Checkpoint]]:
        prefix = self.key("")
        keys = sorted((yield ScanKeys(_escape_glob(prefix) + "*")))
        records = yield Pipeline(tuple(call("hgetall", key) for key in keys), transaction=False)
        found = (
            self._to_checkpoint(key.decode()[len(prefix) :], raw)
            for key, raw in zip(keys, records, strict=True)
        )
        return [cp for cp in found if cp is not None]

    def _save_seen_operation(self, stream_name: str, *args: Any) -> Operation[None]:
        return self._fields_operation(stream_name, anchor_fields(SEEN_PAIR, stream_name, *args))

    def _save_processed_operation(self, stream_name: str, *args: Any) -> Operation[None]:
        fields = anchor_fields(PROCESSED_PAIR, stream_name, *args)
        return self._fields_operation(stream_name, fields)

    def _save_heartbeat_operation(self, stream_name: str, at: datetime) -> Operation[None]:
        return self._fields_operation(stream_name, heartbeat_fields(stream_name, at))

    def _fields_operation(self, stream_name: str, fields: Mapping[str, Any]) -> Operation[None]:
        """One partial write of these checked ``Checkpoint`` fields."""
        encoded, cleared = _hash_fields(fields)
        key = self.key(stream_name)
        mapping = {"_v": "1", **{k: v for k, v in encoded.items() if v}}
        if not cleared:
            yield call("hset", key, mapping=mapping)
            return
        # HSET cannot store "nothing": clear the missing half in the same MULTI.
        yield Pipeline((call("hset", key, mapping=mapping), call("hdel", key, *cleared)))

    def _reset_after_history_lost_operation(self, stream_name: str, *args: Any) -> Operation[None]:
        arguments = _reset_args(stream_name, *args)
        yield Script(RESET_AFTER_HISTORY_LOST, [self.key(stream_name)], arguments)

    def _save_initial_sync_operation(
        self, stream_name: str, progress: Mapping[str, Any] | None, expected_batch: int | None
    ) -> Operation[bool]:
        args = _initial_sync_args(stream_name, progress, expected_batch)
        return bool((yield Script(SAVE_INITIAL_SYNC, [self.key(stream_name)], args)))

    # -- configuration checks ----------------------------------------------------

    @classmethod
    def check_options(cls, alias: str, options: Mapping[str, Any]) -> list[checks.CheckMessage]:
        return redis_option_checks(store_setting(alias), cls.__name__, options)


# The dead-letter store and lock service of this backend live in their own modules.
from ._redis_dlq import RedisDlqStore as RedisDlqStore  # noqa: E402
from ._redis_locks import RedisLockService as RedisLockService  # noqa: E402
