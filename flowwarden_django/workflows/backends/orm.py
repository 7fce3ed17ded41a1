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

This module holds the store itself; its parts live beside it: ``_orm_rows`` (a
snapshot as its row and back, encrypted or not), ``_orm_runs`` (a step's run and
snapshot in one statement), ``_orm_listing`` (the queries of ``list``), ``_orm_sql``
(the SQL it writes itself) and ``_orm_checks`` (the checks of its options).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from django.core import checks
from django.db import IntegrityError, OperationalError, connections, router
from django.db.models import Count, Min, QuerySet

from ...models import SnapshotRecord, WorkflowRun
from ..runs.transactions import write_transaction
from ..storage.encryption import AesGcmCipher
from ..storage.retention import PruneRow, plan_prune
from ..storage.serializers import StateSerializer, resolve_serializer
from ..storage.snapshot import CheckpointQuery, Saved, WorkflowSnapshot, storable_id
from ..storage.store import SnapshotConflictError, SnapshotStore
from ._common import check_query
from ._orm_checks import BOOLEAN_OPTIONS as BOOLEAN_OPTIONS
from ._orm_checks import SUPPORTED_VENDORS as SUPPORTED_VENDORS
from ._orm_checks import check_plaintext, check_store_options
from ._orm_listing import LIST_ORDER, LISTED_COLUMNS, of_coordinations, rows_after
from ._orm_rows import SnapshotRowsMixin
from ._orm_rows import column_aad as _aad  # noqa: F401  (imported from here by tests)
from ._orm_runs import UPDATED_AT_STEP as UPDATED_AT_STEP
from ._orm_runs import RunStatementsMixin
from ._orm_sql import (
    LOCK_NAMESPACE,
    SnapshotRow,
    execute,
    fetch_one,
    insert_new_sql,
    latest_sql,
    lock_key,
    retryable,
    snapshot_params,
)

logger = logging.getLogger("flowwarden_django.workflows")

#: Ids per ``DELETE ... WHERE id IN (...)`` statement.
_CHUNK = 500


def _chunks(ids: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(ids), _CHUNK):
        yield ids[start : start + _CHUNK]


class OrmSnapshotStore(RunStatementsMixin, SnapshotRowsMixin, SnapshotStore):
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
                if nested or not retryable(exc) or attempt >= self.save_attempts:
                    raise
            time.sleep(random.uniform(0, 0.002 * attempt))
        stored = snapshot.replace(seq=seq)
        self._emit(Saved, stored)
        return stored

    def load(self, snapshot_id: str) -> WorkflowSnapshot | None:
        return self._loaded(self._get(snapshot_id))

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
        order = ("seq",) if query.coordination_id is not None else LIST_ORDER
        if query.after is not None:
            rows = rows.filter(rows_after(query.after, order, query.newest_first))
        if query.newest_first:
            order = tuple(f"-{field}" for field in order)
        if not query.with_state:
            # Listings never read the state column (nor its type).
            rows = rows.only(*LISTED_COLUMNS)
        if query.coordination_ids is not None:
            rows = of_coordinations(rows, sorted(query.coordination_ids), order, query.limit)
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
            found = fetch_one(connection, latest_sql(), [coordination_id])
            return None if found is None else self._decode(SnapshotRow(*found))
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

    def _prune(
        self, keep_last: int | None, cutoff: Any, coordination_id: str | None, protected: set[str]
    ) -> int:
        alias = self._alias()
        rows = self._rows(alias)
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
        return check_store_options(alias, options)

    @classmethod
    def check_deploy_options(
        cls, alias: str, options: Mapping[str, Any]
    ) -> list[checks.CheckMessage]:
        """``manage.py check --deploy``: a warning when snapshots are stored in plaintext."""
        return check_plaintext(alias, options)

    # -- internals ---------------------------------------------------------------------

    def _alias(self) -> str:
        return self.using or router.db_for_write(SnapshotRecord)

    def transaction_alias(self) -> str:
        """The database its rows are written to: a transactional step's writes commit
        there, in one transaction with the step's snapshot (``engine.transactional``)."""
        return self._alias()

    def _rows(self, alias: str | None = None) -> QuerySet[SnapshotRecord]:
        return SnapshotRecord.objects.using(alias or self._alias())

    def _write(self, alias: str, snapshot: WorkflowSnapshot, columns: dict[str, Any]) -> int:
        """One attempt of ``save``, inside its transaction; returns the ``seq``."""
        rows = self._rows(alias)
        cid = snapshot.coordination_id
        connection = connections[alias]
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(%s, %s)", [LOCK_NAMESPACE, lock_key(cid)]
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
        params = snapshot_params(snapshot, columns, connection.ops)
        if vendor == "postgresql" and connection.autocommit:
            try:
                return execute(connection, insert_new_sql(or_nothing=False), params) == 1
            except IntegrityError:
                return False
        return execute(connection, insert_new_sql(), params) == 1

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
