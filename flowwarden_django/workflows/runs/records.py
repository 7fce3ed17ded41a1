"""The ``WorkflowRun`` record: a run's status, its head snapshot, and who is running it.

Every operation is one SQL statement, so it needs no surrounding transaction:

* ``create`` is one ``INSERT``; the primary key (coordination id) and the unique
  ``idempotency_key`` turn a second start into an ``IntegrityError``, after which the
  existing run is read back. That is how a key starts a run at most once.
* ``claim`` is one conditional ``UPDATE``: it takes the run only when nobody holds it
  or the holder's lease (``claimed_until``) has run out, so of two runners racing on a
  coordination exactly one gets it; the other gets ``ConcurrentRunError``.
* ``claim_or_create`` is ``claim``, and ``create`` when there is no run: on PostgreSQL
  one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` (unclaimed) ``RETURNING`` the row,
  so the engine's claim of a new or an existing run is one statement.
* ``claim_statement_for`` is ``claim`` of an existing run on ``ClaimTerms`` (an
  execution provider's step runner) as one ``UPDATE ... RETURNING``: a store on the
  same database reads the run's latest snapshot in the same statement.
* ``update`` / ``finish`` / ``release`` only touch a run still held by the caller's
  runner token; a runner whose lease was taken over gets ``LeaseLostError``.

Leases are compared with the database's clock (``Now()``), not the hosts'. Run these
outside ``transaction.atomic``: a claim inside an open transaction is invisible to
other runners until it commits.

The record lives in parts beside this module: the statuses (``status``), the errors
(``errors``), the tokens, leases and holder filters (``leases``), the rows of one
database (``rows``), the PostgreSQL statements (``statements``, their SQL in ``sql``)
and the writes of a paused run (``pauses``).
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from ...common.app_models import models
from .errors import ConcurrentRunError as ConcurrentRunError
from .errors import LeaseLostError as LeaseLostError
from .errors import RunConflictError as RunConflictError
from .errors import RunVersionError as RunVersionError
from .errors import UnknownRunError as UnknownRunError
from .errors import check_run_of as check_run_of
from .leases import HANDOFF_PREFIX as HANDOFF_PREFIX
from .leases import between_steps as between_steps
from .leases import lease_end
from .leases import new_handoff_token as new_handoff_token
from .leases import new_runner_token as new_runner_token
from .leases import recover_after as recover_after
from .leases import run_lease as run_lease
from .leases import unclaimed as unclaimed
from .pauses import RunPauses
from .statements import ClaimTerms as ClaimTerms
from .statements import NewRunClaim as NewRunClaim
from .statements import RunClaim as RunClaim
from .statements import RunStatements
from .status import RunStatus as RunStatus

if TYPE_CHECKING:
    from ...models import WorkflowRun


class RunRecords(RunStatements, RunPauses):
    """``WorkflowRun`` rows of one database (``using``; by default the router's
    ``db_for_write``, for reads too)."""

    # -- writes --------------------------------------------------------------------------

    def create(
        self,
        coordination_id: str,
        workflow_name: str,
        *,
        idempotency_key: str | None = None,
        runner: str = "",
        lease: timedelta | None = None,
        workflow_version: int = 1,
    ) -> tuple[WorkflowRun, bool]:
        """Insert a run of version *workflow_version* (claimed by *runner* for *lease*
        when given) and return ``(run, True)``; when the coordination or the key
        exists already, return ``(existing run, False)`` and change nothing.

        ``RunConflictError`` when the existing run belongs to another workflow, or
        when the coordination exists under another idempotency key. An existing run
        of another version of the workflow is returned as it is (a start with an
        idempotency key after a deploy finds the run started before it).
        """
        model = models.WorkflowRun
        now = timezone.now()
        row = model(
            coordination_id=coordination_id,
            workflow_name=workflow_name,
            workflow_version=workflow_version,
            status=RunStatus.RUNNING,
            idempotency_key=idempotency_key,
            runner=runner,
            claimed_until=now + lease if runner and lease is not None else None,
            attempts=0,
            created_at=now,
            updated_at=now,
        )
        try:
            # A savepoint when called inside a transaction, so the conflict does not
            # break the caller's transaction (PostgreSQL aborts it otherwise).
            with transaction.atomic(using=self.db):
                row.save(using=self.db, force_insert=True)
            return row, True
        except IntegrityError:
            existing = (self.get_by_key(idempotency_key) if idempotency_key else None) or self.get(
                coordination_id
            )
            if existing is None:  # deleted in between, or a different constraint
                raise
        if existing.workflow_name != workflow_name:
            raise RunConflictError(
                f"{'idempotency key ' + repr(idempotency_key) if idempotency_key else ''}"
                f"{' of ' if idempotency_key else ''}coordination "
                f"{existing.coordination_id!r} belongs to workflow "
                f"{existing.workflow_name!r}, not {workflow_name!r}"
            )
        if idempotency_key and existing.idempotency_key != idempotency_key:
            raise RunConflictError(
                f"coordination {coordination_id!r} was started with another idempotency key"
            )
        return existing, False

    def claim(
        self,
        coordination_id: str,
        runner: str,
        lease: timedelta,
        *,
        resume_input: Any = None,
        workflow_name: str | None = None,
        workflow_version: int | None = None,
        where: Q | None = None,
        held_by: tuple[str, ...] = (),
    ) -> WorkflowRun:
        """Take the run for *runner* until now + *lease* (one conditional ``UPDATE``)
        and return it; *resume_input*, when not ``None``, is stored in the same
        statement. ``ConcurrentRunError`` when another runner's lease is live, or
        when the run does not match *where* (a further condition of the same
        statement); ``UnknownRunError`` when there is no such run;
        ``RunConflictError`` when *workflow_name* is given and the run belongs to
        another workflow (``RunVersionError``: to another *workflow_version*).
        *held_by*: hand-off tokens the run may be held under (``ClaimTerms``)."""
        # A retry: a failed run run again, or a claim that ran out taken over (its
        # runner died); not a first run, a resume, or the next step of a run (nor a
        # step taking the run handed to it).
        taken_over = ~Q(runner="") & ~Q(runner__in=held_by) if held_by else ~Q(runner="")
        retry = Case(When(Q(status=RunStatus.FAILED) | taken_over, then=Value(1)), default=Value(0))
        fields: dict[str, Any] = {
            # First: MySQL's SET sees the columns an earlier assignment set (the new
            # runner would make every claim a retry); PostgreSQL's sees the old row.
            "attempts": F("attempts") + retry,
            "runner": runner,
            "claimed_until": lease_end(lease),
            "updated_at": timezone.now(),
        }
        if resume_input is not None:
            fields["resume_input"] = resume_input
        free = unclaimed() | Q(runner__in=held_by) if held_by else unclaimed()
        rows = self._rows().filter(free, pk=coordination_id)
        if workflow_name is not None:
            rows = rows.filter(workflow_name=workflow_name)
            if workflow_version is not None:
                rows = rows.filter(workflow_version=workflow_version)
        if where is not None:
            rows = rows.filter(where)
        if rows.update(**fields) != 1:
            current = self.get(coordination_id)
            if current is None:
                raise UnknownRunError(f"no workflow run {coordination_id!r}")
            if workflow_name is not None:
                check_run_of(current, workflow_name, workflow_version)
            raise ConcurrentRunError(coordination_id, current.runner, current.claimed_until)
        run = self.get(coordination_id)
        assert run is not None
        return run

    def claim_or_create(self, claim: RunClaim) -> WorkflowRun:
        """Take the run for the *claim*'s runner until now + its lease as ``claim``
        does, creating it (status ``running``, claimed by that runner) when there is
        none; its resume input, when not ``None``, is stored with the claim. Returns
        the run as claimed.

        PostgreSQL: one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING``
        (``claim_statement``); of racing runners exactly one inserts or takes the run.
        Elsewhere: ``claim``, and ``create`` (then ``claim`` again, when another
        runner created it at the same moment) for an unknown run.
        ``ConcurrentRunError`` when another runner's lease is live;
        ``RunConflictError`` when the run belongs to another workflow
        (``RunVersionError``: to another version of it).
        """
        statement = self.claim_statement(claim)
        if statement is None:
            return self._claim_or_create(claim)
        with connections[self.db].cursor() as cursor:
            cursor.execute(*statement)
            row = cursor.fetchone()
        if row is None:
            self.refused(claim.coordination_id, claim.workflow_name, claim.workflow_version)
            return self._claim_or_create(claim)  # deleted between the two statements
        return self.claimed(row)

    def _claim_or_create(self, claim: RunClaim) -> WorkflowRun:
        cid, name, runner, lease, resume_input, version = claim
        take = partial(
            self.claim,
            cid,
            runner,
            lease,
            resume_input=resume_input,
            workflow_name=name,
            workflow_version=version,
        )
        try:
            return take()
        except UnknownRunError:
            pass
        record, created = self.create(
            cid, name, runner=runner, lease=lease, workflow_version=version
        )
        if not created:  # another runner created it at the same moment
            return take()
        if resume_input is not None:
            self.update(cid, runner, lease, resume_input=resume_input)
            record.resume_input = resume_input
        return record

    def update(self, coordination_id: str, runner: str, lease: timedelta, /, **fields: Any) -> None:
        """Set *fields* (a ``runner`` among them hands the run to that token) and renew
        the lease, if *runner* still holds the run;
        ``LeaseLostError`` otherwise."""
        fields.update(claimed_until=lease_end(lease), updated_at=timezone.now())
        self._update_held(coordination_id, runner, fields)

    def renew(self, coordination_id: str, runner: str, lease: timedelta) -> bool:
        """Extend *runner*'s claim to now + *lease* (``claimed_until`` only: a renewal
        is no change of the run, and leaves ``updated_at`` alone); False when
        *runner* does not hold the run any more."""
        rows = self._rows().filter(pk=coordination_id, runner=runner)
        return rows.update(claimed_until=lease_end(lease)) == 1

    def finish(self, coordination_id: str, runner: str, **fields: Any) -> None:
        """Set *fields* (a status, say) and release the run, if *runner* holds it;
        ``LeaseLostError`` otherwise."""
        fields.update(runner="", claimed_until=None, updated_at=timezone.now())
        self._update_held(coordination_id, runner, fields)

    def place(self, coordination_id: str, fields: dict[str, Any]) -> None:
        """Set the queue fields of a run just created (``start(queue=...)``)."""
        self._rows().filter(pk=coordination_id).update(**fields)

    def set_head(self, coordination_id: str, snapshot_id: str) -> None:
        """Point an unclaimed run at its head snapshot (``start`` does, right after the
        ``INSERT``, in the same transaction)."""
        self._rows().filter(pk=coordination_id).update(
            head_snapshot_id=snapshot_id, updated_at=timezone.now()
        )

    def release(
        self, coordination_id: str, runner: str, *, touch: bool = True, **fields: Any
    ) -> bool:
        """Let go of the run if *runner* holds it (status unchanged, *fields* set);
        True if it did. ``touch=False`` keeps ``updated_at``: a run let go after an
        interrupted execution has not moved, and the recovery sweep may take it
        at once."""
        held = self._rows().filter(pk=coordination_id, runner=runner)
        fields.update(runner="", claimed_until=None)
        if touch:
            fields["updated_at"] = timezone.now()
        return held.update(**fields) == 1

    def _update_held(self, coordination_id: str, runner: str, fields: dict[str, Any]) -> None:
        if self._rows().filter(pk=coordination_id, runner=runner).update(**fields) != 1:
            raise LeaseLostError(coordination_id, runner)
