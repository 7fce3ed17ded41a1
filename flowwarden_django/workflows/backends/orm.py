"""Snapshot store on the Django database, through the ``SnapshotRecord`` model.

Supported on PostgreSQL, SQLite and MySQL/MariaDB. Each coordination's ``seq`` is
assigned in the save's transaction as the coordination's highest ``seq`` + 1; the
unique ``(coordination_id, seq)`` guarantees that two writers never get the same
one. Writers of one coordination are queued (PostgreSQL: a transaction-scoped
advisory lock on the coordination; MySQL/MariaDB: a locking read of its highest
row; SQLite: ``BEGIN IMMEDIATE``, one writer at a time), and a save that still
collides (or is chosen as a deadlock victim) is retried.

A snapshot saved at an explicit ``seq`` outside a transaction (every workflow step)
is one ``INSERT`` (PostgreSQL, SQLite); only a taken id or seq goes the general way.
For the workflow engine, on PostgreSQL, ``open_run`` and ``save_advancing_run`` write
a step's snapshot and the run's record in one statement, and ``claim_run`` claims a
run and reads its latest snapshot in one.

Called inside the caller's ``transaction.atomic()`` on the same database, every
operation joins that transaction; events are then emitted before it commits.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from importlib.util import find_spec
from typing import Any, NamedTuple

from django.conf import settings
from django.core import checks
from django.db import IntegrityError, OperationalError, connections, router
from django.db.models import Count, Min, Q, QuerySet
from django.utils import timezone

from ...common.sql import kept_cursor
from ...models import SnapshotRecord, WorkflowRun
from ..runs.transactions import write_transaction
from ..storage.encryption import (
    LEGACY_PREFIX,
    AesGcmCipher,
    SnapshotDecryptionError,
    decode_key,
    envelope_version,
    reveal,
)
from ..storage.retention import PruneRow, check_prune_arguments, plan_prune
from ..storage.serializers import StateSerializer, resolve_serializer
from ..storage.snapshot import CheckpointQuery, Loaded, Saved, WorkflowSnapshot, storable_id
from ..storage.store import SnapshotConflictError, SnapshotStore, snapshot_stores
from ._common import (
    check_query,
    check_serializer_option,
    dump_metadata,
    load_metadata,
    unreadable,
)

logger = logging.getLogger("flowwarden_django.workflows")

SUPPORTED_VENDORS = ("postgresql", "sqlite", "mysql")

#: ``list`` order across coordinations (within one: ``seq``).
_ORDER = ("created_at", "coordination_id", "seq")

#: The columns of a listing without states.
_LISTED_COLUMNS = (
    "id",
    "parent_id",
    "coordination_id",
    "seq",
    "agent_name",
    "metadata",
    "created_at",
)

#: Ids per ``DELETE ... WHERE id IN (...)`` statement.
_CHUNK = 500

#: Driver error codes of a transaction worth retrying: MySQL deadlock and lock wait
#: timeout, PostgreSQL deadlock and serialization failure.
_MYSQL_RETRY = (1213, 1205)
_PG_RETRY = ("40P01", "40001")


#: This thread's last ``save_advancing_run``: (store, snapshot, its columns), which
#: ``carry`` of that snapshot, right after, takes instead of serializing it again.
_just_saved = threading.local()

#: How far a held run's ``updated_at`` may lag behind its last step (``_advance_sql``).
UPDATED_AT_STEP = timedelta(seconds=1)


@lru_cache(maxsize=64)
def _advance_sql(run_fields: tuple[str, ...], renew: bool) -> str:
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
    quoted = ", ".join(f'"{c}"' for c in _SNAPSHOT_COLUMNS)
    placeholders = ", ".join(["%s"] * len(_SNAPSHOT_COLUMNS))
    return (
        f'WITH run AS (UPDATE "{run}" SET {", ".join(sets)} '
        'WHERE "coordination_id" = %s AND "runner" = %s RETURNING 1) '
        f'INSERT INTO "{snap}" ({quoted}) '
        f"SELECT {placeholders} WHERE EXISTS (SELECT 1 FROM run)"
    )


_SNAPSHOT_COLUMNS = (
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


class _Row(NamedTuple):
    """A snapshot row read with raw SQL (``_SNAPSHOT_COLUMNS``), for ``_decode``."""

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
def _latest_sql() -> str:
    """PostgreSQL: a coordination's row with the highest ``seq``."""
    quoted = ", ".join(f'"{c}"' for c in _SNAPSHOT_COLUMNS)
    return (
        f'SELECT {quoted} FROM "{SnapshotRecord._meta.db_table}" '
        'WHERE "coordination_id" = %s ORDER BY "seq" DESC LIMIT 1'
    )


