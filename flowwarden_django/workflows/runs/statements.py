"""The run records' statements for PostgreSQL, which a store on the same database may
run inside a larger statement: the claim of a new or an existing run
(``claim_statement``), of a run on terms (``claim_statement_for``), the insert of a
new run (``create_statement``, ``create_claimed_statement``), and what their rows
mean (``claimed``, ``refused``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from django.db import connections
from django.db.models import Q
from django.utils import timezone

from ...common.app_models import models
from .errors import ConcurrentRunError, check_run_of
from .rows import RunRows
from .sql import (
    CREATED_QUEUE_FIELDS,
    NEW_RUN_VALUES,
    ClaimShape,
    claim_or_create_sql,
    claim_sql,
    converted_fields,
    insert_new_sql,
    run_attnames,
    run_fields,
)
from .status import RunStatus

if TYPE_CHECKING:
    from ...models import WorkflowRun


@dataclasses.dataclass(frozen=True)
class ClaimTerms:
    """What an existing run must be for an execution provider's step runner to claim
    it (a runner on terms never creates a run): at snapshot *head* when *check_head*
    (``None``: no head yet), and ``running`` when *running_only*."""

    head: str | None = None
    check_head: bool = False
    running_only: bool = False
    #: Hand-off tokens the run may be held under (``handoff``): the one the previous
    #: step left it under, and the one this step hands on to (an earlier copy of the
    #: step may have saved already). A claim on these terms takes the run from them.
    held_by: tuple[str, ...] = ()

    def as_q(self) -> Q | None:
        """The terms as a filter of ``WorkflowRun`` rows (``None``: no condition)."""
        where = Q()
        if self.check_head:
            where &= Q(head_snapshot_id=self.head)
        if self.running_only:
            where &= Q(status=RunStatus.RUNNING)
        return where or None


class RunClaim(NamedTuple):
    """One claim of run *coordination_id* of *workflow_name* (version
    *workflow_version*): *runner* takes it for *lease*, and stores *resume_input*
    with the claim when it is not ``None``."""

    coordination_id: str
    workflow_name: str
    runner: str
    lease: timedelta
    resume_input: Any = None
    workflow_version: int = 1


@dataclasses.dataclass(frozen=True)
class NewRunClaim:
    """What ``RunRecords.create_claimed_statement`` returns: the *statement* (SQL and
    parameters) that inserts a run claimed, and the run's column *values* by field
    name, all but ``claimed_until``, which the database sets."""

    statement: tuple[str, list[Any]]
    values: dict[str, Any]
    using: str

    def record(self, row: Sequence[Any]) -> WorkflowRun:
        """The ``WorkflowRun`` the statement inserted, from the *row* it returned."""
        values = {**self.values, "claimed_until": row[0]}
        return models.WorkflowRun.from_db(
            self.using, run_attnames(), [values[field.name] for field in run_fields()]
        )


class RunStatements(RunRows):
    """``RunRecords``' statements on PostgreSQL (``None`` elsewhere), as SQL and
    parameters, and the ``WorkflowRun`` a claim's row is."""

    def _postgresql(self) -> Any:
        """The connection of the runs' database when it is PostgreSQL, else ``None``."""
        connection = connections[self.db]
        return connection if connection.vendor == "postgresql" else None

    def claim_statement(self, claim: RunClaim) -> tuple[str, list[Any]] | None:
        """``claim_or_create``'s statement and parameters for *claim* on PostgreSQL
        (``None`` elsewhere): it returns the claimed row, its columns in the model's
        order then ``created`` (whether this statement inserted it), or no row when
        refused; ``claimed`` makes the row a ``WorkflowRun``, ``refused`` raises the
        reason. A store on the same database may run it as part of a larger statement."""
        connection = self._postgresql()
        if connection is None:
            return None
        json_field = models.WorkflowRun._meta.get_field("resume_input")
        stored_input = json_field.get_db_prep_save(claim.resume_input, connection)
        params = _new_claimed(claim, stored_input, None)
        return claim_or_create_sql(claim.resume_input is not None), [
            *params,
            claim.workflow_name,
            claim.workflow_version,
        ]

    def create_claimed_statement(self, claim: RunClaim) -> NewRunClaim | None:
        """``claim_statement`` for a run that should not exist yet (a ``run()`` with an
        initial state; *claim* without input), on PostgreSQL (``None`` elsewhere): its
        statement inserts the run claimed and returns ``claimed_until`` and
        ``created`` (``record`` makes the ``WorkflowRun`` of that row), or no row,
        writing nothing, when the coordination exists (claim it with
        ``claim_statement`` then). Cheaper to plan and run than the claim's ``ON
        CONFLICT DO UPDATE``, and it returns only what the database decided, not the
        row the caller already knows."""
        if self._postgresql() is None:
            return None
        now = timezone.now()
        params = _new_claimed(claim, None, now)
        values = {
            **NEW_RUN_VALUES,
            "coordination_id": claim.coordination_id,
            "workflow_name": claim.workflow_name,
            "workflow_version": claim.workflow_version,
            "runner": claim.runner,
            "created_at": now,
            "updated_at": now,
        }
        return NewRunClaim((insert_new_sql(claimed=True), params), values, self.db)

    def create_statement(
        self,
        coordination_id: str,
        workflow_name: str,
        head: str,
        *,
        idempotency_key: str | None = None,
        workflow_version: int = 1,
        placed: dict[str, Any] | None = None,
    ) -> tuple[str, list[Any]] | None:
        """``create``'s statement and parameters on PostgreSQL (``None`` elsewhere): a
        ``running`` run at snapshot *head*, unclaimed, returned as ``claim_statement``
        returns its row (``created`` true); no row when the coordination or the key
        exists (nothing written). A store on the same database runs it with the
        insert of *head* (``OrmSnapshotStore.open_run``). *placed*: its queue fields
        (``queues.placing``), written by the same statement."""
        if self._postgresql() is None:
            return None
        now = timezone.now()
        params = [
            coordination_id,
            workflow_name,
            workflow_version,
            head,
            idempotency_key,
            *((placed or {}).get(name, NEW_RUN_VALUES[name]) for name in CREATED_QUEUE_FIELDS),
            now,
            now,
        ]
        return insert_new_sql(claimed=False), params

    def claim_statement_for(
        self, claim: RunClaim, terms: ClaimTerms
    ) -> tuple[str, list[Any]] | None:
        """``claim``'s statement and parameters for *claim* of a run on *terms*, on
        PostgreSQL (``None`` elsewhere): one ``UPDATE ... RETURNING`` the claimed row
        (the model's columns in order; ``claimed`` makes it a ``WorkflowRun``), no row
        when refused. A store on the same database may run it inside a larger
        statement."""
        connection = self._postgresql()
        if connection is None:
            return None
        json_field = models.WorkflowRun._meta.get_field("resume_input")
        with_input = claim.resume_input is not None
        params: list[Any] = list(terms.held_by)
        params += [claim.runner, claim.lease.total_seconds(), timezone.now()]
        if with_input:
            params.append(json_field.get_db_prep_save(claim.resume_input, connection))
        params += [claim.coordination_id, claim.workflow_name, claim.workflow_version]
        params += terms.held_by
        head_is_null = terms.check_head and terms.head is None
        if terms.check_head and not head_is_null:
            params.append(terms.head)
        # A claim without input is committed without waiting for the WAL flush (see
        # ``claim_sql``), unless the caller's transaction would inherit that.
        lazy = not with_input and not connection.in_atomic_block
        shape = ClaimShape(
            with_input, terms.check_head, head_is_null, terms.running_only, lazy, len(terms.held_by)
        )
        return claim_sql(shape), params

    def claimed(self, row: Sequence[Any]) -> WorkflowRun:
        """The ``WorkflowRun`` of a row ``claim_statement`` returned."""
        connection = connections[self.db]
        values = list(row[: len(run_fields())])  # ``created`` left over
        for index, field in converted_fields():
            if values[index] is not None:
                values[index] = field.from_db_value(values[index], None, connection)
        return models.WorkflowRun.from_db(self.db, run_attnames(), values)

    def refused(
        self, coordination_id: str, workflow_name: str, workflow_version: int | None = None
    ) -> None:
        """Raise why ``claim_statement`` returned no row: ``RunConflictError`` (another
        workflow's run; ``RunVersionError``: another version's) or
        ``ConcurrentRunError`` (held); returns when the run is gone (deleted in
        between: the caller tries again)."""
        current = self.get(coordination_id)
        if current is None:
            return
        check_run_of(current, workflow_name, workflow_version)
        raise ConcurrentRunError(coordination_id, current.runner, current.claimed_until)


def _new_claimed(claim: RunClaim, stored_input: Any, now: datetime | None) -> list[Any]:
    """The parameters of *claim*'s new run (its input as *stored_input*) held from
    *now* (``None``: this instant; its ``created_at`` and ``updated_at``, the last
    two), as ``claim_or_create_sql`` and ``insert_new_sql(claimed=True)`` take them
    first."""
    now = now or timezone.now()
    return [
        claim.coordination_id,
        claim.workflow_name,
        claim.workflow_version,
        stored_input,
        claim.runner,
        claim.lease.total_seconds(),
        now,
        now,
    ]
