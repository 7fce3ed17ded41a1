"""A workflow step's writes in one statement, on PostgreSQL outside a transaction:
the run's update with its snapshot's insert (``save_advancing_run``), the run's claim
with its seed (``open_run``), the claim with the latest snapshot (``claim_run``), and
a saved snapshot carried to the next step in the provider's message (``carry``,
``uncarry``)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, router
from django.utils import timezone

from ...models import SnapshotRecord, WorkflowRun
from ..storage.snapshot import Saved, WorkflowSnapshot
from ._orm_sql import (
    SNAPSHOT_COLUMNS,
    SnapshotRow,
    advance_sql,
    claim_run_sql,
    execute,
    fetch_one,
    open_run_sql,
    snapshot_params,
)

#: This thread's last ``save_advancing_run``: (store, snapshot, its columns), which
#: ``carry`` of that snapshot, right after, takes instead of serializing it again.
_just_saved = threading.local()

#: How far a held run's ``updated_at`` may lag behind its last step (``advance_sql``).
UPDATED_AT_STEP = timedelta(seconds=1)


class RunStatementsMixin:
    """``OrmSnapshotStore``'s statements that write a run's record and its snapshot
    together (``None`` when they do not apply: save and update one by one then)."""

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
        sql = advance_sql(names, lease_seconds is not None)
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
            *snapshot_params(snapshot, columns, ops),
        ]
        try:
            inserted = execute(connection, sql, params)
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
            *snapshot_params(seed, columns, connection.ops),
            seed.coordination_id,
        ]
        try:
            found = fetch_one(connection, open_run_sql(claim_sql), params)
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
        found = fetch_one(connection, claim_run_sql(claim_sql), claim_params)
        if found is None:
            return None, None
        width = len(SNAPSHOT_COLUMNS)
        row, snapshot = found[:-width], found[-width:]
        if snapshot[0] is None:  # the coordination has no snapshot
            return row, None
        return row, self._decode(SnapshotRow(*snapshot))

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
        row = SnapshotRow(
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
