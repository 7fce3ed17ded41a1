"""Dead-letter store on the Django database, through the ``DeadLetter`` model.

``save`` is one upsert statement (``INSERT … ON CONFLICT DO UPDATE``, or ``… ON
DUPLICATE KEY UPDATE`` on MySQL/MariaDB, through ``bulk_create``), so two saves of
one id never collide. Each status change is ONE conditional ``UPDATE … WHERE id =
… AND status IN (…)``: the database decides which of two racing claims matches,
so exactly one wins. Called inside ``transaction.atomic()`` on the same database,
the writes join the caller's transaction.

BSON documents are stored as their BSON bytes, so they come back with their types.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.core import checks
from django.db import connections
from django.db.models import F

from ...models import DeadLetter as DeadLetterRow
from ..checkpoint import as_utc
from ..dlq import PENDING, DeadLetter, DlqPolicy, ErrorInfo
from ..stores import dlq_stores
from ..tokens import decode_token, encode_token
from ._dlq_common import (
    BSON_FIELDS,
    CompareAndSetDlqStore,
    StatusChange,
    check_aware,
    check_entry,
    check_limit,
)
from ._extras import check_using
from ._orm_common import OnDatabase

#: Every column but the primary key: what a second save of one id overwrites.
_UPDATE_FIELDS = [
    field.name for field in DeadLetterRow._meta.concrete_fields if not field.primary_key
]


#: The fields a row keeps as they are, and the timestamps (read back in UTC); the BSON
#: documents (``BSON_FIELDS``) are kept as their bytes, the error in three columns.
_PLAIN = (
    "id",
    "stream_name",
    "operation_type",
    "attempts",
    "status",
    "replay_count",
    "resolved_by",
    "note",
)
_TIMES = (
    "first_attempt_at",
    "last_attempt_at",
    "created_at",
    "expires_at",
    "last_replayed_at",
    "resolved_at",
)


def _row(entry: DeadLetter) -> DeadLetterRow:
    values = {name: getattr(entry, name) for name in (*_PLAIN, *_TIMES)}
    documents = {name: encode_token(getattr(entry, name)) for name in BSON_FIELDS}
    error = entry.error
    return DeadLetterRow(
        **values,
        **documents,
        error_type=error.type,
        error_message=error.message,
        stack_trace=error.stack_trace,
        metadata=dict(entry.metadata),
    )


def _entry(row: DeadLetterRow) -> DeadLetter:
    values = {name: getattr(row, name) for name in _PLAIN}
    times = {name: as_utc(getattr(row, name)) for name in _TIMES}
    documents = {name: decode_token(getattr(row, name)) for name in BSON_FIELDS}
    error = ErrorInfo(row.error_type, row.error_message, row.stack_trace)
    return DeadLetter(**values, **times, **documents, error=error, metadata=row.metadata or {})


class OrmDlqStore(OnDatabase, CompareAndSetDlqStore):
    """Stores dead letters in the ``DeadLetter`` table of a Django database.

    ``using`` pins a database alias; by default the router's ``db_for_write``
    chooses, for reads too (a status read from a lagging replica could show an
    entry as still pending after it was claimed). Supported on PostgreSQL,
    SQLite and MySQL/MariaDB. Nothing expires by itself: ``purge_expired`` (the
    ``flowwarden`` purge operation) deletes rows past their ``expires_at``.
    """

    _model = DeadLetterRow

    def _rows(self) -> Any:
        return DeadLetterRow.objects.using(self._alias())

    # -- the SPI -----------------------------------------------------------------

    def save(self, entry: DeadLetter, policy: DlqPolicy) -> None:
        check_entry(entry)
        alias = self._alias()
        with_target = connections[alias].features.supports_update_conflicts_with_target
        DeadLetterRow.objects.using(alias).bulk_create(
            [_row(entry)],
            update_conflicts=True,
            unique_fields=["id"] if with_target else None,
            update_fields=_UPDATE_FIELDS,
        )

    def find_by_id(self, entry_id: str) -> DeadLetter | None:
        row = self._rows().filter(pk=entry_id).first()
        return None if row is None else _entry(row)

    def find_by_stream(
        self, stream_name: str, *, status: str | None = None, limit: int | None = None
    ) -> list[DeadLetter]:
        check_limit(limit)
        rows = self._rows().filter(stream_name=stream_name)
        if status is not None:
            rows = rows.filter(status=status)
        rows = rows.order_by("-created_at", "id")
        if limit is not None:
            rows = rows[:limit]
        return [_entry(row) for row in rows]

    def count(self, stream_name: str) -> int:
        return self._rows().filter(stream_name=stream_name, status=PENDING).count()

    def _change_status(self, change: StatusChange) -> bool:
        columns = {"status": change.status, **change.changes}
        error = columns.pop("error", None)
        if error is not None:
            columns.update(
                error_type=error.type, error_message=error.message, stack_trace=error.stack_trace
            )
        if change.replayed is not None:
            columns.update(replay_count=F("replay_count") + 1, last_replayed_at=change.replayed)
        rows = self._rows().filter(pk=change.entry_id, status__in=change.allowed)
        return rows.update(**columns) == 1

    def purge_expired(self, now: datetime) -> int:
        check_aware(now, "now")
        deleted, _ = self._rows().filter(expires_at__lt=now).delete()
        return deleted

    def delete(self, entry_id: str) -> None:
        self._rows().filter(pk=entry_id).delete()

    # -- configuration checks ----------------------------------------------------

    @classmethod
    def check_options(cls, alias: str, options: Mapping[str, Any]) -> list[checks.CheckMessage]:
        def supports(connection: Any) -> bool:
            return connection.features.supports_update_conflicts

        setting, needs = dlq_stores.alias_setting(alias), " (it needs INSERT … ON CONFLICT)"
        return check_using(setting, options, supports, "OrmDlqStore", "DLQ backend", needs)
