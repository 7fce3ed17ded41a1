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
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, router, transaction
from django.db.models import Case, DateTimeField, ExpressionWrapper, F, Q, Value, When
from django.db.models.functions import Now
from django.utils import timezone
from django.utils.crypto import salted_hmac

from ...common.app_models import models
from ...conf import fw_settings

if TYPE_CHECKING:
    from ...models import WorkflowRun


class RunStatus:
    """The values of ``WorkflowRun.status`` (``WorkflowRun.Status``), importable before
    the app registry is ready."""

    RUNNING = "running"
    HIBERNATED = "hibernated"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    #: Its version, or the step it stands after, is not defined by the code that
    #: tried to continue it: it waits for that definition or an upgrade.
    NEEDS_UPGRADE = "needs_upgrade"
    #: A step returned ``sleep(...)``: it continues by itself at ``wake_at`` (or
    #: earlier, when run or resumed).
    SLEEPING = "sleeping"
    #: Stopped for good by ``Workflow.cancel`` (or its endpoint, action or command).
    CANCELLED = "cancelled"
    #: A step returned ``spawn(...)``: it continues once every child run finished.
    WAITING_CHILDREN = "waiting_children"
    #: A step returned ``wait_for(...)``: it continues once a message of its topic
    #: (``waiting_topic``) is sent, or at its deadline (``wake_at``).
    WAITING_MESSAGE = "waiting_message"

    #: A paused run: it holds no runner and continues when run or resumed.
    PAUSED = (HIBERNATED, WAITING, SLEEPING, WAITING_CHILDREN, WAITING_MESSAGE)
    #: A run that never continues again (a failed one does, when run again).
    FINAL = (COMPLETED, CANCELLED)
    #: What an upgrade may move to another version.
    #: (Not a run waiting for its children: an upgrade would lose what it waits for.)
    UPGRADABLE = (HIBERNATED, WAITING, SLEEPING, FAILED, NEEDS_UPGRADE, WAITING_MESSAGE)


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


class RunVersionError(RunConflictError):
    """The run is on another version of its workflow than the definition that tried to
    run it (``Workflow.for_coordination(cid)`` gives the run's own); nothing changed."""

    def __init__(self, coordination_id: str, workflow_name: str, run_version: int, version: int):
        self.coordination_id = coordination_id
        self.run_version = run_version
        self.version = version
        super().__init__(
            f"coordination {coordination_id!r} is a run of version {run_version} of "
            f"workflow {workflow_name!r}, not of version {version}; continue it with "
            "Workflow.for_coordination(coordination_id), or upgrade it "
            "(manage.py flowwarden_workflows upgrade)"
        )


def check_run_of(record: WorkflowRun, workflow_name: str, version: int | None) -> None:
    """``RunConflictError`` when *record* is not a run of *workflow_name* (at *version*,
    when given)."""
    cid = record.coordination_id
    if record.workflow_name != workflow_name:
        raise RunConflictError(
            f"coordination {cid!r} is a run of workflow {record.workflow_name!r}, "
            f"not {workflow_name!r}"
        )
    if version is not None and record.workflow_version != version:
        raise RunVersionError(cid, workflow_name, record.workflow_version, version)


def run_lease() -> timedelta:
    """``FLOWWARDEN["WORKFLOW_RUN_LEASE"]`` as a ``timedelta``."""
    return _as_timedelta(fw_settings.WORKFLOW_RUN_LEASE)


@lru_cache(maxsize=8)
def _as_timedelta(value: str | float) -> timedelta:
    # Read for every claim: parsed once per value.
    from ...common.durations import parse_duration

    return timedelta(seconds=parse_duration(value))


def recover_after() -> timedelta:
    """``FLOWWARDEN["WORKFLOW_RECOVER_AFTER"]`` as a ``timedelta``."""
    from ...common.durations import parse_duration

    return timedelta(seconds=parse_duration(fw_settings.WORKFLOW_RECOVER_AFTER))


#: How the token of a run handed from one step to the next begins (``handoff``): the
#: run is held between two steps, not by a step running, so an upgrade may take it.
HANDOFF_PREFIX = "handoff:"
_HANDOFF_SALT = "flowwarden_django.workflows.runs.handoff_token"


