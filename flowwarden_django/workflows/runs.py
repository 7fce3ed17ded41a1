"""The ``WorkflowRun`` record: a run's status, its head snapshot, and who is running it.

Every operation is one SQL statement, so it needs no surrounding transaction:

* ``create`` is one ``INSERT``; the primary key (coordination id) and the unique
  ``idempotency_key`` turn a second start into an ``IntegrityError``, after which the
  existing run is read back. That is how a key starts a run at most once.
* ``claim`` is one conditional ``UPDATE``: it takes the run only when nobody holds it
  or the holder's lease (``claimed_until``) has run out, so of two runners racing on a
  coordination exactly one gets it; the other gets ``ConcurrentRunError``.
* ``update`` / ``finish`` / ``release`` only touch a run still held by the caller's
  runner token; a runner whose lease was taken over gets ``LeaseLostError``.

Leases are compared with the database's clock (``Now()``), not the hosts'. Run these
outside ``transaction.atomic``: a claim inside an open transaction is invisible to
other runners until it commits.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, router, transaction
from django.db.models import Case, DateTimeField, ExpressionWrapper, F, Q, Value, When
from django.db.models.functions import Now
from django.utils import timezone

from ..common.app_models import models
from ..conf import fw_settings

if TYPE_CHECKING:
    from ..models import WorkflowRun


class RunStatus:
    """The values of ``WorkflowRun.status`` (``WorkflowRun.Status``), importable before
    the app registry is ready."""

    RUNNING = "running"
    HIBERNATED = "hibernated"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"

    #: A paused run: it holds no runner and continues when run or resumed.
    PAUSED = (HIBERNATED, WAITING)


class ConcurrentRunError(RuntimeError):
    """Another runner holds the coordination: this runner did nothing and wrote nothing."""

    def __init__(
        self, coordination_id: str, runner: str = "", claimed_until: datetime | None = None
    ):
        self.coordination_id = coordination_id
        self.runner = runner
        self.claimed_until = claimed_until
        holder = runner or "another runner"
        until = f" until {claimed_until.isoformat()}" if claimed_until else ""
        super().__init__(f"coordination {coordination_id!r} is being run by {holder}{until}")


class LeaseLostError(ConcurrentRunError):
    """This runner's claim on the run was taken over (its lease ran out while it worked)."""

    def __init__(self, coordination_id: str, runner: str) -> None:
        self.coordination_id = coordination_id
        self.runner = runner
        self.claimed_until = None
        RuntimeError.__init__(
            self,
            f"runner {runner} no longer holds coordination {coordination_id!r} "
            "(its lease ran out and another runner claimed it)",
        )


class UnknownRunError(LookupError):
    """No ``WorkflowRun`` has that coordination id."""


class RunConflictError(ValueError):
    """The coordination or idempotency key already belongs to another run or workflow."""


def run_lease() -> timedelta:
    """``FLOWWARDEN["WORKFLOW_RUN_LEASE"]`` as a ``timedelta``."""
    from ..common.durations import parse_duration

    return timedelta(seconds=parse_duration(fw_settings.WORKFLOW_RUN_LEASE))


def recover_after() -> timedelta:
    """``FLOWWARDEN["WORKFLOW_RECOVER_AFTER"]`` as a ``timedelta``."""
    from ..common.durations import parse_duration

    return timedelta(seconds=parse_duration(fw_settings.WORKFLOW_RECOVER_AFTER))


def new_runner_token() -> str:
    """A name for one ``run()`` call: ``<instance>:<thread>:<random>``.

    Unique per call, so a thread that runs the same coordination twice in a row
    never mistakes its old claim for its new one.
    """
    instance = fw_settings.INSTANCE_ID or f"{socket.gethostname()}:{os.getpid()}"
    return f"{instance}:{threading.get_ident()}:{uuid.uuid4().hex[:12]}"[-255:]


def _unclaimed() -> Q:
    """Runs no runner holds (none, or its lease ran out)."""
    return Q(runner="") | Q(claimed_until__isnull=True) | Q(claimed_until__lt=Now())


def _lease_end(lease: timedelta) -> ExpressionWrapper:
    return ExpressionWrapper(Now() + Value(lease), output_field=DateTimeField())