@lru_cache(maxsize=2)
def _insert_new_sql(or_nothing: bool = True) -> str:
    """Insert a snapshot; *or_nothing*: unless its id or (coordination, seq) is taken
    (``ON CONFLICT DO NOTHING``, PostgreSQL and SQLite), else failing then."""
    quoted = ", ".join(f'"{c}"' for c in _SNAPSHOT_COLUMNS)
    placeholders = ", ".join(["%s"] * len(_SNAPSHOT_COLUMNS))
    table = SnapshotRecord._meta.db_table
    conflict = " ON CONFLICT DO NOTHING" if or_nothing else ""
    return f'INSERT INTO "{table}" ({quoted}) VALUES ({placeholders}){conflict}'


def _execute(connection: Any, sql: str, params: Sequence[Any]) -> int:
    """Run one statement on the connection's kept cursor (a logging cursor when
    queries are being logged: DEBUG, ``assertNumQueries``); its row count."""
    if connection.queries_logged:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.rowcount
    cursor = kept_cursor(connection)
    cursor.execute(sql, params)
    return cursor.rowcount


def _fetch_one(connection: Any, sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
    """Run one query on the connection's kept cursor (see ``_execute``); its first row."""
    if connection.queries_logged:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()
    cursor = kept_cursor(connection)
    cursor.execute(sql, params)
    return cursor.fetchone()


@lru_cache(maxsize=4)
def _open_run_sql(claim_sql: str) -> str:
    """PostgreSQL: the claim (``RunRecords.claim_statement``) and, for a run it created
    whose coordination has no snapshot, the seed: one statement."""
    table = SnapshotRecord._meta.db_table
    quoted = ", ".join(f'"{c}"' for c in _SNAPSHOT_COLUMNS)
    placeholders = ", ".join(["%s"] * len(_SNAPSHOT_COLUMNS))
    return (
        f"WITH claimed AS ({claim_sql}), "
        f'seeded AS (INSERT INTO "{table}" ({quoted}) SELECT {placeholders} '
        "WHERE EXISTS (SELECT 1 FROM claimed WHERE created) "
        f'AND NOT EXISTS (SELECT 1 FROM "{table}" WHERE "coordination_id" = %s) '
        "RETURNING 1) "
        "SELECT claimed.*, EXISTS (SELECT 1 FROM seeded) FROM claimed"
    )


@lru_cache(maxsize=16)
def _claim_run_sql(claim_sql: str) -> str:
    """PostgreSQL: the claim of an existing run (``RunRecords.claim_statement_for``)
    and the coordination's latest snapshot (none when refused), one statement."""
    table = SnapshotRecord._meta.db_table
    quoted = ", ".join(f'latest."{c}"' for c in _SNAPSHOT_COLUMNS)
    inner = ", ".join(f'"{c}"' for c in _SNAPSHOT_COLUMNS)
    return (
        f"WITH claimed AS ({claim_sql}) "
        f"SELECT claimed.*, {quoted} FROM claimed LEFT JOIN LATERAL "
        f'(SELECT {inner} FROM "{table}" '
        'WHERE "coordination_id" = claimed."coordination_id" '
        'ORDER BY "seq" DESC LIMIT 1) AS latest ON TRUE'
    )


def _retryable(exc: OperationalError) -> bool:
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) in _PG_RETRY:
        return True
    args = getattr(cause, "args", ())
    return bool(args) and args[0] in _MYSQL_RETRY


#: The first key of the two-key PostgreSQL advisory locks this store takes (the second
#: is the coordination's hash). Two-key locks never collide with one-key (bigint) ones.
_LOCK_NAMESPACE = 0x46570001


