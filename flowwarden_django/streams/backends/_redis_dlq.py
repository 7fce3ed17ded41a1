"""Dead-letter store on Redis: one hash per entry, native expiry, per-stream indexes.

Keys (prefix ``fw:`` by default):

* ``{prefix}dlq:{id}``: the entry, a hash. Fields ``streamName``,
  ``operationType``, ``status``, ``resolvedBy``, ``note`` (text);
  ``documentKey``, ``fullDocument``, ``resumeToken`` (base64 of the BSON bytes,
  absent for ``None``); ``error`` (JSON ``{type, message, stackTrace}``);
  ``metadata`` (JSON); ``attempts``, ``replayCount`` (integers);
  ``firstAttemptAt``, ``lastAttemptAt``, ``createdAt``, ``expiresAt``,
  ``lastReplayedAt``, ``resolvedAt`` (epoch milliseconds, absent for ``None``).
  With an ``expiresAt``, the key gets ``PEXPIREAT`` at that instant: Redis
  deletes the entry itself, as the reference maps retention natively.
* ``{prefix}dlq:stream:{stream}``: sorted set of the stream's ids by ``createdAt``.
* ``{prefix}dlq:pending:{stream}``: sorted set of the stream's ``PENDING`` ids,
  scored by ``expiresAt`` (``+inf`` for never), so ``count`` drops the expired
  ones with one ``ZREMRANGEBYSCORE`` and then is a ``ZCARD``.
* ``{prefix}dlq:expiry:{stream}``: sorted set of ids by ``expiresAt``, and
  ``{prefix}dlq:index:streams``, the set of stream names: ``purge_expired``
  reads them to clean the indexes of the entries Redis expired.

``save``, the status changes, ``delete`` and the purge are Lua scripts
(``_redis_dlq_scripts``), so each is atomic (a status change is a compare-and-set
on ``status``). Ids whose hash has expired are skipped by ``find_by_stream`` and
removed from its index lazily.
The scripts derive index keys from the prefix: on Redis Cluster, give a prefix
with a hash tag (``"{fw}:"``) so that all keys share one slot. Use a
``noeviction`` memory policy: entries with a TTL are eviction candidates.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core import checks

from ..dlq import DeadLetter, DlqPolicy, ErrorInfo
from ..stores import dlq_stores
from ..tokens import decode_token, encode_token
from ._calls import Operation, call
from ._dlq_common import (
    StatusChange,
    check_aware,
    check_entry,
    check_limit,
)
from ._native_dlq import NativeDlqStore
from ._redis_common import Pipeline, PrefixedRedisConnection, Script, redis_option_checks
from ._redis_dlq_scripts import CHANGE_STATUS, COUNT_PENDING, DELETE, DROP_STALE, PURGE, SAVE

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)

#: How many ids one purge script handles before returning to the client.
PURGE_BATCH = 500
#: How many ids ``find_by_stream`` reads per round trip.
READ_BATCH = 200


def _encode_document(document: Mapping[str, Any] | None) -> str | None:
    data = encode_token(document)
    return None if data is None else base64.b64encode(data).decode("ascii")


def _decode_document(value: bytes | None) -> dict[str, Any] | None:
    return None if value is None else decode_token(base64.b64decode(value))


def epoch_ms(value: datetime) -> int:
    """*value* (timezone-aware) as whole epoch milliseconds, truncated."""
    return (value - _EPOCH) // _MS


def _encode_time(value: datetime | None) -> str | None:
    return None if value is None else str(epoch_ms(value))


def _decode_time(value: bytes | None) -> datetime | None:
    return None if not value else _EPOCH + int(value) * _MS


def _error_json(error: ErrorInfo) -> str:
    return json.dumps(
        {"type": error.type, "message": error.message, "stackTrace": error.stack_trace}
    )


def _fields(entry: DeadLetter) -> dict[str, str]:
    fields = {
        "streamName": entry.stream_name,
        "operationType": entry.operation_type,
        "documentKey": _encode_document(entry.document_key),
        "fullDocument": _encode_document(entry.full_document),
        "resumeToken": _encode_document(entry.resume_token),
        "error": _error_json(entry.error),
        "attempts": str(entry.attempts),
        "status": entry.status,
        "firstAttemptAt": _encode_time(entry.first_attempt_at),
        "lastAttemptAt": _encode_time(entry.last_attempt_at),
        "createdAt": _encode_time(entry.created_at),
        "expiresAt": _encode_time(entry.expires_at),
        "metadata": json.dumps(dict(entry.metadata)),
        "replayCount": str(entry.replay_count),
        "lastReplayedAt": _encode_time(entry.last_replayed_at),
        "resolvedAt": _encode_time(entry.resolved_at),
        "resolvedBy": entry.resolved_by,
        "note": entry.note,
    }
    return {name: value for name, value in fields.items() if value is not None}


def _entry(entry_id: str, raw: Mapping[bytes, bytes]) -> DeadLetter:
    def text(name: str) -> str:
        return raw.get(name.encode(), b"").decode()

    error = json.loads(raw[b"error"])
    return DeadLetter(
        id=entry_id,
        stream_name=text("streamName"),
        operation_type=text("operationType"),
        document_key=_decode_document(raw.get(b"documentKey")),
        full_document=_decode_document(raw.get(b"fullDocument")),
        resume_token=_decode_document(raw.get(b"resumeToken")),
        error=ErrorInfo(error["type"], error["message"], error.get("stackTrace")),
        attempts=int(raw.get(b"attempts", 0)),
        status=text("status"),
        first_attempt_at=_decode_time(raw.get(b"firstAttemptAt")),
        last_attempt_at=_decode_time(raw.get(b"lastAttemptAt")),
        created_at=_decode_time(raw.get(b"createdAt")),
        expires_at=_decode_time(raw.get(b"expiresAt")),
        metadata=json.loads(raw.get(b"metadata") or b"{}"),
        replay_count=int(raw.get(b"replayCount", 0)),
        last_replayed_at=_decode_time(raw.get(b"lastReplayedAt")),
        resolved_at=_decode_time(raw.get(b"resolvedAt")),
        resolved_by=text("resolvedBy"),
        note=text("note"),
    )


def _valid_id(entry_id: Any) -> bool:
    """Whether *entry_id* can name an entry (others are never found)."""
    return isinstance(entry_id, str) and bool(entry_id) and ":" not in entry_id


def _sort_batch(
    stream_name: str,
    status: str | None,
    limit: int | None,
    ids: Sequence[bytes],
    records: Sequence[Mapping[bytes, bytes]],
    found: list[DeadLetter],
    stale: list[bytes],
) -> None:
    """Add to *found* the entries of one ``find_by_stream`` batch that match (up to
    *limit* in all), and to *stale* the ids with no hash of this stream."""
    for entry_id, raw in zip(ids, records, strict=True):
        if not raw or raw.get(b"streamName") != stream_name.encode():
            stale.append(entry_id)
            continue
        if status is not None and raw.get(b"status") != status.encode():
            continue
        found.append(_entry(entry_id.decode(), raw))
        if limit is not None and len(found) == limit:
            break


class RedisDlqStore(PrefixedRedisConnection, NativeDlqStore):
    """Stores dead letters in Redis hashes that expire natively (see the module docs).

    Connect like ``RedisCheckpointStore``: a django-redis cache alias
    (``cache="default"``, the default), a ``url`` such as
    ``redis://127.0.0.1:6379/0``, or a ready ``client``. Timestamps keep
    millisecond precision. Entry ids must not contain ``":"`` (index keys do).
    """

    # -- keys --------------------------------------------------------------------

    def key(self, entry_id: str) -> str:
        """The hash key of one entry."""
        return f"{self.key_prefix}dlq:{entry_id}"

    def stream_key(self, stream_name: str) -> str:
        """The sorted set of a stream's entry ids, by creation time."""
        return f"{self.key_prefix}dlq:stream:{stream_name}"

    def pending_key(self, stream_name: str) -> str:
        """The sorted set of a stream's pending ids, by expiry time."""
        return f"{self.key_prefix}dlq:pending:{stream_name}"

    def expiry_key(self, stream_name: str) -> str:
        """The sorted set of a stream's ids that expire, by expiry time."""
        return f"{self.key_prefix}dlq:expiry:{stream_name}"

    def streams_key(self) -> str:
        """The set of stream names that have (or had) entries."""
        return f"{self.key_prefix}dlq:index:streams"

    # -- the keys and arguments of the scripts ---------------------------------------

    def _save_call(self, entry: DeadLetter) -> tuple[list[str], list[Any]]:
        """The keys and arguments of :data:`SAVE`, after the entry's checks."""
        check_entry(entry)
        if ":" in entry.id:
            raise ValueError(f"RedisDlqStore entry ids cannot contain ':' ({entry.id!r})")
        fields = _fields(entry)
        pairs = [item for pair in fields.items() for item in pair]
        stream = entry.stream_name
        keys = [
            self.key(entry.id),
            self.stream_key(stream),
            self.pending_key(stream),
            self.expiry_key(stream),
            self.streams_key(),
        ]
        args = [
            self.key_prefix,
            entry.id,
            stream,
            fields["createdAt"],
            fields.get("expiresAt", ""),
            entry.status,
            *pairs,
        ]
        return keys, args

    def _purge_call(self, now: datetime) -> tuple[list[str], list[Any]]:
        """The keys and arguments of one :data:`PURGE` batch."""
        return [self.streams_key()], [self.key_prefix, epoch_ms(now), PURGE_BATCH]

    # -- the store operations, each run by the sync and the async API --------------

    def _save_operation(self, entry: DeadLetter, policy: DlqPolicy) -> Operation[None]:
        keys, args = self._save_call(entry)
        yield Script(SAVE, keys, args)

    def _find_by_id_operation(self, entry_id: str) -> Operation[DeadLetter | None]:
        if not _valid_id(entry_id):
            return None
        raw = yield call("hgetall", self.key(entry_id))
        return _entry(entry_id, raw) if raw else None

    def _find_by_stream_operation(
        self, stream_name: str, status: str | None, limit: int | None
    ) -> Operation[list[DeadLetter]]:
        check_limit(limit)
        found: list[DeadLetter] = []
        stale: list[bytes] = []
        stream_key = self.stream_key(stream_name)
        start = 0
        while limit is None or len(found) < limit:
            ids = yield call("zrevrange", stream_key, start, start + READ_BATCH - 1)
            if not ids:
                break
            start += len(ids)
            reads = tuple(call("hgetall", self.key(entry_id.decode())) for entry_id in ids)
            records = yield Pipeline(reads, transaction=False)
            _sort_batch(stream_name, status, limit, ids, records, found, stale)
        if stale:
            yield Script(DROP_STALE, [stream_key], [self.key_prefix, stream_name, *stale])
        return found

    def _count_operation(self, stream_name: str) -> Operation[int]:
        return int((yield Script(COUNT_PENDING, [self.pending_key(stream_name)])))

    def _change_status(self, change: StatusChange) -> Operation[bool]:
        """:data:`CHANGE_STATUS` on the entry (never found when its id cannot name
        one): whether it changed."""
        if ":" in change.entry_id:
            return False
        fields = change.document_fields(lambda at: str(epoch_ms(at)), _error_json)
        pairs = [item for pair in fields.items() for item in pair]
        flag = "0" if change.replayed is None else "1"
        allowed = change.allowed
        args = [self.key_prefix, change.entry_id, change.status, flag, len(allowed), *allowed]
        return (yield Script(CHANGE_STATUS, [self.key(change.entry_id)], [*args, *pairs])) == 1

    def _purge_expired_operation(self, now: datetime) -> Operation[int]:
        check_aware(now, "now")
        keys, args = self._purge_call(now)
        purged = 0
        while True:
            done, examined = yield Script(PURGE, keys, args)
            purged += int(done)
            if int(examined) < PURGE_BATCH:
                return purged

    def _delete_operation(self, entry_id: str) -> Operation[None]:
        if ":" in entry_id:
            return
        yield Script(DELETE, [self.key(entry_id)], [self.key_prefix, entry_id])

    # -- configuration checks ----------------------------------------------------

    @classmethod
    def check_options(cls, alias: str, options: Mapping[str, Any]) -> list[checks.CheckMessage]:
        return redis_option_checks(dlq_stores.alias_setting(alias), cls.__name__, options)