def new_handoff_token(*names: str) -> str:
    """A name for the claim one step hands the next (``handoff``): unique, so a late
    attempt of an earlier step never writes over a later one's. Derived from *names*
    when given (a provider's name for the step's task, the same for every copy and
    attempt of it), else random."""
    if not names:
        return f"{HANDOFF_PREFIX}{uuid.uuid4().hex}"
    # Keyed with SECRET_KEY: who knows a task's name cannot name the run's hold.
    digest = salted_hmac(_HANDOFF_SALT, "\x00".join(names), algorithm="sha256").hexdigest()
    return f"{HANDOFF_PREFIX}{digest[:32]}"


def new_runner_token() -> str:
    """A name for one ``run()`` call: ``<instance>:<thread>:<random>``.

    Unique per call, so a thread that runs the same coordination twice in a row
    never mistakes its old claim for its new one.
    """
    instance = fw_settings.INSTANCE_ID or _host_and_pid(os.getpid())
    return f"{instance}:{threading.get_ident()}:{uuid.uuid4().hex[:12]}"[-255:]


@lru_cache(maxsize=4)
def _host_and_pid(pid: int) -> str:
    # gethostname() is a system call: once per process (a forked child has its pid).
    return f"{socket.gethostname()}:{pid}"


def unclaimed() -> Q:
    """Runs no runner holds (none, or its lease ran out)."""
    return Q(runner="") | Q(claimed_until__isnull=True) | Q(claimed_until__lt=Now())


def between_steps() -> Q:
    """Runs held by a hand-off token (``handoff``): between two steps, or in a step
    that runs from the hand-off, whose save is refused once the run is taken."""
    return Q(runner__startswith=HANDOFF_PREFIX)