def _lock_key(coordination_id: str) -> int:
    """A signed 32-bit advisory-lock key for a coordination."""
    digest = hashlib.blake2b(coordination_id.encode("utf-8"), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


#: The ORM store's True/False options: (name, default, the hint for a bad value).
BOOLEAN_OPTIONS = (
    (
        "accept_legacy_envelopes",
        False,
        "False (the default) refuses enc:v1 values until "
        "`manage.py flowwarden_workflows reencrypt` binds them to their run.",
    ),
    (
        "require_encryption",
        True,
        "True (the default) refuses plaintext rows in an encrypting store; "
        "False reads them while you re-save them.",
    ),
)


def _aad(coordination_id: str, snapshot_id: str, column: str, version: int | None = 2) -> bytes:
    """Binds an encrypted value to its coordination, row and column (``enc:v1:``
    values, written before, to their row and column only)."""
    if version == 1:
        return f"flowwarden:snapshot:{snapshot_id}:{column}".encode()
    coordination = f"{len(coordination_id)}:{coordination_id}"
    return f"flowwarden:snapshot:v2:{coordination}:{snapshot_id}:{column}".encode()


def _chunks(ids: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(ids), _CHUNK):
        yield ids[start : start + _CHUNK]


class OrmSnapshotStore(SnapshotStore):
    """Stores snapshots in the ``SnapshotRecord`` table of a Django database.

    ``using`` pins a database alias; by default ``router.db_for_write(SnapshotRecord)``
    chooses, for reads too (a lagging replica could miss the newest step).
    ``serializer`` turns state into text (default ``JsonStateSerializer``; an
    instance, a class or a dotted path). ``encryption_keys`` (one key or a list,
    base64 text of 32 bytes; the first encrypts, all decrypt) turns on AES-256-GCM
    encryption of state and metadata, each value bound to its coordination, row and
    column. With a key, a plaintext row is refused (``SnapshotDecryptionError``)
    unless ``require_encryption=False``, which keeps rows written before encryption
    was turned on readable while they are re-saved. Legacy ``enc:v1:`` values are
    bound to their row and column only, so one moved into another run would still
    decrypt there: they are refused too, unless ``accept_legacy_envelopes=True``, until
    ``manage.py flowwarden_workflows reencrypt`` (``reencrypt_legacy``) binds them to
    their run.

    ``prune`` also keeps the ``head_snapshot_id`` of every ``WorkflowRun`` waiting for
    approval, read from the same database.
    """

    #: How many times one save is tried when concurrent writers collide.
    save_attempts = 30

    def __init__(
        self,
        using: str | None = None,
        serializer: StateSerializer | str | None = None,
        encryption_keys: str | bytes | Sequence[str | bytes] | None = None,
        require_encryption: bool = True,
        accept_legacy_envelopes: bool = False,
    ) -> None:
        super().__init__()
        self.using = using
        self.serializer = resolve_serializer(serializer)
        self.cipher = None if encryption_keys is None else AesGcmCipher.from_keys(encryption_keys)
        #: Whether a plaintext row is refused (only when the store has a key).
        self.require_encryption = bool(require_encryption)
        #: Whether ``enc:v1:`` values (not bound to their run) are read.
        self.accept_legacy_envelopes = bool(accept_legacy_envelopes)

    @property
    def encrypts_at_rest(self) -> bool:  # type: ignore[override]
        """Whether state and metadata are written encrypted."""
        return self.cipher is not None

    # -- the SPI -----------------------------------------------------------------------

    def save(self, snapshot: WorkflowSnapshot) -> WorkflowSnapshot:
        columns = self._columns(snapshot)
        alias = self.using or router.db_for_write(SnapshotRecord)
        connection = connections[alias]
        nested = connection.in_atomic_block
        new = snapshot.seq is not None and not nested
        if new and self._insert_new(connection, snapshot, columns):
            self._emit(Saved, snapshot)
            return snapshot  # stored as it is: a new id at its explicit seq
        attempt = 0
        while True:
            attempt += 1
            try:
                with write_transaction(alias):
                    seq = self._write(alias, snapshot, columns)
                break
            except IntegrityError as exc:
                if snapshot.seq is not None:
                    holder = self._seq_holder(alias, snapshot)
                    if holder is not None:
                        raise self._conflict(snapshot, holder) from exc
                if attempt >= self.save_attempts:
                    raise
            except OperationalError as exc:
                if nested or not _retryable(exc) or attempt >= self.save_attempts:
                    raise
            time.sleep(random.uniform(0, 0.002 * attempt))
        stored = snapshot.replace(seq=seq)
        self._emit(Saved, stored)
        return stored

    def save_advancing_run(
        self,
        snapshot: WorkflowSnapshot,
        *,
        runner: str,
        lease_seconds: float | None,
        run_fields: Mapping[str, Any],
        run_using: str | None = None,
    ) -> WorkflowSnapshot | None:
        """Save a workflow step's snapshot and move its run in ONE statement.

        The run row (``WorkflowRun`` in database *run_using*, by default the router's
        choice, which must be the store's own database) gets *run_fields*, and either a
        renewed lease (``lease_seconds``) or none (``None``: the run is released), but
        only while *runner* holds it; the snapshot is inserted at its explicit ``seq``
        only if that update matched. Returns the stored snapshot; ``None`` when this
        path does not apply (not PostgreSQL, inside a transaction, or the snapshot has
        no ``seq``) and the caller must use ``save`` and its own run update. Raises
        ``SnapshotConflictError`` when the ``seq`` is taken and ``LeaseLostError``
        (from ``workflows.runs``) when the run is no longer held.
        """
        alias = self._alias()
        connection = connections[alias]
        if (
            snapshot.seq is None
            or connection.vendor != "postgresql"
            or connection.in_atomic_block
            or (run_using or router.db_for_write(WorkflowRun)) != alias
        ):
            return None
        from ..runs.records import LeaseLostError

        names = tuple(sorted(run_fields))
        sql = _advance_sql(names, lease_seconds is not None)
        columns = self._columns(snapshot)
        ops = connection.ops
        # resume_input None is SQL NULL, as the ORM writes it (not JSON null).
        run_values = [
            ops.adapt_json_value(run_fields[n], None)
            if n == "resume_input" and run_fields[n] is not None
            else run_fields[n]
            for n in names
        ]
        now = timezone.now()
        if lease_seconds is not None:
            moved = [lease_seconds, ops.adapt_datetimefield_value(now - UPDATED_AT_STEP)]
        else:
            moved = []
        params = [
            *run_values,
            *moved,
            ops.adapt_datetimefield_value(now),
            snapshot.coordination_id,
            runner,
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
        try:
            inserted = _execute(connection, sql, params)
        except IntegrityError as exc:
            holder = self._seq_holder(alias, snapshot)
            if holder is not None:
                raise self._conflict(snapshot, holder) from exc
            raise
        if inserted != 1:
            raise LeaseLostError(snapshot.coordination_id, runner)
        # Only a run held on is carried on (and a finished one's state not kept here).
        _just_saved.entry = None if lease_seconds is None else (self, snapshot, columns)
        self._emit(Saved, snapshot)
        return snapshot

    def open_run(
        self, seed: WorkflowSnapshot, claim: tuple[str, list[Any]], *, run_using: str
    ) -> tuple[tuple[Any, ...] | None, WorkflowSnapshot | None] | None:
        """Start a workflow run's execution in ONE statement: the run's claim and, when
        the claim created the run and its coordination has no snapshot, the *seed*
        (at its explicit ``seq``, 1).

        *claim* is ``RunRecords.claim_statement``'s (or ``create_claimed_statement``'s)
        statement and parameters, for the run records in database *run_using*.
        Returns ``(row, seeded)``: what the claim returned (the run's row; for
        ``create_claimed_statement``, ``claimed_until`` and ``created``), ``None``
        when refused (for ``create_claimed_statement``: the run exists), nothing
        written then; and the seed when it was inserted, else ``None`` (the run
        existed, or snapshots did: read the latest one with ``latest`` now).
        ``None`` when this path does not apply (not PostgreSQL, inside a
        transaction, runs in another database, a seed that cannot be written, a seed
        id taken meanwhile): claim and seed one by one then.
        """
        alias = self.using or router.db_for_write(SnapshotRecord)
        connection = connections[alias]
        if connection.vendor != "postgresql" or connection.in_atomic_block or run_using != alias:
            return None
        try:
            columns = self._columns(seed)
        except Exception:  # the state cannot be written: save() says why, if it must be
            return None
        claim_sql, claim_params = claim
        params = [
            *claim_params,
            seed.id,
            columns["parent_id"],
            seed.coordination_id,
            seed.seq,
            columns["agent_name"],
            columns["state"],
            columns["state_type"],
            columns["metadata"],
            connection.ops.adapt_datetimefield_value(columns["created_at"]),
            seed.coordination_id,
        ]
        try:
            found = _fetch_one(connection, _open_run_sql(claim_sql), params)
        except IntegrityError:  # the seed's id or seq was taken meanwhile
            return None
        if found is None:
            return None, None
        if not found[-1]:
            return found[:-1], None
        self._emit(Saved, seed)
        return found[:-1], seed

    def claim_run(
        self, claim: tuple[str, list[Any]], *, run_using: str
    ) -> tuple[tuple[Any, ...] | None, WorkflowSnapshot | None] | None:
        """Claim an existing workflow run and read its latest snapshot in ONE
        statement (an execution provider's step: claim, then continue from the head).

        *claim* is ``RunRecords.claim_statement_for``'s statement and parameters, for
        the run records in database *run_using*. Returns ``(row, latest)``: the
        claim's row (``None``: refused, nothing was written) and the coordination's
        snapshot with the highest ``seq`` (``None``: it has none). ``None`` when this
        path does not apply (not PostgreSQL, inside a transaction, runs in another
        database): claim, then read, one by one then.
        """
        alias = self.using or router.db_for_write(SnapshotRecord)
        connection = connections[alias]
        if connection.vendor != "postgresql" or connection.in_atomic_block or run_using != alias:
            return None
        claim_sql, claim_params = claim
        found = _fetch_one(connection, _claim_run_sql(claim_sql), claim_params)
        if found is None:
            return None, None
        width = len(_SNAPSHOT_COLUMNS)
        row, snapshot = found[:-width], found[-width:]
        if snapshot[0] is None:  # the coordination has no snapshot
            return row, None
        return row, self._decode(_Row(*snapshot))

    def carry(self, snapshot: WorkflowSnapshot, limit: int) -> dict[str, Any] | None:
        """*snapshot* as this store writes it (state and metadata encrypted when it
        encrypts), as plain JSON data a provider's message can carry to the next step
        (``handoff``); ``None`` when the stored state and metadata exceed *limit*
        characters."""
        entry = getattr(_just_saved, "entry", None)
        if entry is not None and entry[0] is self and entry[1] is snapshot:
            columns = entry[2]  # as the save just wrote them (not serialized again)
        else:
            columns = self._columns(snapshot)
        _just_saved.entry = None
        if len(columns["state"] or "") + len(columns["metadata"] or "") > limit:
            return None
        return {
            "id": snapshot.id,
            "parent_id": columns["parent_id"],
            "seq": snapshot.seq,
            "agent_name": columns["agent_name"],
            "state": columns["state"],
            "state_type": columns["state_type"],
            "metadata": columns["metadata"],
            "created_at": columns["created_at"].isoformat(),
        }

    def uncarry(self, coordination_id: str, carried: Mapping[str, Any]) -> WorkflowSnapshot:
        """The snapshot of run *coordination_id* that ``carry`` made *carried* of,
        read as a row of this store is (an encrypted one is bound to its run)."""
        row = _Row(
            id=carried["id"],
            parent_id=carried["parent_id"],
            coordination_id=coordination_id,
            seq=carried["seq"],
            agent_name=carried["agent_name"],
            state=carried["state"],
            state_type=carried["state_type"],
            metadata=carried["metadata"],
            created_at=datetime.fromisoformat(carried["created_at"]),
        )
        return self._decode(row)

    def load(self, snapshot_id: str) -> WorkflowSnapshot | None:
        snapshot = self._get(snapshot_id)
        if snapshot is not None:
            self._emit(Loaded, snapshot)
        return snapshot

    def _get(self, snapshot_id: str) -> WorkflowSnapshot | None:
        if not storable_id(snapshot_id):  # no row holds it; PostgreSQL refuses a NUL
            return None
        row = self._rows().filter(pk=snapshot_id).first()
        return None if row is None else self._decode(row)

    def list(self, query: CheckpointQuery | None = None) -> list[WorkflowSnapshot]:
        query = check_query(query)
        rows = self._rows()
        if query.coordination_id is not None:
            rows = rows.filter(coordination_id=query.coordination_id)
        if query.coordination_ids is not None and not query.coordination_ids:
            return []
        if query.agent_name is not None:
            rows = rows.filter(agent_name=query.agent_name)
        if query.since is not None:
            rows = rows.filter(created_at__gte=query.since)
        if query.until is not None:
            rows = rows.filter(created_at__lte=query.until)
        # One coordination: by seq alone, never by wall-clock time (CheckpointQuery).
        order = ("seq",) if query.coordination_id is not None else _ORDER
        if query.after is not None:
            rows = rows.filter(_after(query.after, order, query.newest_first))
        if query.newest_first:
            order = tuple(f"-{field}" for field in order)
        if not query.with_state:
            # Listings never read the state column (nor its type).
            rows = rows.only(*_LISTED_COLUMNS)
        if query.coordination_ids is not None:
            rows = _of_coordinations(rows, sorted(query.coordination_ids), order, query.limit)
        else:
            rows = rows.order_by(*order)
            if query.limit:
                rows = rows[: query.limit]
        return [self._decode_listed(row, query.with_state) for row in rows]

    def latest(self, coordination_id: str) -> WorkflowSnapshot | None:
        alias = self._alias()
        connection = connections[alias]
        if connection.vendor == "postgresql":
            # Every run starts here: the query without the ORM's per-call compiling.
            # (PostgreSQL hands back the columns as the ORM would; elsewhere the ORM
            # converts dates.)
            found = _fetch_one(connection, _latest_sql(), [coordination_id])
            return None if found is None else self._decode(_Row(*found))
        row = self._rows(alias).filter(coordination_id=coordination_id).order_by("-seq").first()
        return None if row is None else self._decode(row)

    def delete(self, snapshot_id: str) -> bool:
        alias = self._alias()
        rows = self._rows(alias)
        with write_transaction(alias):
            found = rows.filter(pk=snapshot_id).select_for_update()
            coordination_id = found.values_list("coordination_id", flat=True).first()
            if coordination_id is not None:
                rows.filter(pk=snapshot_id).delete()
        if coordination_id is None:
            return False
        self._emit_deleted([(snapshot_id, coordination_id)])
        return True

    def delete_coordination(self, coordination_id: str) -> int:
        alias = self._alias()
        rows = self._rows(alias)
        with write_transaction(alias):
            found = rows.filter(coordination_id=coordination_id).order_by("seq")
            ids = list(found.select_for_update().values_list("pk", flat=True))
            for chunk in _chunks(ids):
                rows.filter(pk__in=chunk).delete()
        self._emit_deleted((snapshot_id, coordination_id) for snapshot_id in ids)
        return len(ids)

    def prune(
        self,
        keep_last: int | None = None,
        older_than: timedelta | None = None,
        coordination_id: str | None = None,
        *,
        protected_ids: Iterable[str] = (),
    ) -> int:
        check_prune_arguments(keep_last, older_than)
        alias = self._alias()
        rows = self._rows(alias)
        cutoff = timezone.now() - older_than if older_than is not None else None
        protected = set(protected_ids)
        waiting = WorkflowRun.objects.using(alias).filter(status=WorkflowRun.Status.WAITING)
        protected.update(
            waiting.exclude(head_snapshot_id=None).values_list("head_snapshot_id", flat=True)
        )
        removed = 0
        for cid in self._prune_scope(alias, keep_last, cutoff, coordination_id):
            with write_transaction(alias):
                found = rows.filter(coordination_id=cid).select_for_update()
                plan = plan_prune(
                    [
                        PruneRow(*r)
                        for r in found.values_list("pk", "parent_id", "seq", "created_at")
                    ],
                    keep_last=keep_last,
                    cutoff=cutoff,
                    protected=protected,
                )
                for chunk in _chunks(plan):
                    rows.filter(pk__in=chunk).delete()
            self._emit_deleted((snapshot_id, cid) for snapshot_id in plan)
            removed += len(plan)
        return removed

    # -- configuration checks ----------------------------------------------------------

    @classmethod
    def check_options(cls, alias: str, options: Mapping[str, Any]) -> list[checks.CheckMessage]:
        where = f'{snapshot_stores.alias_setting(alias)}["OPTIONS"]'
        messages: list[checks.CheckMessage] = []
        using = options.get("using")
        if using is not None and using not in settings.DATABASES:
            messages.append(
                checks.Error(
                    f'{where}["using"] = {using!r} is not a database alias.',
                    hint=f"Use one of: {', '.join(sorted(settings.DATABASES))}.",
                    id="flowwarden_django.E006",
                )
            )
        elif using is not None and connections[using].vendor not in SUPPORTED_VENDORS:
            messages.append(
                checks.Error(
                    f'{where}["using"] = {using!r} is a {connections[using].vendor} database, '
                    "which OrmSnapshotStore does not support.",
                    hint="Use PostgreSQL, SQLite or MySQL/MariaDB.",
                    id="flowwarden_django.E007",
                )
            )
        if options.get("serializer") is not None:
            messages.extend(check_serializer_option(where, options["serializer"]))
        if options.get("encryption_keys") is not None:
            messages.extend(_check_keys(where, options["encryption_keys"]))
        for name, default, hint in BOOLEAN_OPTIONS:
            value = options.get(name, default)
            if not isinstance(value, bool):
                messages.append(
                    checks.Error(
                        f'{where}["{name}"] = {value!r} is not True or False.',
                        hint=hint,
                        id="flowwarden_django.E008",
                    )
                )
        return messages

    @classmethod
    def check_deploy_options(
        cls, alias: str, options: Mapping[str, Any]
    ) -> list[checks.CheckMessage]:
        """``manage.py check --deploy``: a warning when snapshots are stored in plaintext."""
        if options.get("encryption_keys") is not None:
            return []
        return [
            checks.Warning(
                f"{snapshot_stores.alias_setting(alias)} stores workflow state and metadata "
                "in plaintext.",
                hint='Set its OPTIONS["encryption_keys"] to a list of base64 32-byte keys '
                "(make one with flowwarden_django.workflows.storage.encryption.generate_key()) and "
                'pip install "flowwarden-django[crypto]".',
                id="flowwarden_django.W201",
            )
        ]

    # -- internals ---------------------------------------------------------------------

    def _alias(self) -> str:
        return self.using or router.db_for_write(SnapshotRecord)

    def _rows(self, alias: str | None = None) -> QuerySet[SnapshotRecord]:
        return SnapshotRecord.objects.using(alias or self._alias())

    def _columns(self, snapshot: WorkflowSnapshot) -> dict[str, Any]:
        text, label = self.serializer.dumps(snapshot.state)
        metadata = dump_metadata(snapshot.metadata)
        if self.cipher is not None:
            cid = snapshot.coordination_id
            text = self.cipher.encrypt(text, _aad(cid, snapshot.id, "state"))
            metadata = self.cipher.encrypt(metadata, _aad(cid, snapshot.id, "metadata"))
        return {
            "parent_id": snapshot.parent_id,
            "coordination_id": snapshot.coordination_id,
            "agent_name": snapshot.agent_name,
            "state": text,
            "state_type": label[:255],
            "metadata": metadata,
            "created_at": snapshot.created_at,
        }

    def _reveal(self, row: SnapshotRecord | _Row, column: str) -> str | None:
        text = getattr(row, column)
        version = envelope_version(text)
        if version == 1 and not self.accept_legacy_envelopes:
            raise SnapshotDecryptionError(
                f"snapshot {row.id} holds a legacy enc:v1 {column}, which is not bound to "
                "its run; run `manage.py flowwarden_workflows reencrypt` once to bind it"
            )
        aad = _aad(row.coordination_id, row.id, column, version)
        return reveal(text, self.cipher, aad, require_encryption=self.require_encryption)

    def reencrypt_legacy(self, *, batch_size: int = 500) -> Iterator[int]:
        """Re-encrypt every ``enc:v1:`` value as ``enc:v2:``, bound to the run its row
        is in now; yields how many rows each batch rewrote. Each row is rewritten by
        one conditional ``UPDATE`` (only while it still holds what was read), so it is
        safe to run beside a live store and to run again."""
        if self.cipher is None:
            raise ValueError("this store has no encryption key: nothing to re-encrypt")
        legacy = Q(state__startswith=LEGACY_PREFIX) | Q(metadata__startswith=LEGACY_PREFIX)
        after = ""
        while True:
            rows = list(
                self._rows()
                .filter(legacy, id__gt=after)
                .order_by("id")
                .values_list("id", "coordination_id", "state", "metadata")[:batch_size]
            )
            if not rows:
                return
            done = 0
            for snapshot_id, cid, state, metadata in rows:
                fresh = {
                    column: self._rebind(cid, snapshot_id, column, text)
                    for column, text in (("state", state), ("metadata", metadata))
                }
                done += (
                    self._rows()
                    .filter(id=snapshot_id, state=state, metadata=metadata)
                    .update(**fresh)
                )
            after = rows[-1][0]
            yield done

    def _rebind(self, cid: str, snapshot_id: str, column: str, text: str | None) -> str | None:
        if envelope_version(text) != 1:
            return text
        plain = self.cipher.decrypt(text, _aad(cid, snapshot_id, column, 1))
        return self.cipher.encrypt(plain, _aad(cid, snapshot_id, column))

    def _decode_listed(self, row: SnapshotRecord, with_state: bool) -> WorkflowSnapshot:
        try:
            return self._decode(row, with_state)
        except Exception as exc:  # one bad row must not fail the listing
            return unreadable(row, exc)

    def _decode(self, row: SnapshotRecord | _Row, with_state: bool = True) -> WorkflowSnapshot:
        state = None
        if with_state:
            text = self._reveal(row, "state")
            state = None if text is None else self.serializer.loads(text, row.state_type)
        metadata = self._reveal(row, "metadata")
        return WorkflowSnapshot(
            id=row.id,
            coordination_id=row.coordination_id,
            state=state,
            parent_id=row.parent_id,
            agent_name=row.agent_name,
            seq=row.seq,
            metadata=load_metadata(metadata),
            created_at=row.created_at,
        )

    def _write(self, alias: str, snapshot: WorkflowSnapshot, columns: dict[str, Any]) -> int:
        """One attempt of ``save``, inside its transaction; returns the ``seq``."""
        rows = self._rows(alias)
        cid = snapshot.coordination_id
        connection = connections[alias]
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(%s, %s)", [_LOCK_NAMESPACE, _lock_key(cid)]
                )
        existing = rows.filter(pk=snapshot.id).values_list("coordination_id", "seq").first()
        if snapshot.seq is not None:
            seq = snapshot.seq
            holder = self._seq_holder(alias, snapshot)
            if holder is not None:
                raise self._conflict(snapshot, holder)
        elif existing is not None and existing[0] == cid:
            seq = existing[1]
        else:
            highest = rows.filter(coordination_id=cid).order_by("-seq").select_for_update()
            seq = (highest.values_list("seq", flat=True).first() or 0) + 1
        if existing is None or not rows.filter(pk=snapshot.id).update(seq=seq, **columns):
            rows.create(id=snapshot.id, seq=seq, **columns)
        return seq

    def _insert_new(
        self, connection: Any, snapshot: WorkflowSnapshot, columns: dict[str, Any]
    ) -> bool:
        """The common case in one statement, outside a transaction: a new snapshot
        at an explicit ``seq`` (every workflow step), inserted unless its id or its
        seq is taken. False when it does not apply (MySQL) or was not inserted:
        ``save``'s general path then replaces the same id or reports the conflict.

        On PostgreSQL in autocommit a plain ``INSERT``, whose unique-violation error
        stands for "taken" (the statement was its own transaction: nothing else is
        undone): ``ON CONFLICT DO NOTHING`` makes every insert a speculative one,
        which costs more than the rare conflict's error."""
        vendor = connection.vendor
        if vendor != "postgresql" and vendor != "sqlite":
            return False
        params = [
            snapshot.id,
            columns["parent_id"],
            snapshot.coordination_id,
            snapshot.seq,
            columns["agent_name"],
            columns["state"],
            columns["state_type"],
            columns["metadata"],
            connection.ops.adapt_datetimefield_value(columns["created_at"]),
        ]
        if vendor == "postgresql" and connection.autocommit:
            try:
                return _execute(connection, _insert_new_sql(or_nothing=False), params) == 1
            except IntegrityError:
                return False
        return _execute(connection, _insert_new_sql(), params) == 1

    def _seq_holder(self, alias: str, snapshot: WorkflowSnapshot) -> str | None:
        """The id of another snapshot at *snapshot*'s coordination and seq, if any."""
        taken = self._rows(alias).filter(coordination_id=snapshot.coordination_id, seq=snapshot.seq)
        return taken.exclude(pk=snapshot.id).values_list("pk", flat=True).first()

    @staticmethod
    def _conflict(snapshot: WorkflowSnapshot, holder: str) -> SnapshotConflictError:
        return SnapshotConflictError(
            f"coordination {snapshot.coordination_id!r} already has snapshot {holder!r} "
            f"at seq {snapshot.seq}"
        )

    def _prune_scope(
        self,
        alias: str,
        keep_last: int | None,
        cutoff: Any,
        coordination_id: str | None,
    ) -> Iterator[str]:
        """Coordinations with something prune might remove, a page at a time."""
        rows = self._rows(alias)
        if coordination_id is not None:
            rows = rows.filter(coordination_id=coordination_id)
        last = None
        while True:
            page = rows if last is None else rows.filter(coordination_id__gt=last)
            groups = page.values("coordination_id").annotate(
                n=Count("pk"), oldest=Min("created_at")
            )
            groups = groups.filter(n__gt=keep_last or 1)
            if cutoff is not None:
                groups = groups.filter(oldest__lt=cutoff)
            batch = [g["coordination_id"] for g in groups.order_by("coordination_id")[:_CHUNK]]
            yield from batch
            if len(batch) < _CHUNK:
                return
            last = batch[-1]


def _after(mark: WorkflowSnapshot, order: Sequence[str], newest_first: bool) -> Q:
    """Rows after *mark* in the (ascending or descending) *order* of its fields.

    With more than one field, the first one is also bounded on its own (``created_at
    <= mark``): a condition the database can seek the index to, where the ``OR`` of
    the ties alone would make it scan every row before the mark (a deep page).
    """
    op = "lt" if newest_first else "gt"
    condition = Q()
    for index, field in enumerate(order):
        ties = {name: getattr(mark, name) for name in order[:index]}
        condition |= Q(**ties, **{f"{field}__{op}": getattr(mark, field)})
    if len(order) > 1:
        condition &= Q(**{f"{order[0]}__{op}e": getattr(mark, order[0])})
    return condition


#: The most coordinations ``list`` reads as one sub-select each (see ``_of_coordinations``).
_PER_COORDINATION_MAX = 100


def _of_coordinations(
    rows: QuerySet[SnapshotRecord], ids: Sequence[str], order: Sequence[str], limit: int
) -> QuerySet[SnapshotRecord]:
    """*rows* of the coordinations *ids*, in *order*, at most *limit* (0: all).

    A page of a few coordinations (a user who may read some runs) is read as one
    sub-select per coordination, each stopping after *limit* rows of the
    ``(coordination_id, created_at, seq)`` index, merged in *order*: what it costs
    does not depend on where those runs sit among the others, as it would with one
    ``IN`` filter, which the database may answer by scanning the whole table in
    *order* until enough rows of the few coordinations turn up. SQLite cannot limit
    the parts of a ``UNION``; there, and for many coordinations, it is one ``IN``.
    """
    features = connections[rows.db].features
    if (
        limit
        and len(ids) <= _PER_COORDINATION_MAX
        and features.supports_slicing_ordering_in_compound
    ):
        # An IN of one value is planned as "=" (the run's index range).
        parts = [rows.filter(coordination_id__in=[cid]).order_by(*order)[:limit] for cid in ids]
        if len(parts) == 1:
            return parts[0]
        return parts[0].union(*parts[1:], all=True).order_by(*order)[:limit]
    rows = rows.filter(coordination_id__in=ids).order_by(*order)
    return rows[:limit] if limit else rows


def _check_keys(where: str, keys: Any) -> list[checks.CheckMessage]:
    setting = f'{where}["encryption_keys"]'
    if isinstance(keys, str | bytes | bytearray):
        keys = [keys]
    if not isinstance(keys, list | tuple) or not keys:
        return [
            checks.Error(
                f"{setting} must be a key or a non-empty list of keys.",
                hint="Leave it out (or None) to store snapshots in plaintext.",
                id="flowwarden_django.E008",
            )
        ]
    messages = []
    if find_spec("cryptography") is None:
        messages.append(
            checks.Error(
                f"{setting} is set but the cryptography package is not installed.",
                hint='pip install "flowwarden-django[crypto]"',
                id="flowwarden_django.E005",
            )
        )
    for index, key in enumerate(keys):
        try:
            decode_key(key)
        except ValueError as exc:
            # Never echo the key itself.
            messages.append(
                checks.Error(
                    f"{setting}[{index}] {exc}.",
                    hint="Each key is base64 text of 32 random bytes, for example from "
                    "flowwarden_django.workflows.storage.encryption.generate_key().",
                    id="flowwarden_django.E008",
                )
            )
    return messages
