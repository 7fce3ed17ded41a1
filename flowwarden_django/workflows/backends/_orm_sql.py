"""The SQL the ORM snapshot store writes itself (PostgreSQL, and SQLite's plain
insert): a snapshot row's columns, the statements of one step (the run's update and
its snapshot's insert; the claim and the seed; the claim and the latest snapshot),
how they run on a connection's kept cursor, and what serializes and retries the
general save (the advisory lock's key, the driver errors worth another attempt)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any, NamedTuple

from django.db import OperationalError

from ...common.sql import kept_cursor
from ...models import SnapshotRecord, WorkflowRun

#: Driver error codes of a transaction worth retrying: MySQL deadlock and lock wait
#: timeout, PostgreSQL deadlock and serialization failure.
_MYSQL_RETRY = (1213, 1205)
_PG_RETRY = ("40P01", "40001")


@lru_cache(maxsize=64)
def advance_sql(run_fields: tuple[str, ...], renew: bool) -> str:
    """PostgreSQL: update the held run, then insert the step's snapshot if it matched."""
    run, snap = WorkflowRun._meta.db_table, SnapshotRecord._meta.db_table
    sets = [f'"{name}" = %s' for name in run_fields]
    if renew:
        sets.append('"claimed_until" = NOW() + make_interval(secs => %s)')
        # A run held on (handed from step to step) moves its updated_at at most once
        # per UPDATED_AT_STEP: the row's indexed columns then stay as they are, so
        # PostgreSQL updates it in place (HOT) instead of adding to its 11 indexes.
        sets.append('"updated_at" = CASE WHEN "updated_at" >= %s THEN "updated_at" ELSE %s END')
    else:
        sets += ["\"runner\" = ''", '"claimed_until" = NULL', '"updated_at" = %s']
    quoted = ", ".join(f'"{c}"' for c in SNAPSHOT_COLUMNS)
    placeholders = ", ".join(["%s"] * len(SNAPSHOT_COLUMNS))
    return (
        f'WITH run AS (UPDATE "{run}" SET {", ".join(sets)} '
        'WHERE "coordination_id" = %s AND "runner" = %s RETURNING 1) '
        f'INSERT INTO "{snap}" ({quoted}) '
        f"SELECT {placeholders} WHERE EXISTS (SELECT 1 FROM run)"
    )


SNAPSHOT_COLUMNS = (
    "id",
    "parent_id",
    "coordination_id",
    "seq",
    "agent_name",
    "state",
    "state_type",
    "metadata",
    "created_at",
)


def snapshot_params(snapshot: Any, columns: dict[str, Any], ops: Any) -> list[Any]:
    """The values of *snapshot*'s row in ``SNAPSHOT_COLUMNS``' order, for raw SQL:
    its keys, and its *columns* as the store writes them (``_columns``); *ops*: the
    connection's ``ops``."""
    return [
        snapshot.id,
        columns["parent_id"],
        snapshot.coordination_id,
        snapshot.seq,
        columns["agent_name"],
        columns["state"],
        columns["state_type"],
        columns["metadata"],
        ops.adapt_datetimefield_value(columns["created_at"]),
    ]


class SnapshotRow(NamedTuple):
    """A snapshot row read with raw SQL (``SNAPSHOT_COLUMNS``), for ``_decode``."""

    id: str
    parent_id: str | None
    coordination_id: str
    seq: int
    agent_name: str | None
    state: str | None
    state_type: str
    metadata: str
    created_at: datetime


@lru_cache(maxsize=1)
def latest_sql() -> str:
    """PostgreSQL: a coordination's row with the highest ``seq``."""
    quoted = ", ".join(f'"{c}"' for c in SNAPSHOT_COLUMNS)
    return (
        f'SELECT {quoted} FROM "{SnapshotRecord._meta.db_table}" '
        'WHERE "coordination_id" = %s ORDER BY "seq" DESC LIMIT 1'
    )


@lru_cache(maxsize=2)
def insert_new_sql(or_nothing: bool = True) -> str:
    """Insert a snapshot; *or_nothing*: unless its id or (coordination, seq) is taken
    (``ON CONFLICT DO NOTHING``, PostgreSQL and SQLite), else failing then."""
    quoted = ", ".join(f'"{c}"' for c in SNAPSHOT_COLUMNS)
    placeholders = ", ".join(["%s"] * len(SNAPSHOT_COLUMNS))
    table = SnapshotRecord._meta.db_table
    conflict = " ON CONFLICT DO NOTHING" if or_nothing else ""
    return f'INSERT INTO "{table}" ({quoted}) VALUES ({placeholders}){conflict}'


def execute(connection: Any, sql: str, params: Sequence[Any]) -> int:
    """Run one statement on the connection's kept cursor (a logging cursor when
    queries are being logged: DEBUG, ``assertNumQueries``); its row count."""
    if connection.queries_logged:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.rowcount
    cursor = kept_cursor(connection)
    cursor.execute(sql, params)
    return cursor.rowcount


def fetch_one(connection: Any, sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
    """Run one query on the connection's kept cursor (see ``execute``); its first row."""
    if connection.queries_logged:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()
    cursor = kept_cursor(connection)
    cursor.execute(sql, params)
    return cursor.fetchone()


@lru_cache(maxsize=4)
def open_run_sql(claim_sql: str) -> str:
    """PostgreSQL: the claim (``RunRecords.claim_statement``) and, for a run it created
    whose coordination has no snapshot, the seed: one statement."""
    table = SnapshotRecord._meta.db_table
    quoted = ", ".join(f'"{c}"' for c in SNAPSHOT_COLUMNS)
    placeholders = ", ".join(["%s"] * len(SNAPSHOT_COLUMNS))
    return (
        f"WITH claimed AS ({claim_sql}), "
        f'seeded AS (INSERT INTO "{table}" ({quoted}) SELECT {placeholders} '
        "WHERE EXISTS (SELECT 1 FROM claimed WHERE created) "
        f'AND NOT EXISTS (SELECT 1 FROM "{table}" WHERE "coordination_id" = %s) '
        "RETURNING 1) "
        "SELECT claimed.*, EXISTS (SELECT 1 FROM seeded) FROM claimed"
    )


@lru_cache(maxsize=16)
def claim_run_sql(claim_sql: str) -> str:
    """PostgreSQL: the claim of an existing run (``RunRecords.claim_statement_for``)
    and the coordination's latest snapshot (none when refused), one statement."""
    table = SnapshotRecord._meta.db_table
    quoted = ", ".join(f'latest."{c}"' for c in SNAPSHOT_COLUMNS)
    inner = ", ".join(f'"{c}"' for c in SNAPSHOT_COLUMNS)
    return (
        f"WITH claimed AS ({claim_sql}) "
        f"SELECT claimed.*, {quoted} FROM claimed LEFT JOIN LATERAL "
        f'(SELECT {inner} FROM "{table}" '
        'WHERE "coordination_id" = claimed."coordination_id" '
        'ORDER BY "seq" DESC LIMIT 1) AS latest ON TRUE'
    )


def retryable(exc: OperationalError) -> bool:
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) in _PG_RETRY:
        return True
    args = getattr(cause, "args", ())
    return bool(args) and args[0] in _MYSQL_RETRY


#: The first key of the two-key PostgreSQL advisory locks this store takes (the second
#: is the coordination's hash). Two-key locks never collide with one-key (bigint) ones.
LOCK_NAMESPACE = 0x46570001


def lock_key(coordination_id: str) -> int:
    """A signed 32-bit advisory-lock key for a coordination."""
    digest = hashlib.blake2b(coordination_id.encode("utf-8"), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)