class RunRecords:
    """``WorkflowRun`` rows of one database (``using``; by default the router's
    ``db_for_write``, for reads too)."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    @property
    def db(self) -> str:
        return self.using or router.db_for_write(models.WorkflowRun)

    def _rows(self) -> Any:
        return models.WorkflowRun.objects.using(self.db)

    # -- reads ---------------------------------------------------------------------------

    def get(self, coordination_id: str) -> WorkflowRun | None:
        """The run of *coordination_id*, or ``None``."""
        return self._rows().filter(pk=coordination_id).first()

    def get_by_key(self, idempotency_key: str) -> WorkflowRun | None:
        """The run started with *idempotency_key*, or ``None``."""
        return self._rows().filter(idempotency_key=idempotency_key).first()

    # -- writes --------------------------------------------------------------------------

    def create(
        self,
        coordination_id: str,
        workflow_name: str,
        *,
        idempotency_key: str | None = None,
        runner: str = "",
        lease: timedelta | None = None,
    ) -> tuple[WorkflowRun, bool]:
        """Insert a run (claimed by *runner* for *lease* when given) and return
        ``(run, True)``; when the coordination or the key exists already, return
        ``(existing run, False)`` and change nothing.

        ``RunConflictError`` when the existing run belongs to another workflow, or
        when the coordination exists under another idempotency key.
        """
        model = models.WorkflowRun
        now = timezone.now()
        row = model(
            coordination_id=coordination_id,
            workflow_name=workflow_name,
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
    ) -> WorkflowRun:
        """Take the run for *runner* until now + *lease* (one conditional ``UPDATE``)
        and return it; *resume_input*, when not ``None``, is stored in the same
        statement. ``ConcurrentRunError`` when another runner's lease is live;
        ``UnknownRunError`` when there is no such run; ``RunConflictError`` when
        *workflow_name* is given and the run belongs to another workflow."""
        # A retry: a failed run run again, or a claim that ran out taken over (its
        # runner died); not a first run, a resume, or the next step of a run.
        retry = Case(
            When(Q(status=RunStatus.FAILED) | ~Q(runner=""), then=Value(1)), default=Value(0)
        )
        fields: dict[str, Any] = {
            "runner": runner,
            "claimed_until": _lease_end(lease),
            "attempts": F("attempts") + retry,
            "updated_at": timezone.now(),
        }
        if resume_input is not None:
            fields["resume_input"] = resume_input
        rows = self._rows().filter(_unclaimed(), pk=coordination_id)
        if workflow_name is not None:
            rows = rows.filter(workflow_name=workflow_name)
        if rows.update(**fields) != 1:
            current = self.get(coordination_id)
            if current is None:
                raise UnknownRunError(f"no workflow run {coordination_id!r}")
            if workflow_name is not None and current.workflow_name != workflow_name:
                raise RunConflictError(
                    f"coordination {coordination_id!r} is a run of workflow "
                    f"{current.workflow_name!r}, not {workflow_name!r}"
                )
            raise ConcurrentRunError(coordination_id, current.runner, current.claimed_until)
        run = self.get(coordination_id)
        assert run is not None
        return run

    def update(self, coordination_id: str, runner: str, lease: timedelta, **fields: Any) -> None:
        """Set *fields* and renew the lease, if *runner* still holds the run;
        ``LeaseLostError`` otherwise."""
        fields.update(claimed_until=_lease_end(lease), updated_at=timezone.now())
        self._update_held(coordination_id, runner, fields)

    def finish(self, coordination_id: str, runner: str, **fields: Any) -> None:
        """Set *fields* (a status, say) and release the run, if *runner* holds it;
        ``LeaseLostError`` otherwise."""
        fields.update(runner="", claimed_until=None, updated_at=timezone.now())
        self._update_held(coordination_id, runner, fields)

    def set_head(self, coordination_id: str, snapshot_id: str) -> None:
        """Point an unclaimed run at its head snapshot (``start`` does, right after the
        ``INSERT``, in the same transaction)."""
        self._rows().filter(pk=coordination_id).update(
            head_snapshot_id=snapshot_id, updated_at=timezone.now()
        )

    def accept_decision(self, coordination_id: str, head: str, resume_input: Any) -> bool:
        """Move a run waiting at snapshot *head* (and not claimed) to ``running`` with
        *resume_input* stored (one conditional ``UPDATE``); False when it is not
        waiting there any more. From then on any runner, or the recovery sweep,
        continues it with that input."""
        return (
            self._waiting_at(coordination_id, head).update(
                status=RunStatus.RUNNING, resume_input=resume_input, updated_at=timezone.now()
            )
            == 1
        )

    def leave_waiting(self, coordination_id: str) -> bool:
        """Make a waiting run ``hibernated`` (it was forked: ``run()`` continues it
        from the fork); False when it was not waiting."""
        rows = self._rows().filter(pk=coordination_id, status=RunStatus.WAITING)
        return rows.update(status=RunStatus.HIBERNATED, updated_at=timezone.now()) == 1

    def wait_at(self, coordination_id: str, head: str) -> bool:
        """Make an unclaimed run wait for a decision at snapshot *head* (a fork of a
        snapshot that asked for one), dropping any input it held; False when a runner
        holds it (the engine then makes it wait when it reaches *head*)."""
        rows = self._rows().filter(_unclaimed(), pk=coordination_id)
        fields = {"status": RunStatus.WAITING, "head_snapshot_id": head, "resume_input": None}
        return rows.update(**fields, failure_reason="", updated_at=timezone.now()) == 1

    def fail_waiting(self, coordination_id: str, head: str, reason: str) -> bool:
        """Fail a run waiting at snapshot *head* (not claimed); False when it is not
        waiting there any more."""
        return (
            self._waiting_at(coordination_id, head).update(
                status=RunStatus.FAILED, failure_reason=reason, updated_at=timezone.now()
            )
            == 1
        )

    def _waiting_at(self, coordination_id: str, head: str) -> Any:
        return self._rows().filter(
            _unclaimed(), pk=coordination_id, status=RunStatus.WAITING, head_snapshot_id=head
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