def _lease_end(lease: timedelta) -> ExpressionWrapper:
    return ExpressionWrapper(Now() + Value(lease), output_field=DateTimeField())


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
            self.using, _run_attnames(), [values[field.name] for field in _run_fields()]
        )


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
            "claimed_until": _lease_end(lease),
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

    def claim_or_create(
        self,
        coordination_id: str,
        workflow_name: str,
        runner: str,
        lease: timedelta,
        *,
        resume_input: Any = None,
        workflow_version: int = 1,
    ) -> WorkflowRun:
        """Take the run for *runner* until now + *lease* as ``claim`` does, creating it
        (status ``running``, claimed by *runner*) when there is none; *resume_input*,
        when not ``None``, is stored with the claim. Returns the run as claimed.

        PostgreSQL: one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING``
        (``claim_statement``); of racing runners exactly one inserts or takes the run.
        Elsewhere: ``claim``, and ``create`` (then ``claim`` again, when another
        runner created it at the same moment) for an unknown run.
        ``ConcurrentRunError`` when another runner's lease is live;
        ``RunConflictError`` when the run belongs to another workflow
        (``RunVersionError``: to another version of it).
        """
        args = (coordination_id, workflow_name, runner, lease, resume_input, workflow_version)
        statement = self.claim_statement(*args)
        if statement is None:
            return self._claim_or_create(*args)
        with connections[self.db].cursor() as cursor:
            cursor.execute(*statement)
            row = cursor.fetchone()
        if row is None:
            self.refused(coordination_id, workflow_name, workflow_version)
            return self._claim_or_create(*args)  # deleted between the two statements
        return self.claimed(row)

    def claim_statement(
        self,
        coordination_id: str,
        workflow_name: str,
        runner: str,
        lease: timedelta,
        resume_input: Any = None,
        workflow_version: int = 1,
    ) -> tuple[str, list[Any]] | None:
        """``claim_or_create``'s statement and parameters on PostgreSQL (``None``
        elsewhere): it returns the claimed row, its columns in the model's order then
        ``created`` (whether this statement inserted it), or no row when refused;
        ``claimed`` makes the row a ``WorkflowRun``, ``refused`` raises the reason.
        A store on the same database may run it as part of a larger statement."""
        connection = connections[self.db]
        if connection.vendor != "postgresql":
            return None
        now = timezone.now()
        json_field = models.WorkflowRun._meta.get_field("resume_input")
        params = [
            coordination_id,
            workflow_name,
            workflow_version,
            json_field.get_db_prep_save(resume_input, connection),
            runner,
            lease.total_seconds(),
            now,
            now,
            workflow_name,
            workflow_version,
        ]
        return _claim_or_create_sql(resume_input is not None), params

    def create_claimed_statement(
        self,
        coordination_id: str,
        workflow_name: str,
        runner: str,
        lease: timedelta,
        workflow_version: int = 1,
    ) -> NewRunClaim | None:
        """``claim_statement`` for a run that should not exist yet (a ``run()`` with an
        initial state), on PostgreSQL (``None`` elsewhere): its statement inserts the
        run claimed and returns ``claimed_until`` and ``created`` (``record`` makes
        the ``WorkflowRun`` of that row), or no row, writing nothing, when the
        coordination exists (claim it with ``claim_statement`` then). Cheaper to plan
        and run than the claim's ``ON CONFLICT DO UPDATE``, and it returns only what
        the database decided, not the row the caller already knows."""
        connection = connections[self.db]
        if connection.vendor != "postgresql":
            return None
        now = timezone.now()
        params = [
            coordination_id,
            workflow_name,
            workflow_version,
            None,  # resume_input
            runner,
            lease.total_seconds(),
            now,
            now,
        ]
        values = {
            **_NEW_RUN_VALUES,
            "coordination_id": coordination_id,
            "workflow_name": workflow_name,
            "workflow_version": workflow_version,
            "runner": runner,
            "created_at": now,
            "updated_at": now,
        }
        return NewRunClaim((_insert_new_sql(claimed=True), params), values, self.db)

    def create_statement(
        self,
        coordination_id: str,
        workflow_name: str,
        head: str,
        *,
        idempotency_key: str | None = None,
        workflow_version: int = 1,
    ) -> tuple[str, list[Any]] | None:
        """``create``'s statement and parameters on PostgreSQL (``None`` elsewhere): a
        ``running`` run at snapshot *head*, unclaimed, returned as ``claim_statement``
        returns its row (``created`` true); no row when the coordination or the key
        exists (nothing written). A store on the same database runs it with the
        insert of *head* (``OrmSnapshotStore.open_run``)."""
        connection = connections[self.db]
        if connection.vendor != "postgresql":
            return None
        now = timezone.now()
        params = [
            coordination_id,
            workflow_name,
            workflow_version,
            head,
            idempotency_key,
            now,
            now,
        ]
        return _insert_new_sql(claimed=False), params

    def claim_statement_for(
        self,
        coordination_id: str,
        workflow_name: str,
        runner: str,
        lease: timedelta,
        terms: ClaimTerms,
        resume_input: Any = None,
        workflow_version: int = 1,
    ) -> tuple[str, list[Any]] | None:
        """``claim``'s statement and parameters for a run on *terms*, on PostgreSQL
        (``None`` elsewhere): one ``UPDATE ... RETURNING`` the claimed row (the
        model's columns in order; ``claimed`` makes it a ``WorkflowRun``), no row when
        refused. A store on the same database may run it inside a larger statement."""
        connection = connections[self.db]
        if connection.vendor != "postgresql":
            return None
        json_field = models.WorkflowRun._meta.get_field("resume_input")
        with_input = resume_input is not None
        held = len(terms.held_by)
        params: list[Any] = list(terms.held_by)
        params += [runner, lease.total_seconds(), timezone.now()]
        if with_input:
            params.append(json_field.get_db_prep_save(resume_input, connection))
        params += [coordination_id, workflow_name, workflow_version]
        params += terms.held_by
        head_is_null = terms.check_head and terms.head is None
        if terms.check_head and not head_is_null:
            params.append(terms.head)
        # A claim without input is committed without waiting for the WAL flush (see
        # ``_claim_sql``), unless the caller's transaction would inherit that.
        lazy = not with_input and not connection.in_atomic_block
        sql = _claim_sql(with_input, terms.check_head, head_is_null, terms.running_only, lazy, held)
        return sql, params

    def claimed(self, row: Sequence[Any]) -> WorkflowRun:
        """The ``WorkflowRun`` of a row ``claim_statement`` returned."""
        connection = connections[self.db]
        values = list(row[: len(_run_fields())])  # ``created`` left over
        for index, field in _converted_fields():
            if values[index] is not None:
                values[index] = field.from_db_value(values[index], None, connection)
        return models.WorkflowRun.from_db(self.db, _run_attnames(), values)

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

    def _claim_or_create(
        self,
        coordination_id: str,
        workflow_name: str,
        runner: str,
        lease: timedelta,
        resume_input: Any,
        workflow_version: int,
    ) -> WorkflowRun:
        claim = partial(
            self.claim,
            coordination_id,
            runner,
            lease,
            resume_input=resume_input,
            workflow_name=workflow_name,
            workflow_version=workflow_version,
        )
        try:
            return claim()
        except UnknownRunError:
            pass
        record, created = self.create(
            coordination_id,
            workflow_name,
            runner=runner,
            lease=lease,
            workflow_version=workflow_version,
        )
        if not created:  # another runner created it at the same moment
            return claim()
        if resume_input is not None:
            self.update(coordination_id, runner, lease, resume_input=resume_input)
            record.resume_input = resume_input
        return record

    def update(self, coordination_id: str, runner: str, lease: timedelta, /, **fields: Any) -> None:
        """Set *fields* (a ``runner`` among them hands the run to that token) and renew
        the lease, if *runner* still holds the run;
        ``LeaseLostError`` otherwise."""
        fields.update(claimed_until=_lease_end(lease), updated_at=timezone.now())
        self._update_held(coordination_id, runner, fields)

    def renew(self, coordination_id: str, runner: str, lease: timedelta) -> bool:
        """Extend *runner*'s claim to now + *lease* (``claimed_until`` only: a renewal
        is no change of the run, and leaves ``updated_at`` alone); False when
        *runner* does not hold the run any more."""
        rows = self._rows().filter(pk=coordination_id, runner=runner)
        return rows.update(claimed_until=_lease_end(lease)) == 1

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
        # A cancelled run stays cancelled: a fork does not bring it back (a completed
        # one may be forked back to a question, as it always could).
        rows = self._rows().filter(unclaimed(), pk=coordination_id)
        rows = rows.exclude(status=RunStatus.CANCELLED)
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

    def needs_upgrade(
        self, coordination_id: str, reason: str, *, only_if_idle: bool = False
    ) -> bool:
        """Mark the run ``needs_upgrade`` with *reason* (its input and head kept), if
        no runner holds it and it is not completed; *only_if_idle*: only a
        hibernated or already stranded run (a running or waiting run may be continued
        by a process that has its definition; a failed run keeps its failure).
        False when not marked."""
        statuses = (
            (RunStatus.HIBERNATED, RunStatus.NEEDS_UPGRADE)
            if only_if_idle
            else (*RunStatus.UPGRADABLE, RunStatus.RUNNING)
        )
        rows = self._rows().filter(unclaimed(), pk=coordination_id, status__in=statuses)
        fields = {"status": RunStatus.NEEDS_UPGRADE, "failure_reason": reason}
        return rows.update(**fields, updated_at=timezone.now()) == 1

    def _waiting_at(self, coordination_id: str, head: str) -> Any:
        return self._rows().filter(
            unclaimed(), pk=coordination_id, status=RunStatus.WAITING, head_snapshot_id=head
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


@lru_cache(maxsize=1)
def _run_fields() -> tuple[Any, ...]:
    """The fields of ``WorkflowRun``'s columns, in the model's order."""
    return tuple(models.WorkflowRun._meta.concrete_fields)


@lru_cache(maxsize=1)
def _run_attnames() -> tuple[str, ...]:
    return tuple(field.attname for field in _run_fields())


@lru_cache(maxsize=1)
def _converted_fields() -> tuple[tuple[int, Any], ...]:
    """The fields whose database values need converting (``from_db_value``), by index."""
    fields = enumerate(_run_fields())
    return tuple((index, field) for index, field in fields if hasattr(field, "from_db_value"))


#: What ``claim_or_create`` inserts: a SQL literal or a ``%s`` parameter per field.
_INSERTED = {
    "coordination_id": "%s",
    "workflow_name": "%s",
    "workflow_version": "%s",
    "status": f"'{RunStatus.RUNNING}'",
    "last_step": "''",
    "head_snapshot_id": "NULL",
    "idempotency_key": "NULL",
    "failure_reason": "''",
    "resume_input": "%s",
    "runner": "%s",
    "claimed_until": "STATEMENT_TIMESTAMP() + make_interval(secs => %s)",
    "attempts": "0",
    "wake_at": "NULL",
    "step_errors": "NULL",
    "parent_coordination_id": "NULL",
    "waiting_topic": "''",
    "created_at": "%s",
    "updated_at": "%s",
}


@lru_cache(maxsize=2)
def _claim_or_create_sql(with_input: bool) -> str:
    """PostgreSQL: insert the run claimed, or claim the existing one when it is
    unclaimed and of the same workflow (``claim``'s conditions and retry count);
    returns the row either way, none when refused."""
    fields = _run_fields()
    column = {field.name: f'"{field.column}"' for field in fields}
    assert set(_INSERTED) == set(column), "WorkflowRun's columns changed"
    runner, until, status = column["runner"], column["claimed_until"], column["status"]
    retry = f"CASE WHEN run.{status} = '{RunStatus.FAILED}' OR run.{runner} <> '' THEN 1 ELSE 0 END"
    taken = [
        f"{runner} = EXCLUDED.{runner}",
        f"{until} = EXCLUDED.{until}",
        f"{column['attempts']} = run.{column['attempts']} + {retry}",
        f"{column['updated_at']} = EXCLUDED.{column['updated_at']}",
    ]
    if with_input:
        taken.append(f"{column['resume_input']} = EXCLUDED.{column['resume_input']}")
    unclaimed = f"(run.{runner} = '' OR run.{until} IS NULL OR run.{until} < STATEMENT_TIMESTAMP())"
    return (
        f'INSERT INTO "{models.WorkflowRun._meta.db_table}" AS run '
        f"({', '.join(column[name] for name in _INSERTED)}) "
        f"VALUES ({', '.join(_INSERTED.values())}) "
        f"ON CONFLICT ({column['coordination_id']}) DO UPDATE SET {', '.join(taken)} "
        f"WHERE {unclaimed} AND run.{column['workflow_name']} = %s "
        f"AND run.{column['workflow_version']} = %s "
        # xmax = 0: a row version no transaction has locked or updated, one this
        # statement inserted (an ON CONFLICT update leaves its own xid there).
        f"RETURNING {', '.join(column[field.name] for field in fields)}, "
        '(run.xmax = 0) AS "created"'
    )


#: What ``create_statement`` inserts (unlisted columns as ``_INSERTED`` has them).
_CREATED = {
    **_INSERTED,
    "head_snapshot_id": "%s",
    "idempotency_key": "%s",
    "resume_input": "NULL",
    "runner": "''",
    "claimed_until": "NULL",
}


#: The columns of a run ``create_claimed_statement`` inserts that are the same for
#: every run (by field name; the statement's literals in ``_INSERTED``).
_NEW_RUN_VALUES = {
    "status": RunStatus.RUNNING,
    "last_step": "",
    "head_snapshot_id": None,
    "idempotency_key": None,
    "failure_reason": "",
    "resume_input": None,
    "claimed_until": None,
    "attempts": 0,
    "wake_at": None,
    "step_errors": None,
    "parent_coordination_id": None,
    "waiting_topic": "",
}
#: The columns that are each new run's own.
_NEW_RUN_OWN = {
    "coordination_id",
    "workflow_name",
    "workflow_version",
    "runner",
    "created_at",
    "updated_at",
}


@lru_cache(maxsize=2)
def _insert_new_sql(claimed: bool) -> str:
    """PostgreSQL: insert a run unless its coordination or idempotency key exists
    (``ON CONFLICT DO NOTHING``: any unique key).

    *claimed*: inserted claimed by a runner (``_INSERTED``, for
    ``create_claimed_statement``), returning ``claimed_until`` and ``created``. Else
    unclaimed at its head (``_CREATED``, for ``create_statement``), returning the row
    and ``created``, as ``_claim_or_create_sql``."""
    inserted = _INSERTED if claimed else _CREATED
    fields = _run_fields()
    column = {field.name: f'"{field.column}"' for field in fields}
    assert set(inserted) == set(column), "WorkflowRun's columns changed"
    assert set(_NEW_RUN_VALUES) | _NEW_RUN_OWN == set(column), "WorkflowRun's columns changed"
    if claimed:
        returning = f'{column["claimed_until"]}, TRUE AS "created"'
    else:
        returning = f'{", ".join(column[field.name] for field in fields)}, TRUE AS "created"'
    return (
        f'INSERT INTO "{models.WorkflowRun._meta.db_table}" '
        f"({', '.join(column[name] for name in inserted)}) "
        f"VALUES ({', '.join(inserted.values())}) ON CONFLICT DO NOTHING "
        f"RETURNING {returning}"
    )


@lru_cache(maxsize=64)
def _claim_sql(
    with_input: bool,
    check_head: bool,
    head_is_null: bool,
    running_only: bool,
    lazy_commit: bool = False,
    held_by: int = 0,
) -> str:
    """PostgreSQL: ``claim`` of an existing run on terms, returning the claimed row.

    *lazy_commit* commits the claim asynchronously (``synchronous_commit`` off for
    its own transaction only, set by the statement itself: one round trip). That
    saves the WAL flush, most of a claim's cost (about 0.8 ms of 1 ms here), and
    risks nothing a step relies on: WAL is flushed in order, so the step's snapshot,
    committed synchronously, makes the claim durable with it; a server crash before
    then forgets a claim whose step wrote nothing yet, as if the worker had died
    before claiming (the step runs again, as after any crash). A claim carrying
    resume input is never lazy: the input must outlive a crash.

    *held_by*: the run may also be held under that many hand-off tokens (parameters
    before the others, and again after the version: ``claim_statement_for``)."""
    fields = _run_fields()
    column = {field.name: f'"{field.column}"' for field in fields}
    runner, until, status = column["runner"], column["claimed_until"], column["status"]
    tokens = ", ".join(["%s"] * held_by)
    taken_over = f"run.{runner} <> ''" + (f" AND run.{runner} NOT IN ({tokens})" if held_by else "")
    retry = f"CASE WHEN run.{status} = '{RunStatus.FAILED}' OR ({taken_over}) THEN 1 ELSE 0 END"
    sets = [
        f"{column['attempts']} = run.{column['attempts']} + {retry}",
        f"{runner} = %s",
        f"{until} = STATEMENT_TIMESTAMP() + make_interval(secs => %s)",
        f"{column['updated_at']} = %s",
    ]
    if with_input:
        sets.append(f"{column['resume_input']} = %s")
    where = [
        f"run.{column['coordination_id']} = %s",
        f"run.{column['workflow_name']} = %s",
        f"run.{column['workflow_version']} = %s",
        f"(run.{runner} = '' OR run.{until} IS NULL OR run.{until} < STATEMENT_TIMESTAMP()"
        + (f" OR run.{runner} IN ({tokens}))" if held_by else ")"),
    ]
    if check_head:
        head = f"run.{column['head_snapshot_id']}"
        where.append(f"{head} IS NULL" if head_is_null else f"{head} = %s")
    if running_only:
        where.append(f"run.{status} = '{RunStatus.RUNNING}'")
    if lazy_commit:
        where.append("set_config('synchronous_commit', 'off', true) IS NOT NULL")
    return (
        f'UPDATE "{models.WorkflowRun._meta.db_table}" AS run SET {", ".join(sets)} '
        f"WHERE {' AND '.join(where)} "
        f"RETURNING {', '.join(f'run.{column[field.name]}' for field in fields)}"
    )
