"""Checkpoint store on the Django database, through the ``StreamCheckpoint`` model.

Every partial operation and the guarded reset is ONE SQL statement, an upsert
(``INSERT … ON CONFLICT DO UPDATE`` on PostgreSQL and SQLite, ``INSERT … ON
DUPLICATE KEY UPDATE`` on MySQL/MariaDB) that sets only its own columns: no read
first, no explicit transaction. Called inside ``transaction.atomic()`` on the same
database, the write joins the caller's transaction (transactional handlers).

``save_initial_sync`` is a conditional ``UPDATE … WHERE stream_name = %s AND
initial_sync_batch = %s`` (``IS NULL`` when no progress is expected); only when
that changes no row and no progress is expected, an ``INSERT … ON CONFLICT DO
NOTHING`` (``INSERT IGNORE`` on MySQL/MariaDB) creates the record. Should that
insert find the record created meanwhile by another writer, the ``UPDATE`` is run
once more: on an existing row its answer is final. Each statement is atomic and
the one that decides is the linearization point; the same rules as above apply
to transactions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from django.core import checks

from ...common.sql import KEPT_CURSOR, QUOTES, kept_cursor
from ...models import StreamCheckpoint, StreamSettledEvent
from ..checkpoint import (
    Checkpoint,
    CheckpointStore,
    as_utc,
    plain_progress,
    progress_batch,
)
from ..stores import store_setting
from ..tokens import Token, decode_token, encode_token
from ._extras import check_using
from ._orm_common import OnDatabase

#: Null-safe equality per database vendor: true when both sides are NULL or equal.
NULL_SAFE_EQUALS = {"postgresql": "IS NOT DISTINCT FROM", "sqlite": "IS", "mysql": "<=>"}

_PK = "stream_name"
_SEEN = ("last_seen_token", "last_seen_at")
_PROCESSED = ("last_processed_token", "last_processed_at")
_HEARTBEAT = ("last_heartbeat_at",)
_INITIAL_SYNC = ("initial_sync", "initial_sync_batch")
_ALL = ("instance_id", *_SEEN, *_PROCESSED, *_HEARTBEAT, "metadata", *_INITIAL_SYNC)
_JSON_COLUMNS = frozenset({"metadata", "initial_sync"})
_TOKEN_COLUMNS = frozenset({"last_seen_token", "last_processed_token"})


@lru_cache(maxsize=64)
def _upsert_sql(vendor: str, insert: tuple[str, ...], update: tuple[str, ...], guard: bool) -> str:
    """Build one upsert statement for *vendor*.

    ``insert`` columns get one placeholder each; on conflict the ``update``
    columns take the inserted values. With ``guard``, the processed pair is
    cleared only while the stored processed token equals one more parameter,
    passed twice.
    """
    quote = QUOTES[vendor]
    table = quote(StreamCheckpoint._meta.db_table)
    columns = ", ".join(quote(c) for c in (_PK, *insert))
    values = ", ".join(["%s"] * (1 + len(insert)))
    sql = f"INSERT INTO {table} ({columns}) VALUES ({values}) "
    if vendor == "mysql":
        sql += "ON DUPLICATE KEY UPDATE "
        assignments = [f"{quote(c)} = VALUES({quote(c)})" for c in update]
        current = ""
    else:
        sql += f"ON CONFLICT ({quote(_PK)}) DO UPDATE SET "
        assignments = [f"{quote(c)} = EXCLUDED.{quote(c)}" for c in update]
        current = f"{table}."
    if guard:
        equals = NULL_SAFE_EQUALS[vendor]
        token, at = (quote(c) for c in _PROCESSED)
        # The timestamp goes first: MySQL evaluates assignments left to right and
        # would otherwise compare against the token it has just cleared.
        for column in (at, token):
            assignments.append(
                f"{column} = CASE WHEN {current}{token} {equals} %s "
                f"THEN NULL ELSE {current}{column} END"
            )
    return sql + ", ".join(assignments)


@lru_cache(maxsize=8)
def _initial_sync_sql(vendor: str) -> tuple[str, str, str]:
    """The statements of ``save_initial_sync`` for *vendor*: the conditional UPDATE
    when no progress is expected, the one when a batch is expected, and the INSERT
    that creates a missing record (and does nothing when the record exists)."""
    quote = QUOTES[vendor]
    table = quote(StreamCheckpoint._meta.db_table)
    progress, batch = (quote(c) for c in _INITIAL_SYNC)
    update = f"UPDATE {table} SET {progress} = %s, {batch} = %s WHERE {quote(_PK)} = %s AND "
    columns = ", ".join(quote(c) for c in (_PK, *_INITIAL_SYNC, "metadata"))
    values = f"({columns}) VALUES (%s, %s, %s, %s)"
    if vendor == "mysql":
        # IGNORE also turns some other errors into warnings; every value inserted
        # here was validated first (name length, a 64-bit batch, JSON text).
        insert = f"INSERT IGNORE INTO {table} {values}"
    else:
        insert = f"INSERT INTO {table} {values} ON CONFLICT ({quote(_PK)}) DO NOTHING"
    return update + f"{batch} IS NULL", update + f"{batch} = %s", insert


def _adapt(ops: Any, column: str, value: Any) -> Any:
    """A column value as the database driver takes it.

    What the model fields' ``get_db_prep_save`` would return, without their
    generic work on the hot path: tokens are already BSON bytes, text is text.
    """
    if value is None:
        return None
    if column.endswith("_at"):
        return ops.adapt_datetimefield_value(value)
    if column in _JSON_COLUMNS:
        return ops.adapt_json_value(value, None)
    return value


class OrmCheckpointStore(OnDatabase, CheckpointStore):
    """Stores checkpoints in the ``StreamCheckpoint`` table of a Django database.

    ``using`` pins a database alias; by default the router's ``db_for_write``
    chooses, for reads too: a checkpoint read from a lagging replica could bring
    back an expired anchor. Supported on PostgreSQL, SQLite and MySQL/MariaDB.
    """

    supports_listing = True
    _model = StreamCheckpoint
    _vendors = NULL_SAFE_EQUALS

    # -- helpers -----------------------------------------------------------------

    def _execute(
        self,
        stream_name: str,
        values: Mapping[str, Any],
        update: Sequence[str],
        guard: tuple[Token | None] | None = None,
    ) -> None:
        connection = self._connection()
        sql = _upsert_sql(connection.vendor, tuple(values), tuple(update), guard is not None)
        ops = connection.ops
        params = [stream_name]
        for column, value in values.items():
            params.append(_adapt(ops, column, value))
        if guard is not None:
            expected = encode_token(guard[0])
            params += [expected, expected]
        _run(connection, sql, params)

    def _to_checkpoint(self, row: StreamCheckpoint) -> Checkpoint:
        return Checkpoint(
            stream_name=row.stream_name,
            instance_id=row.instance_id,
            last_seen_token=decode_token(row.last_seen_token),
            last_seen_at=as_utc(row.last_seen_at),
            last_processed_token=decode_token(row.last_processed_token),
            last_processed_at=as_utc(row.last_processed_at),
            last_heartbeat_at=as_utc(row.last_heartbeat_at),
            metadata=row.metadata or {},
            initial_sync=row.initial_sync,
        )

    # -- the SPI -----------------------------------------------------------------

    def save(self, checkpoint: Checkpoint) -> None:
        values = {
            "instance_id": checkpoint.instance_id,
            "last_seen_token": encode_token(checkpoint.last_seen_token),
            "last_seen_at": checkpoint.last_seen_at,
            "last_processed_token": encode_token(checkpoint.last_processed_token),
            "last_processed_at": checkpoint.last_processed_at,
            "last_heartbeat_at": checkpoint.last_heartbeat_at,
            "metadata": dict(checkpoint.metadata),
            "initial_sync": plain_progress(checkpoint.initial_sync),
            "initial_sync_batch": progress_batch(checkpoint.initial_sync),
        }
        self._execute(checkpoint.stream_name, values, _ALL)

    def find(self, stream_name: str) -> Checkpoint | None:
        row = StreamCheckpoint.objects.using(self._alias()).filter(pk=stream_name).first()
        return None if row is None else self._to_checkpoint(row)

    def delete(self, stream_name: str) -> None:
        alias = self._alias()
        StreamCheckpoint.objects.using(alias).filter(pk=stream_name).delete()
        StreamSettledEvent.objects.using(alias).filter(stream_name=stream_name).delete()

    # -- settled marks (a transactional stream handled in parallel) --------------

    def mark_settled(self, stream_name: str, digest: str) -> None:
        """Record that the event of *digest* committed (in the caller's transaction)."""
        StreamSettledEvent.objects.using(self._alias()).create(
            stream_name=stream_name, event_digest=digest
        )

    def settled_marks(self, stream_name: str) -> set[str]:
        """The digests of the events of *stream_name* marked settled."""
        rows = StreamSettledEvent.objects.using(self._alias()).filter(stream_name=stream_name)
        return set(rows.values_list("event_digest", flat=True))

    def is_settled(self, stream_name: str, digest: str) -> bool:
        """Whether the event of *digest* is marked settled."""
        rows = StreamSettledEvent.objects.using(self._alias())
        return rows.filter(stream_name=stream_name, event_digest=digest).exists()

    def forget_settled(self, stream_name: str, digests: Sequence[str]) -> None:
        """Delete the marks of *digests* (the anchor has passed their events)."""
        rows = StreamSettledEvent.objects.using(self._alias())
        for start in range(0, len(digests), 500):
            chunk = digests[start : start + 500]
            rows.filter(stream_name=stream_name, event_digest__in=chunk).delete()

    def list_checkpoints(self) -> list[Checkpoint]:
        rows = StreamCheckpoint.objects.using(self._alias()).order_by("stream_name")
        return [self._to_checkpoint(row) for row in rows]

    # -- the partial writes: each one upsert of its own columns ----------------------

    def _write_fields(
        self,
        stream_name: str,
        fields: dict[str, Any],
        guard: tuple[Token | None] | None = None,
    ) -> None:
        values = {
            column: encode_token(value) if column in _TOKEN_COLUMNS else value
            for column, value in fields.items()
        }
        # Only read when the row is created: the column is NOT NULL.
        values["metadata"] = {}
        self._execute(stream_name, values, tuple(fields), guard)

    def _reset_fields(
        self, stream_name: str, fields: dict[str, Any], expected_dead_processed: Token | None
    ) -> None:
        self._write_fields(stream_name, fields, guard=(expected_dead_processed,))

    def _write_initial_sync(
        self, stream_name: str, stored: dict[str, Any] | None, expected_batch: int | None
    ) -> bool:
        connection = self._connection()
        if_none, if_batch, insert = _initial_sync_sql(connection.vendor)
        values = [_adapt(connection.ops, "initial_sync", stored), progress_batch(stored)]
        if expected_batch is None:
            update, update_params = if_none, [*values, stream_name]
        else:
            update, update_params = if_batch, [*values, stream_name, expected_batch]
        # Django's MySQL backend connects with CLIENT.FOUND_ROWS: rowcount counts the
        # rows matched, so an UPDATE that rewrites the same value still says 1.
        if _run(connection, update, update_params) > 0:
            return True
        if expected_batch is not None:
            return False  # a batch was expected: the record must exist already
        metadata = _adapt(connection.ops, "metadata", {})
        if _run(connection, insert, [stream_name, *values, metadata]) > 0:
            return True
        # Another writer created the record between the two statements: decide on it.
        return _run(connection, update, update_params) > 0

    # -- configuration checks ----------------------------------------------------

    @classmethod
    def check_options(cls, alias: str, options: Mapping[str, Any]) -> list[checks.CheckMessage]:
        def supports(connection: Any) -> bool:
            return connection.vendor in NULL_SAFE_EQUALS

        return check_using(
            store_setting(alias), options, supports, "OrmCheckpointStore", "checkpoint backend"
        )


def _run(connection: Any, sql: str, params: Sequence[Any]) -> int:
    """Execute one statement on *connection*'s kept cursor; return its rowcount."""
    if connection.queries_logged:  # DEBUG or CaptureQueriesContext: a logging cursor
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.rowcount
    cursor = kept_cursor(connection)
    try:
        cursor.execute(sql, params)
    except BaseException:
        connection.__dict__.pop(KEPT_CURSOR, None)
        raise
    return cursor.rowcount


# The dead-letter store and lock service of this backend live in their own modules.
from ._orm_dlq import OrmDlqStore as OrmDlqStore  # noqa: E402
from ._orm_locks import OrmLockService as OrmLockService  # noqa: E402
