"""The workflow engine: ``Workflow``, ``WorkflowDefinition``, and the step loop.

A workflow is a named, ordered list of steps; a *coordination* is one run of it. The
run's history is a chain of snapshots in a ``SnapshotStore``: a seed snapshot with the
initial state (``workflow.lastStep = ""``), then one per completed step, each derived
from the previous one (``parent_id``) and saved at the next ``seq``. The run's status
and its current runner live in a ``WorkflowRun`` row (``runs.py``).

``run()`` resumes from the latest snapshot (highest ``seq``): it executes the steps
after ``workflow.lastStep`` until one hibernates, finishes or fails, or the list ends.

* ``advance(state)``: snapshot, go on. ``hibernate(state)``: snapshot, status
  ``hibernated``, return ``Hibernated``; the next run starts at the following step.
* ``done(state)``: snapshot with ``workflow.done = "true"``, status ``completed``; a
  later run returns ``Completed`` without running anything (even after a middle step).
* ``fail(reason)``, or an exception on every attempt: status ``failed``, nothing
  persisted, so a later run executes the same step again.
* Falling off the end of the list is ``Completed``.

Two runners of one coordination cannot both advance it: ``run()`` first claims the run
record (one conditional ``UPDATE``); the loser gets ``ConcurrentRunError`` and writes
nothing. Each step snapshot is also saved with an explicit ``seq``, so a runner that
lost its lease and then tries to write a step another runner already wrote fails on
the store's unique ``(coordination, seq)`` instead of forking the chain.

What a run writes, statement by statement (each committed on its own). With the ORM
store on the run's PostgreSQL database: the start of ``run_local`` is one statement
(the claim, the latest snapshot and, for a run the claim creates, its seed:
``OrmSnapshotStore.open_run``); a plain step (``advance`` before the last step, while
the lease is younger than a third of its length) one ``INSERT`` of its snapshot, the
run record catching up later; a step that changes the run (the last one, ``done``,
``hibernate``, an approval, consumed input, a lease to renew) one statement that
saves its snapshot and updates the run, only while this runner holds it
(``save_advancing_run``). Elsewhere (SQLite, MariaDB, other stores) the claim, the
read and the seed are statements of their own, and a step that changes the run
saves its snapshot and updates the run in one transaction.

Steps must be idempotent: a retry repeats a step, and a crash between a step's side
effect and its snapshot repeats it on resume. ``ctx.idempotency_key`` helps.

The engine sits on top of the other workflow modules, and none of them imports it.
What they need of it lives below it and is re-exported here under the old names: the
results (``results``), the snapshot metadata keys (``metadata``) and the registry
(``registry``). Approvals reach a run through the registry, execution providers
through the ``execution.ExecutableWorkflow`` protocol.
"""

from __future__ import annotations

import contextvars
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn, cast

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections, transaction

from ..common.app_models import models
from ..common.user_input import check_resume_input
from .approvals.request import AwaitApproval, decision_on, request_from_snapshot
from .approvals.sweep import cancel_stale_approvals
from .cancellation import CancelOutcome, cancel_run, cancellation_of
from .children import (
    CHILDREN,
    ChildrenLostError,
    ChildResult,
    Spawn,
    children_results,
    continue_if_ready,
    notify_parent,
    spawned,
)
from .children import FINISHED as CHILD_FINISHED
from .claim_keeper import HeldClaim, claim_keeper
from .decisions import ApprovalDecision
from .execution import ExecutionUnavailableError, resolve_provider
from .forking import fork_snapshot
from .handoff import CARRY_LIMIT, Handoff
from .metadata import CANCELLED as CANCELLED_METADATA
from .metadata import LAST_STEP, WORKFLOW_DONE, WORKFLOW_NAME
from .patches import (
    NO_PATCHES,
    PATCHES_METADATA,
    PatchBook,
    patches_metadata,
    recorded_patches,
)
from .registry import VersionNotDefinedError, WorkflowRegistry, workflow_for, workflow_registry
from .results import (
    Cancelled,
    Completed,
    Failed,
    Hibernated,
    NeedsUpgrade,
    Running,
    StartedRun,
    Waiting,
    WaitingForChildren,
    WorkflowResult,
    paused,
)
from .runs import (
    HANDOFF_PREFIX,
    ClaimTerms,
    ConcurrentRunError,
    RunRecords,
    RunStatus,
    UnknownRunError,
    check_run_of,
    new_handoff_token,
    new_runner_token,
    run_lease,
)
from .snapshot import CheckpointQuery, WorkflowSnapshot, check_id, new_snapshot_id
from .step_timings import AttemptError, StepTiming, errors_json, parse_errors
from .steps import (
    Advance,
    Done,
    Fail,
    FunctionStep,
    Pause,
    StepContext,
    StepOutcome,
    WorkflowStep,
)
from .store import SnapshotConflictError, SnapshotStore, UnknownSnapshotError, snapshot_stores
from .transactions import write_transaction
from .upgrades import UPGRADE_METADATA, WorkflowUpgrade, upgrade_of, upgrade_registry

if TYPE_CHECKING:
    from ..models import WorkflowRun

__all__ = [
    "LAST_STEP",
    "WORKFLOW_DONE",
    "WORKFLOW_NAME",
    "Completed",
    "Failed",
    "Hibernated",
    "NeedsUpgrade",
    "Running",
    "StartedRun",
    "StepAttemptFailed",
    "StepTimeoutError",
    "Workflow",
    "WorkflowDefinition",
    "WorkflowRegistry",
    "WorkflowResult",
    "workflow_registry",
]

logger = logging.getLogger("flowwarden_django.workflows")


class StepAttemptFailed(Exception):
    """One attempt of a step failed and a later one may succeed: raised by
    ``run_local(attempt=...)`` for the provider to schedule the next attempt after the
    step's ``retry_delay``. Nothing was persisted."""

    def __init__(self, step: WorkflowStep, attempt: int, error: Exception) -> None:
        super().__init__(
            f"step {step.name!r} attempt {attempt}/{step.max_retries + 1} failed: "
            f"{type(error).__name__}: {error}"
        )
        self.step_name = step.name
        self.attempt = attempt
        self.retry_delay = float(step.retry_delay or 0)


class StepTimeoutError(TimeoutError):
    """A step attempt ran longer than its ``timeout``.

    The attempt counts as failed (and is retried within ``max_retries``). Python
    cannot stop a thread, so the timed-out attempt keeps running in its daemon thread
    until it returns on its own; its outcome is ignored. Steps with a timeout must
    therefore be idempotent like any other (the Celery provider can use a hard
    ``time_limit`` instead).
    """


# -- the workflow --------------------------------------------------------------------


def _as_step(value: WorkflowStep | Callable[..., StepOutcome]) -> WorkflowStep:
    if isinstance(value, WorkflowStep):
        return value
    if callable(value):
        return FunctionStep(value)
    raise TypeError(f"a workflow step must be a WorkflowStep or a function, not {value!r}")


class _CheckedSteps(tuple):
    """Steps ``_check_steps`` accepted: a provider rebuilds a registered workflow for
    every step it runs, without checking them again."""


def _check_steps(name: str, steps: Iterable[Any]) -> tuple[WorkflowStep, ...]:
    if isinstance(steps, _CheckedSteps):
        return steps
    checked = _CheckedSteps(_as_step(s) for s in steps)
    if not checked:
        raise ValueError(f"workflow {name!r} has no steps")
    seen: set[str] = set()
    for s in checked:
        if s.name in seen:
            raise ValueError(f"duplicate step name {s.name!r} in workflow {name!r}")
        seen.add(s.name)
    return checked


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > 255:
        raise ValueError(f"a workflow name is a non-blank string of <= 255 chars, not {name!r}")
    return name


def _check_version(version: object) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"a workflow version is an integer >= 1, not {version!r}")
    return version


class Workflow:
    """One coordination of a workflow: ``Workflow(name, coordination_id, steps, store)``.

    *steps* is a non-empty sequence of ``WorkflowStep`` (or functions, made into steps
    named after them) with unique names; *version* the version of the workflow's
    definition they are (a run records the version it started on, and only a
    ``Workflow`` of that version continues it: ``RunVersionError`` otherwise).
    *store* is a ``SnapshotStore`` or an alias of
    ``FLOWWARDEN["SNAPSHOT_STORES"]``. The ``WorkflowRun`` row lives in database
    *using*: by default the store's own database when it has one (``store.using``),
    else the router's choice.

    ``run()`` and ``resume(input=...)`` go through the configured execution provider
    (``FLOWWARDEN["WORKFLOW_EXECUTION"]``); ``run_local()`` is the in-process engine
    that providers call. ``Workflow.start(name, ...)`` starts a registered workflow
    at most once per idempotency key (see ``Workflow.define``).

    For async code: ``astart``, ``arun``, ``aresume`` and ``afork``, the same calls
    run in Django's thread-sensitive executor (``sync_to_async``).
    """

    def __init__(
        self,
        name: str,
        coordination_id: str,
        steps: Sequence[WorkflowStep | Callable[..., StepOutcome]],
        store: SnapshotStore | str = "default",
        *,
        using: str | None = None,
        version: int = 1,
    ) -> None:
        self._name = _check_name(name)
        self._version = _check_version(version)
        if not isinstance(coordination_id, str) or not coordination_id.strip():
            raise ValueError(f"coordination_id must be a non-blank string, not {coordination_id!r}")
        if len(coordination_id) > 255:
            raise ValueError("coordination_id is longer than 255 characters")
        self._coordination_id = coordination_id
        self._steps = _check_steps(name, steps)
        if not isinstance(store, SnapshotStore | str):
            raise TypeError(f"store must be a SnapshotStore or an alias, not {store!r}")
        self._store = store
        self._using = using
        #: The seed and record ``WorkflowDefinition.start`` has just written, for the
        #: provider's first ``run()`` (a remote provider then need not read them back).
        self.started_with: tuple[WorkflowSnapshot, WorkflowRun] | None = None

    def __repr__(self) -> str:
        return f"<Workflow {self._name!r} {self._coordination_id!r}>"

    # -- accessors -------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def coordination_id(self) -> str:
        return self._coordination_id

    @property
    def version(self) -> int:
        return self._version

    @property
    def steps(self) -> tuple[WorkflowStep, ...]:
        return self._steps

    @property
    def store(self) -> SnapshotStore:
        if isinstance(self._store, str):
            return snapshot_stores[self._store]
        return self._store

    @property
    def runs(self) -> RunRecords:
        """The ``WorkflowRun`` records this workflow reads and writes."""
        return RunRecords(self._using or getattr(self.store, "using", None))

    def step_named(self, name: str) -> WorkflowStep | None:
        return next((s for s in self._steps if s.name == name), None)

    # -- running ---------------------------------------------------------------------

    def run(self, initial_state: Any = None) -> WorkflowResult:
        """Run (or continue) this coordination with the configured execution provider.

        *initial_state* only matters on the very first run (it becomes the seed
        snapshot); afterwards the latest snapshot's state is used.
        ``ConcurrentRunError`` when another runner holds the run. Store errors
        propagate.
        """
        return resolve_provider().run(self, initial_state, None)

    def resume(self, input: Any = None) -> WorkflowResult:
        """Continue a paused (or failed) run, handing *input* (JSON-serialisable: a
        decision, a payload) to the next step as ``ctx.input``.

        The input is stored on the run with the claim, and cleared once the step that
        received it has its snapshot; if that step fails, the retry sees it again. A
        completed run returns ``Completed`` and runs nothing. ``UserJSONError`` (a
        ``ValueError``) when *input* is not plain JSON within the limits of
        ``common.user_input``; nothing is stored then.
        """
        if input is not None:
            check_resume_input(input)
        return resolve_provider().run(self, None, input)

    async def arun(self, initial_state: Any = None) -> WorkflowResult:
        """``run()`` from async code: same result, errors and snapshot signals.

        Runs ``run()`` through ``sync_to_async(thread_sensitive=True)``: the claim, the
        snapshots and the run record are ORM work, which Django confines to the
        thread-sensitive executor (one connection per database, shared with the
        request's other sync code). With the in-process provider the steps run there
        too, so a long step holds that thread (and every other thread-sensitive call
        of the process) until it returns; under ASGI run long steps on the Celery or
        Temporal provider, where this returns ``Running`` once the work is queued.
        """
        return await sync_to_async(self.run, thread_sensitive=True)(initial_state)

    async def aresume(self, input: Any = None) -> WorkflowResult:
        """``resume(input)`` from async code: same result, errors and snapshot signals.

        ``thread_sensitive=True``, as ``arun``: it claims the run, stores *input* and
        (in-process) runs the steps in the thread-sensitive executor.
        """
        return await sync_to_async(self.resume, thread_sensitive=True)(input)

    def cancel(self, reason: str = "", *, by: str = "") -> CancelOutcome:
        """Cancel this run: it never runs another step (see ``workflows.cancellation``);
        *by* names who cancelled (kept with the reason and in the approvals' audit).
        ``CancelOutcome.cancelled`` is False when it was already completed or
        cancelled. ``UnknownRunError`` when there is no run."""
        return cancel_run(self, reason, by=by)

    async def acancel(self, reason: str = "", *, by: str = "") -> CancelOutcome:
        """``cancel()`` from async code."""
        return await sync_to_async(self.cancel, thread_sensitive=True)(reason, by=by)

    def run_local(
        self,
        initial_state: Any = None,
        input: Any = None,
        *,
        max_steps: int | None = None,
        attempt: int | None = None,
    ) -> WorkflowResult:
        """The in-process engine: claim the run, execute steps in this thread, release.

        Execution providers call this (never ``run()``). *max_steps* stops after that
        many steps with ``Running`` (the run stays ``running`` and unclaimed) so a
        provider can execute one step per task. *attempt* (1-based, capped at the
        step's last) runs only that attempt of a step, for providers that schedule the
        retries themselves (Temporal): an attempt that fails before the last raises
        ``StepAttemptFailed`` and persists nothing; the last one fails the run as usual.
        """
        result, _ = self._run_local(initial_state, input, max_steps, attempt)
        return result

    def run_handing_off(
        self,
        handed: Handoff | None = None,
        *,
        input: Any = None,
        attempt: int | None = None,
        hand_off_to: str | None = None,
    ) -> tuple[WorkflowResult, Handoff | None]:
        """One step of the run, for an execution provider that hands the run from step
        to step (``handoff``; *attempt* as ``run_local`` has it).

        The step runs from *handed* (its token and carried head) when it may, else it
        claims the run (on ``_claim_terms``, which name the tokens it may take it
        from). When the run stays ``running``, the step's save keeps it held for the
        next step, under *hand_off_to* (default: a new token): returns the
        ``Handoff`` to carry there (``None``: the run was let go)."""
        return self._run_local(
            None, input, 1, attempt, handed=handed, hand_off=hand_off_to or new_handoff_token()
        )

    def _run_local(
        self,
        initial_state: Any,
        input: Any,
        max_steps: int | None,
        attempt: int | None,
        *,
        handed: Handoff | None = None,
        hand_off: str | None = None,
    ) -> tuple[WorkflowResult, Handoff | None]:
        if max_steps is not None and max_steps < 1:
            raise ValueError("max_steps must be >= 1")
        if attempt is not None and attempt < 1:
            raise ValueError("attempt must be >= 1")
        if input is not None:  # a task argument or a Temporal signal: checked here too
            check_resume_input(input)
        runs = self.runs
        lease = run_lease()
        opened = None
        if handed is not None and input is None and (attempt or 1) == 1:
            opened = self._open_handed(runs, handed, lease)
        if opened is not None:
            token = opened.record.runner
        else:
            token = new_runner_token()
            opened = self._open(runs, token, lease, input, initial_state)
        execution = _Execution(self, runs, token, lease, opened.record, attempt)
        execution.hand_off_to = hand_off
        if opened.handed_at is not None:
            # Young for what is left of a third of the lease since the hand-off.
            young = lease.total_seconds() / 3 - (time.time() - opened.handed_at)
            execution.young_until = time.monotonic() + young
        kept = execution.keep_alive()
        try:
            result = execution.run(initial_state, max_steps, opened)
        except ConcurrentRunError:
            # Cancelled while a step ran: the step's result was discarded.
            cancelled = self._if_cancelled(runs)
            if cancelled is None:
                raise
            result = cancelled
        finally:
            if kept:
                claim_keeper.drop(execution.claim.key)
            execution.release()
        if opened.record.parent_coordination_id and result.status in CHILD_FINISHED:
            notify_parent(opened.record)
        return result, execution.handoff()

    def _open_handed(self, runs: RunRecords, handed: Handoff, lease: Any) -> _Opened | None:
        """The run as *handed* left it, without a statement: its token and carried
        head, when the hand-off is of this version and still young (see ``handoff``);
        ``None``: claim the run."""
        uncarry = getattr(self.store, "uncarry", None)
        if handed.head is None or uncarry is None or handed.version != self._version:
            return None
        if handed.age() >= lease.total_seconds() / 3:
            return None
        try:
            head = uncarry(self._coordination_id, handed.head)
        except Exception:  # not readable here (another key, say): the claim reads it
            logger.debug("workflow %s: carried head unreadable", self._name, exc_info=True)
            return None
        record = models.WorkflowRun(
            coordination_id=self._coordination_id,
            workflow_name=self._name,
            workflow_version=self._version,
            status=RunStatus.RUNNING,
            last_step=head.metadata.get(LAST_STEP, ""),
            head_snapshot_id=head.id,
            runner=handed.token,
            attempts=handed.attempts,
            parent_coordination_id=handed.parent_coordination_id,
        )
        record._state.adding = False
        record._state.db = runs.db
        return _Opened(record, head, head_known=True, handed_at=handed.at)

    def _if_cancelled(self, runs: RunRecords) -> Cancelled | None:
        """``Cancelled`` when the run is (now) cancelled, else ``None``."""
        try:
            record = runs.get(self._coordination_id)
        except DatabaseError:
            return None
        if record is None or record.status != RunStatus.CANCELLED:
            return None
        head = self.store.latest(self._coordination_id)
        state = None if head is None else head.state
        return Cancelled(state, self._coordination_id, record.failure_reason)

    def _claim_terms(self) -> ClaimTerms | None:
        """The terms an execution provider's step runner claims the run on (it never
        creates one); ``None`` (the engine's own runs): claim or create the run."""
        return None

    def _refused(self, runs: RunRecords, terms: ClaimTerms) -> NoReturn:
        """Raise why a claim on *terms* was refused: ``UnknownRunError``,
        ``RunConflictError``, what ``_stale`` raises, else ``ConcurrentRunError``."""
        cid = self._coordination_id
        current = runs.get(cid)
        if current is None:
            raise UnknownRunError(f"no workflow run {cid!r}")
        check_run_of(current, self._name, self._version)
        self._stale(current, terms)
        raise ConcurrentRunError(cid, current.runner, current.claimed_until)

    def _stale(self, current: WorkflowRun, terms: ClaimTerms) -> None:
        """Raise when run *current* does not meet *terms* (a step runner's claim was
        refused for it, not because the run is held); subclasses say why."""

    def _open(
        self, runs: RunRecords, token: str, lease: Any, input: Any, initial_state: Any
    ) -> _Opened:
        """``_take``, and where the store can (the ORM store on the run's PostgreSQL
        database), in the claim's own statement: the seed of a run the claim creates
        (``OrmSnapshotStore.open_run``), or the latest snapshot of a run claimed on
        terms (``OrmSnapshotStore.claim_run``)."""
        store = self.store
        cid = self._coordination_id
        terms = self._claim_terms()
        try:
            if terms is None:
                opened = self._open_or_seed(runs, store, token, lease, input, initial_state)
            else:
                opened = self._open_on_terms(runs, store, token, lease, input, terms)
        except DatabaseError:
            from .releases import release_after_failed_claim

            release_after_failed_claim(runs, cid, token)
            raise
        if opened is not None:
            return opened
        return _Opened(self._take(runs, token, lease, input))

    def _open_or_seed(
        self,
        runs: RunRecords,
        store: SnapshotStore,
        token: str,
        lease: Any,
        input: Any,
        initial_state: Any,
    ) -> _Opened | None:
        opener = getattr(store, "open_run", None)
        if opener is None:
            return None
        cid, name = self._coordination_id, self._name
        version = self._version
        seed = None
        # Most likely a new run: creating it is cheaper than the claim's upsert.
        new = (
            runs.create_claimed_statement(cid, name, token, lease, version)
            if initial_state is not None and input is None
            else None
        )
        if new is not None:
            seed = _seed_snapshot(self, initial_state)
            opened = opener(seed, new.statement, run_using=runs.db)
            if opened is None:
                return None
            row, seeded = opened
            if row is not None:
                return _Opened.of(new.record(row), seeded)
            # The run exists (nothing was written): claim it.
        claim = runs.claim_statement(cid, name, token, lease, input, version)
        if claim is None:
            return None
        opened = opener(seed or _seed_snapshot(self, initial_state), claim, run_using=runs.db)
        if opened is None:
            return None
        row, seeded = opened
        if row is None:
            runs.refused(cid, name, version)  # raises, unless the run was deleted meanwhile
            return None
        return _Opened.of(runs.claimed(row), seeded)

    def _open_on_terms(
        self,
        runs: RunRecords,
        store: SnapshotStore,
        token: str,
        lease: Any,
        input: Any,
        terms: ClaimTerms,
    ) -> _Opened | None:
        claimer = getattr(store, "claim_run", None)
        cid, name = self._coordination_id, self._name
        statement = (
            None
            if claimer is None
            else runs.claim_statement_for(cid, name, token, lease, terms, input, self._version)
        )
        if statement is None:
            return None
        found = claimer(statement, run_using=runs.db)
        if found is None:
            return None
        row, latest = found
        if row is None:
            self._refused(runs, terms)
        return _Opened(runs.claimed(row), latest, head_known=True)

    def _take(self, runs: RunRecords, token: str, lease: Any, input: Any) -> WorkflowRun:
        """``_claim``, and when a database error breaks it off, let go of the claim it
        may have taken already (the ``UPDATE`` committed, then reading the row back
        failed): nobody else knows *token*, so the run would wait for the whole lease."""
        try:
            return self._claim(runs, token, lease, input)
        except DatabaseError:
            from .releases import release_after_failed_claim

            release_after_failed_claim(runs, self._coordination_id, token)
            raise

    def _claim(self, runs: RunRecords, token: str, lease: Any, input: Any) -> WorkflowRun:
        terms = self._claim_terms()
        if terms is None:
            return runs.claim_or_create(
                self._coordination_id,
                self._name,
                token,
                lease,
                resume_input=input,
                workflow_version=self._version,
            )
        try:
            return runs.claim(
                self._coordination_id,
                token,
                lease,
                resume_input=input,
                workflow_name=self._name,
                workflow_version=self._version,
                where=terms.as_q(),
                held_by=terms.held_by,
            )
        except ConcurrentRunError:
            self._refused(runs, terms)

    def seed(self, initial_state: Any = None) -> WorkflowSnapshot:
        """Make sure the run exists and has its seed snapshot; return the latest snapshot.

        For execution providers that run elsewhere: after this, any process can
        continue the run without being handed *initial_state*.
        ``ConcurrentRunError`` when another runner holds the run.
        """
        runs = self.runs
        lease = run_lease()
        token = new_runner_token()
        try:
            self._take(runs, token, lease, None)
        except ConcurrentRunError as exc:
            # Running from step to step (``handoff``): seeded long ago, and held
            # between steps for the whole run; its head is read without a claim.
            head = self.store.latest(self._coordination_id)
            if head is None or not (exc.runner or "").startswith(HANDOFF_PREFIX):
                raise
            return head
        try:
            head = self.store.latest(self._coordination_id)
            if head is None:
                head = _save_seed(self, initial_state)
                runs.update(self._coordination_id, token, lease, head_snapshot_id=head.id)
            return head
        finally:
            from .releases import release_or_defer

            release_or_defer(runs, self._coordination_id, token, {})

    # -- reading the run -------------------------------------------------------------

    def run_record(self) -> WorkflowRun | None:
        """The ``WorkflowRun`` row, or ``None`` before the first run."""
        return self.runs.get(self._coordination_id)

    def status(self) -> str | None:
        """``running``, ``hibernated``, ``waiting``, ``completed``, ``failed``, or ``None``."""
        record = self.run_record()
        return None if record is None else record.status

    def history(self) -> list[WorkflowSnapshot]:
        """Every snapshot of the coordination, in ``seq`` order (forks included)."""
        snapshots = self.store.list(CheckpointQuery.for_coordination(self._coordination_id))
        return sorted(snapshots, key=lambda s: s.seq or 0)

    def current_result(self) -> WorkflowResult | None:
        """The run's result as of now, from its record and latest snapshot (``None``
        before the first run). Runs nothing."""
        record = self.run_record()
        if record is None:
            return None
        head = self.store.latest(self._coordination_id)
        state = None if head is None else head.state
        last_step = "" if head is None else head.metadata.get(LAST_STEP, "")
        cid = self._coordination_id
        if record.status == RunStatus.COMPLETED:
            return Completed(state, cid)
        if record.status == RunStatus.CANCELLED:
            return Cancelled(state, cid, record.failure_reason)
        if record.status in RunStatus.PAUSED:
            return paused(state, cid, last_step, record.status, record.wake_at)
        if record.status == RunStatus.NEEDS_UPGRADE:
            return NeedsUpgrade(state, cid, last_step, record.failure_reason)
        if record.status == RunStatus.FAILED:
            index = self._start_index(last_step)
            failed = (
                self._steps[index].name
                if index is not None and index < len(self._steps)
                else last_step
            )
            return Failed(state, cid, failed, record.failure_reason)
        return Running(state, cid, last_step)

    def _start_index(self, last_step: str) -> int | None:
        """The index of the step after *last_step*; ``None`` when *last_step* is not
        a step of this definition (the run then needs an upgrade: it is never
        started over from the first step)."""
        if not last_step:
            return 0
        for index, s in enumerate(self._steps):
            if s.name == last_step:
                return index + 1
        return None

    def _missing_step_reason(self, last_step: str) -> str:
        return (
            f"the step this run stands after, {last_step!r}, is not a step of version "
            f"{self._version} of workflow {self._name!r} "
            f"(its steps: {', '.join(s.name for s in self._steps)}); define that version "
            "as it was (a changed definition takes a new version), or declare an upgrade "
            "that maps the step and run `manage.py flowwarden_workflows upgrade`"
        )

    # -- snapshots -------------------------------------------------------------------

    def fork(self, snapshot_id: str, new_state: Any) -> WorkflowSnapshot:
        """Branch the coordination off one of its snapshots: a new snapshot whose parent
        is *snapshot_id*, with *new_state*, saved at the next ``seq``. It becomes the
        latest snapshot, so the next ``run()`` continues from it (at the step after the
        source's ``workflow.lastStep``): a way to redo steps from an earlier point.
        A run waiting for an approval becomes ``hibernated`` and the approval is
        cancelled (``forking.fork_snapshot``)."""
        source = self.store.load(check_id(snapshot_id, "snapshot_id"))
        if source is None or source.coordination_id != self._coordination_id:
            raise UnknownSnapshotError(
                f"coordination {self._coordination_id!r} has no snapshot {snapshot_id!r}"
            )
        return fork_snapshot(self.store, snapshot_id, new_state, using=self.runs.db)

    async def afork(self, snapshot_id: str, new_state: Any) -> WorkflowSnapshot:
        """``fork(snapshot_id, new_state)`` from async code: same snapshot, errors
        (``UnknownSnapshotError``, ...) and ``snapshot_forked`` signal.

        ``thread_sensitive=True``: the fork loads the source, saves the child, moves
        the run and cancels a pending approval through the ORM, and tells the provider
        on commit (``transaction.on_commit``): on the thread-sensitive executor's
        connection, inside the surrounding sync code's transaction if there is one.
        """
        return await sync_to_async(self.fork, thread_sensitive=True)(snapshot_id, new_state)

    def delete_all_snapshots(self) -> int:
        """Delete every snapshot of the coordination (the next run starts over)."""
        return self.store.delete_coordination(self._coordination_id)

    # -- registered workflows --------------------------------------------------------

    @classmethod
    def define(
        cls,
        name: str,
        steps: Sequence[WorkflowStep | Callable[..., StepOutcome]],
        store: SnapshotStore | str = "default",
        *,
        using: str | None = None,
        register: bool = True,
        version: int = 1,
    ) -> WorkflowDefinition:
        """Declare a workflow by name (registered, so ``Workflow.start(name)`` and
        ``Workflow.for_coordination(cid)`` find it, in any process that imports it).

        *version* (default 1: what every run made before versions records) numbers
        this definition of the workflow. Define a new version whenever a change would
        not fit runs already under way (a step removed, renamed or moved, a state
        that changes shape), and keep the old one defined beside it until its runs
        are finished or upgraded: ``Workflow.start`` starts runs on the highest
        version, and each run continues on its own. See "Upgrading workflows" in
        the README."""
        definition = WorkflowDefinition(name, steps, store, using=using, version=version)
        if register:
            workflow_registry.register(definition)
        return definition

    @classmethod
    def define_upgrade(
        cls,
        name: str,
        *,
        from_version: int,
        to_version: int,
        steps: Mapping[str, str | None] | None = None,
        state: Callable[[Any], Any] | None = None,
    ) -> WorkflowUpgrade:
        """Declare how runs of version *from_version* of workflow *name* move to
        *to_version*: *steps* maps the step a run stands after to the step of the new
        version it stands after then (``None``: before the first step; a name both
        versions have needs no entry), *state* turns its state into the new one's.
        Applied by ``manage.py flowwarden_workflows upgrade`` or the admin (see
        ``workflows.upgrades``), never on its own."""
        upgrade = WorkflowUpgrade(name, from_version, to_version, steps or {}, state)
        upgrade_registry.register(upgrade)
        return upgrade

    @classmethod
    def start(
        cls,
        name: str,
        initial_state: Any = None,
        *,
        idempotency_key: str | None = None,
        coordination_id: str | None = None,
    ) -> StartedRun:
        """Start registered workflow *name* at most once per *idempotency_key*; see
        ``WorkflowDefinition.start``."""
        # Workflow.define registers WorkflowDefinitions.
        definition = cast(WorkflowDefinition, workflow_registry.get(name))
        return definition.start(
            initial_state, idempotency_key=idempotency_key, coordination_id=coordination_id
        )

    @classmethod
    async def astart(
        cls,
        name: str,
        initial_state: Any = None,
        *,
        idempotency_key: str | None = None,
        coordination_id: str | None = None,
    ) -> StartedRun:
        """``Workflow.start(name, ...)`` from async code (an ``async def`` view):
        same ``StartedRun``, errors (``LookupError`` for an unknown name, store and
        database errors) and snapshot signals.

        Runs ``start`` through ``sync_to_async(thread_sensitive=True)``: the run row
        and its seed are written in one ``transaction.atomic``, and the run then goes
        through the execution provider, all ORM work that must share the
        thread-sensitive executor's connections. In-process, the first steps run in
        that thread before this returns (see ``arun``).
        """
        start = sync_to_async(cls.start, thread_sensitive=True)
        return await start(
            name, initial_state, idempotency_key=idempotency_key, coordination_id=coordination_id
        )

    @classmethod
    def for_coordination(cls, coordination_id: str, *, using: str | None = None) -> Workflow:
        """The ``Workflow`` of an existing run, from its record's registered workflow.
        ``UnknownRunError`` / ``LookupError`` when the run or its workflow is unknown."""
        return cast(Workflow, workflow_for(coordination_id, using=using))


def _seed_snapshot(workflow: Workflow, initial_state: Any) -> WorkflowSnapshot:
    return WorkflowSnapshot(
        id=new_snapshot_id(),
        coordination_id=workflow.coordination_id,
        state=initial_state,
        agent_name=workflow.name,
        seq=1,
        metadata={LAST_STEP: "", WORKFLOW_NAME: workflow.name, WORKFLOW_DONE: "false"},
    )


def _create_seeded(
    workflow: Workflow, runs: RunRecords, initial_state: Any, idempotency_key: str | None
) -> tuple[WorkflowSnapshot, WorkflowRun] | None:
    """Create the run at its seed and write the seed in ONE statement where the store
    can (the ORM store on the run's PostgreSQL database, outside a transaction):
    ``(seed, record)``. ``None`` when that path does not apply or the coordination
    or key exists (``WorkflowDefinition.start`` then goes the long way, which finds
    the existing run)."""
    opener = getattr(workflow.store, "open_run", None)
    if opener is None:
        return None
    cid = workflow.coordination_id
    seed = _seed_snapshot(workflow, initial_state)
    statement = runs.create_statement(
        cid,
        workflow.name,
        seed.id,
        idempotency_key=idempotency_key,
        workflow_version=workflow.version,
    )
    if statement is None:
        return None
    opened = opener(seed, statement, run_using=runs.db)
    if opened is None or opened[0] is None:
        return None
    row, seeded = opened
    record = runs.claimed(row)
    if seeded is None:  # the coordination had snapshots: the run continues the latest
        return _point_at_head(workflow, runs, record, initial_state), record
    return seeded, record


def _point_at_head(
    workflow: Workflow, runs: RunRecords, record: WorkflowRun, initial_state: Any
) -> WorkflowSnapshot:
    """Point the run just created at its coordination's latest snapshot (a seed of
    *initial_state* when there is none) and return that head."""
    head = workflow.store.latest(workflow.coordination_id) or _save_seed(workflow, initial_state)
    runs.set_head(workflow.coordination_id, head.id)
    record.head_snapshot_id = head.id
    return head


def _save_seed(workflow: Workflow, initial_state: Any) -> WorkflowSnapshot:
    try:
        return workflow.store.save(_seed_snapshot(workflow, initial_state))
    except SnapshotConflictError as exc:
        raise ConcurrentRunError(workflow.coordination_id) from exc


class _Opened(NamedTuple):
    """A claimed run, and what the claim's statement wrote or read of its snapshots:
    *head* is the latest snapshot when *head_known* (``None``: it has none), and the
    seed that statement wrote when *seeded*."""

    record: WorkflowRun
    head: WorkflowSnapshot | None = None
    head_known: bool = False
    seeded: bool = False
    #: When the run was handed to this execution (``time.time()``), if it was.
    handed_at: float | None = None

    @classmethod
    def of(cls, record: WorkflowRun, seeded: WorkflowSnapshot | None) -> _Opened:
        """*record*, claimed by a statement that wrote *seeded* (``None``: no seed)."""
        if seeded is None:
            return cls(record)
        return cls(record, seeded, head_known=True, seeded=True)


class _Execution:
    """One claimed ``run_local`` call: the step loop and its run-record writes."""

    def __init__(
        self,
        workflow: Workflow,
        runs: RunRecords,
        token: str,
        lease: Any,
        record: WorkflowRun,
        attempt: int | None = None,
    ) -> None:
        self.workflow = workflow
        #: The one attempt to run of each step (its provider retries), else all of them.
        self.attempt = attempt
        self.runs = runs
        self.token = token
        self.lease = lease
        self.record = record
        self.cid = workflow.coordination_id
        self.name = workflow.name
        #: Whether the run record was already released (finished) by this execution.
        self.released = False
        #: The store, resolved once (an alias is not looked up again for every step).
        self.store = workflow.store
        #: The head and last step not yet written to the run record (see ``persist``).
        self.unsynced: dict[str, Any] = {}
        #: How the step just executed ran (``execute``), recorded with its snapshot.
        self.timing: StepTiming | None = None
        self.lease_seconds = lease.total_seconds()
        #: Whether a step declares patches (``ctx.patched``): only then, or when the
        #: run recorded answers, does a step get a ``PatchBook``.
        self.patching = any(s.patches for s in workflow.steps)
        #: Until when (``time.monotonic()``) the lease is young: a third of it after it
        #: was last taken or renewed. Plain steps before then leave the run record alone.
        self.young_until = time.monotonic() + self.lease_seconds / 3
        #: The token a step that leaves the run running hands it on to (``handoff``).
        self.hand_off_to: str | None = None
        #: The hand-off its last step made: when (``time.time()``) and its snapshot.
        self.handed: tuple[float, WorkflowSnapshot] | None = None
        #: The claim the keeper renews, under a key of this execution's own: two
        #: copies of one handed step run under one token (``claim_keeper``).
        self.claim = HeldClaim(
            runs.db, self.cid, token, lease, on_renewed=self.renewed, key=f"{token}#{id(self)}"
        )

    def handoff(self) -> Handoff | None:
        """The ``Handoff`` this execution's last step made, carrying its snapshot when
        the store can (``carry``), else ``None``."""
        if self.handed is None:
            return None
        at, head = self.handed
        carry = getattr(self.store, "carry", None)
        try:
            carried = None if carry is None else carry(head, CARRY_LIMIT)
        except Exception:  # the next step reads it with its claim
            carried = None
        return Handoff(
            coordination_id=self.cid,
            token=cast(str, self.hand_off_to),
            version=self.workflow.version,
            at=at,
            head=carried,
            parent_coordination_id=self.record.parent_coordination_id,
            attempts=self.record.attempts,
        )

    def renewed(self, sent: float | None = None) -> None:
        """Note that the lease was renewed by a statement sent at *sent*
        (``time.monotonic()``; default: just now)."""
        at = time.monotonic() if sent is None else sent
        # The claim keeper's thread calls this too: a float assignment, and never back.
        self.young_until = max(self.young_until, at + self.lease_seconds / 3)

    def keep_alive(self) -> bool:
        """Have the claim keeper renew this execution's claim while it runs; False
        when the claim was taken inside an open transaction (see ``claim_keeper``)."""
        if connections[self.runs.db].in_atomic_block:
            return False
        claim_keeper.hold(self.claim)
        return True

    def copy_holds(self) -> bool:
        """Whether another execution of this process runs the same handed step under
        this one's token (a duplicate task, say): the run is that copy's to save,
        release or fail, not this one's."""
        return claim_keeper.held_elsewhere(self.claim)

    def update(self, **fields: Any) -> None:
        self.runs.update(self.cid, self.token, self.lease, **{**self.unsynced, **fields})
        self.unsynced = {}
        self.renewed()

    def finish(self, **fields: Any) -> None:
        self.runs.finish(self.cid, self.token, **{**self.unsynced, **fields})
        self.unsynced = {}
        self.released = True

    def release(self) -> None:
        """Let go of the run if still held, writing the head it has not written yet.

        Never raises: the caller's own error (or result) is what matters. When the
        database does not answer, the release is left to ``pending_releases``, which
        makes it (leaving ``updated_at`` alone, so the sweep takes the run at once)
        when the database is back.
        """
        if self.released:
            return
        if self.copy_holds():
            # Let go of it under the other copy, and its step's save would be refused.
            self.released = True
            return
        from .releases import release_or_defer

        self.released = True
        release_or_defer(self.runs, self.cid, self.token, self.unsynced)
        self.unsynced = {}

    def run(
        self, initial_state: Any, max_steps: int | None, opened: _Opened | None = None
    ) -> WorkflowResult:
        """Execute the steps; *opened*: what the claim's statement wrote or read
        (``Workflow._open``): the seed, which the run record has yet to point at, or
        the latest snapshot."""
        wf, record = self.workflow, self.record
        head: WorkflowSnapshot | None
        if opened is not None and opened.seeded:
            head = opened.head
            assert head is not None
            self.unsynced.update(head_snapshot_id=head.id, last_step="")
            record.head_snapshot_id = head.id
        elif opened is not None and opened.head_known:
            head = opened.head
        else:
            head = self.store.latest(self.cid)
        if head is None:
            seed = _seed_snapshot(wf, initial_state)
            try:
                if record.status == RunStatus.RUNNING and self.young():
                    # A run just made (or running): the seed is a plain step's write.
                    head = self.save_plain(seed, "")
                else:
                    fields = {
                        "head_snapshot_id": seed.id,
                        "last_step": "",
                        "status": RunStatus.RUNNING,
                    }
                    head = self._save_step(seed, fields)
            except SnapshotConflictError as exc:
                raise ConcurrentRunError(self.cid) from exc
            record.head_snapshot_id, record.status = head.id, RunStatus.RUNNING
        last_step = head.metadata.get(LAST_STEP, "")
        pending_input = record.resume_input

        if record.status == RunStatus.CANCELLED:  # a fork after it changes nothing
            return self.cancelled(head)
        if head.metadata.get(WORKFLOW_DONE) == "true":
            return self.complete(head, pending_input)
        if CANCELLED_METADATA in head.metadata:
            if record.status == RunStatus.COMPLETED:  # it completed while being cancelled
                return self.complete(head, pending_input)
            return self.cancelled(head)
        start = wf._start_index(last_step)
        if start is None or (UPGRADE_METADATA in head.metadata and self.upgraded_away(head)):
            return self.needs_upgrade(head, last_step)
        asked, decision = self.decision_asked(head, pending_input)
        if asked is not None:
            return asked
        if decision is not None:
            pending_input = decision.as_input()
        children: tuple[ChildResult, ...] = ()
        first_state = head.state
        if CHILDREN in head.metadata:
            try:
                found = children_results(self.cid, head, self.runs.db)
            except ChildrenLostError as exc:
                logger.error("workflow %s (%s): %s", self.name, self.cid, exc)
                self.finish(status=RunStatus.FAILED, failure_reason=str(exc))
                return Failed(head.state, self.cid, last_step, str(exc))
            if found is None:  # run or resumed early: it waits for them
                self.finish(status=RunStatus.WAITING_CHILDREN, head_snapshot_id=head.id)
                # The last child may have finished while this runner held the run.
                continue_if_ready(self.cid, self.runs.db)
                return WaitingForChildren(head.state, self.cid, last_step)
            children = found
            then = (spawned(head) or {}).get("then")
            if then and isinstance(head.state, dict):
                first_state = {**head.state, then: [child.as_dict() for child in found]}
        if start >= len(wf.steps):
            return self.complete(head, pending_input)
        if (
            record.status == RunStatus.WAITING
            and pending_input is None
            and record.head_snapshot_id == head.id
        ):
            # Waiting for a decision: only resume(input=...) continues it (or a fork,
            # which moves the latest snapshot off the one that asked).
            self.finish()
            return Waiting(head.state, self.cid, last_step)
        if record.status != RunStatus.RUNNING or record.head_snapshot_id != head.id:
            woken = {"wake_at": None} if record.wake_at is not None else {}
            self.update(
                status=RunStatus.RUNNING, head_snapshot_id=head.id, last_step=last_step, **woken
            )

        last = len(wf.steps) - 1
        for executed, index in enumerate(range(start, last + 1)):
            if max_steps is not None and executed >= max_steps:
                self.finish()
                return Running(head.state, self.cid, last_step, head.id)
            current = wf.steps[index]
            book = None
            if self.patching or PATCHES_METADATA in head.metadata:
                book = PatchBook(recorded_patches(head.metadata), wf.steps, index)
            state = first_state if executed == 0 else head.state
            outcome = self.execute(
                current, state, pending_input, decision, book or NO_PATCHES, children
            )
            if isinstance(outcome, Fail):
                if self.copy_holds():
                    # The other copy's attempt decides: this one wrote nothing.
                    raise ConcurrentRunError(self.cid, self.token)
                failed = {"failure_reason": outcome.reason}
                if self.record.step_errors is not None:  # this round's errors: forgotten
                    failed["step_errors"] = None
                self.finish(status=RunStatus.FAILED, **failed)
                return Failed(head.state, self.cid, current.name, outcome.reason)
            # The last step this execution may run lets go of the run with its snapshot.
            releases = max_steps is not None and executed + 1 >= max_steps
            head = self.persist(
                head,
                current.name,
                outcome,
                consumed_input=pending_input is not None,
                completes=index == last,
                releases=releases,
                patches=None if book is None else book.after(current),
            )
            last_step = current.name
            pending_input = decision = None
            children = ()
            if isinstance(outcome, Spawn):
                # Its children may have run (in-process) and continued it meanwhile.
                return self.workflow.current_result() or paused(
                    head.state, self.cid, current.name, outcome.status
                )
            if isinstance(outcome, Pause):
                wake_at = getattr(outcome, "wake_at", None)
                return paused(head.state, self.cid, current.name, outcome.status, wake_at)
            if index == last or isinstance(outcome, Done):
                return Completed(head.state, self.cid)
            if releases:
                return Running(head.state, self.cid, last_step, head.id)
        raise AssertionError("unreachable: the last step completes the run")

    def decision_asked(
        self, head: WorkflowSnapshot, pending_input: Any
    ) -> tuple[Hibernated | None, ApprovalDecision | None]:
        """Keep the run at *head* when its step asked for a decision and the
        ``Approval`` row of this very snapshot holds none: ``(Hibernated, None)``
        (status ``waiting``). Else ``(None, decision)`` to go on, where *decision* is
        the row's (``None`` when the step asked for nothing).

        The decision the next step sees is the row's, never the input's: an input
        only wakes the run, and one that claims another decision is ignored and
        logged. This holds however the run got here: a fork of the paused snapshot, a
        resume by hand, a Temporal signal, a task argument, the sweep. The approval is
        made when missing; when it was closed without a decision the run can use
        (cancelled, say), the step's request is repeated in a new snapshot, with a new
        approval.
        """
        request = request_from_snapshot(head)
        if request is None:
            return None, None
        last_step = head.metadata.get(LAST_STEP, "")
        decision = decision_on(head, using=self.runs.db)
        claimed = ApprovalDecision.from_input(pending_input)
        if decision is not None:
            if claimed is not None and not claimed.agrees_with(decision):
                logger.warning(
                    "workflow %s (%s): the input claims a decision on step %r's approval "
                    "that its row does not hold; ignored, the step gets the row's (%s)",
                    self.workflow.name,
                    self.cid,
                    last_step,
                    decision.decision,
                )
            return None, decision
        if pending_input is not None:
            logger.warning(
                "workflow %s (%s): the input given is not a decision on the approval "
                "step %r asked for; ignored, the run waits for that decision",
                self.workflow.name,
                self.cid,
                last_step,
            )
        outcome = AwaitApproval.from_request(head.state, request)
        approval = _approval_of(head, self.runs.db)
        if approval is None or approval.status == approval.Status.PENDING:
            with write_transaction(self.runs.db):
                self.finish(status=RunStatus.WAITING, head_snapshot_id=head.id, resume_input=None)
                outcome.persist_with(self.workflow, head)
            outcome.on_paused(self.workflow, head)
        else:  # closed: ask again
            head = self.persist(
                head,
                last_step,
                outcome,
                consumed_input=pending_input is not None,
                patches=recorded_patches(head.metadata) or None,
            )
        cancel_stale_approvals(using=self.runs.db, coordination_id=self.cid)
        return Waiting(head.state, self.cid, last_step), None

    def upgraded_away(self, head: WorkflowSnapshot) -> bool:
        """Whether *head* is the snapshot of an upgrade to another version than this
        definition's: an upgrade interrupted before the run moved (a store outside
        the run's database), whose position is the other version's."""
        found = upgrade_of(head)
        return found is not None and found.get("to") != self.workflow.version

    def needs_upgrade(self, head: WorkflowSnapshot, last_step: str) -> NeedsUpgrade:
        """Stop a run whose last step this definition lacks (or whose head an
        interrupted upgrade wrote): status ``needs_upgrade``, its head and any input
        kept, nothing run."""
        if UPGRADE_METADATA in head.metadata and self.upgraded_away(head):
            reason = (
                f"an upgrade of this run to version {upgrade_of(head).get('to')} was "
                "interrupted before the run moved; run `manage.py flowwarden_workflows "
                "upgrade` again"
            )
        else:
            reason = self.workflow._missing_step_reason(last_step)
        logger.warning("workflow %s (%s) needs an upgrade: %s", self.name, self.cid, reason)
        self.finish(status=RunStatus.NEEDS_UPGRADE, failure_reason=reason)
        return NeedsUpgrade(head.state, self.cid, last_step, reason)

    def cancelled(self, head: WorkflowSnapshot) -> Cancelled:
        """A cancelled run (its record says so, or its head is the snapshot
        ``Workflow.cancel`` wrote before it could move the record): nothing runs."""
        reason = cancellation_of(head).get("reason", "") or self.record.failure_reason
        self.finish(status=RunStatus.CANCELLED, head_snapshot_id=head.id, resume_input=None)
        return Cancelled(head.state, self.cid, reason)

    def complete(self, head: WorkflowSnapshot, pending_input: Any) -> Completed:
        fields: dict[str, Any] = {"status": RunStatus.COMPLETED, "head_snapshot_id": head.id}
        if pending_input is not None:
            fields["resume_input"] = None
        self.finish(**fields)
        return Completed(head.state, self.cid)

    def persist(
        self,
        head: WorkflowSnapshot,
        step_name: str,
        outcome: StepOutcome,
        *,
        consumed_input: bool,
        completes: bool = False,
        releases: bool = False,
        patches: dict[str, bool] | None = None,
    ) -> WorkflowSnapshot:
        """Save the snapshot of step *step_name* (parent: *head*, ``seq``: head's + 1)
        and move the run record to it; *completes*: it was the workflow's last step
        (falling off the end completes the run); *releases*: let go of the run with
        it (the execution's last step: ``max_steps``), in the same statement;
        *patches*: the run's patch answers, recorded with the snapshot.

        A plain step (``advance`` of a step before the last, no input consumed, the
        lease young) saves the snapshot alone, one ``INSERT``: its explicit ``seq``
        already keeps a second runner from writing the step, and a lease younger
        than a third of its length cannot have been taken over. The run record
        catches up at the next status change, input consumption, lease renewal or
        the end of this execution (``unsynced``).
        """
        name = self.name
        if (
            isinstance(outcome, Advance)
            and not (completes or consumed_input or releases)
            and time.monotonic() < self.young_until
        ):
            metadata = {LAST_STEP: step_name, WORKFLOW_NAME: name, WORKFLOW_DONE: "false"}
            if patches:
                metadata.update(patches_metadata(patches))
            self._add_timing(metadata)
            try:
                return self.save_plain(
                    head.successor(outcome.state, agent_name=name, metadata=metadata), step_name
                )
            except SnapshotConflictError as exc:
                raise ConcurrentRunError(self.cid, "another runner") from exc
        is_done = isinstance(outcome, Done)
        metadata = {
            LAST_STEP: step_name,
            WORKFLOW_NAME: name,
            WORKFLOW_DONE: "true" if is_done else "false",
        }
        if isinstance(outcome, Pause):
            metadata.update(outcome.snapshot_metadata())
        if patches:
            metadata.update(patches_metadata(patches))
        self._add_timing(metadata)
        snapshot = head.successor(
            outcome.state,  # type: ignore[attr-defined]
            agent_name=name,
            metadata=metadata,
        )
        # The run stays running past this execution's last step: held on for its next
        # step (``handoff``), under the hand-off token with a renewed lease.
        hands_off = (
            releases and self.hand_off_to is not None and type(outcome) is Advance and not completes
        )
        finishing = is_done or isinstance(outcome, Pause) or completes or releases
        fields: dict[str, Any] = {"head_snapshot_id": snapshot.id, "last_step": step_name}
        if consumed_input:
            fields["resume_input"] = None
        if hands_off:
            fields["runner"] = self.hand_off_to
        elif isinstance(outcome, Pause):
            fields.update(status=outcome.status, failure_reason="", **outcome.run_fields())
        elif is_done or completes:
            fields.update(status=RunStatus.COMPLETED, failure_reason="")
        handed_at = time.time()
        try:
            if isinstance(outcome, Pause):
                saved = self._save_pause(snapshot, fields, outcome)
            else:
                saved = self._save_step(snapshot, fields, finishing=finishing and not hands_off)
        except SnapshotConflictError as exc:
            raise ConcurrentRunError(self.cid, "another runner") from exc
        if hands_off:  # no longer this execution's to release
            self.released = True
            self.handed = (handed_at, saved)
        if isinstance(outcome, Pause):
            outcome.on_paused(self.workflow, saved)
        return saved

    def _add_timing(self, metadata: dict[str, str]) -> None:
        """Record the timing of the step just executed in its snapshot's *metadata*,
        and clear the failed attempts' errors the run record kept for it."""
        timing, self.timing = self.timing, None
        if timing is not None:
            metadata.update(timing.metadata())
        if self.record.step_errors is not None:
            self.record.step_errors = None
            self.unsynced["step_errors"] = None

    def _save_pause(
        self, snapshot: WorkflowSnapshot, fields: dict[str, Any], outcome: Pause
    ) -> WorkflowSnapshot:
        """``_save_step`` of a pausing step, with what the pause writes
        (``persist_with``: its ``Approval`` row) in the same transaction."""
        before = (self.released, dict(self.unsynced), self.young_until)
        try:
            with write_transaction(self.runs.db):
                saved = self._save_step(snapshot, fields, finishing=True)
                outcome.persist_with(self.workflow, saved)
        except BaseException:
            # Rolled back: the run is still ours, as it was (the caller's finally lets go).
            self.released, self.unsynced, self.young_until = before
            raise
        return saved

    def young(self) -> bool:
        """Whether the lease is younger than a third of its length: nobody can have
        taken the run over (a lease is taken over only once it has run out)."""
        return time.monotonic() < self.young_until

    def save_plain(self, snapshot: WorkflowSnapshot, last_step: str) -> WorkflowSnapshot:
        """Save the snapshot alone (one ``INSERT`` at its explicit ``seq``: a second
        runner's write of it fails with ``SnapshotConflictError``) while the lease is
        young; the run record catches up with it later (``unsynced``)."""
        saved = self.store.save(snapshot)
        unsynced = self.unsynced
        unsynced["head_snapshot_id"] = saved.id
        unsynced["last_step"] = last_step
        return saved

    def _save_step(
        self, snapshot: WorkflowSnapshot, fields: dict[str, Any], *, finishing: bool = False
    ) -> WorkflowSnapshot:
        """Save a step's snapshot and move the run record to it (with the head and
        last step it has not caught up with), renewing the lease or, *finishing*,
        releasing the run: one statement where the store can (the ORM store on
        PostgreSQL), else one transaction. ``LeaseLostError`` (and nothing written)
        when the run was taken over."""
        fields = {**self.unsynced, **fields}
        advance = getattr(self.store, "save_advancing_run", None)
        if advance is not None:
            lease = None if finishing else self.lease_seconds
            saved = advance(
                snapshot,
                runner=self.token,
                lease_seconds=lease,
                run_fields=fields,
                run_using=self.runs.db,
            )
            if saved is not None:
                self.unsynced = {}
                self.released = finishing
                self.renewed()
                return saved
        with write_transaction(self.runs.db):
            saved = self.store.save(snapshot)
            if finishing:
                self.finish(**fields)
            else:
                self.update(**fields)
        return saved

    def execute(
        self,
        current: WorkflowStep,
        state: Any,
        step_input: Any,
        decision: ApprovalDecision | None = None,
        patch_book: PatchBook | None = None,
        children: tuple[ChildResult, ...] = (),
    ) -> StepOutcome:
        """Run one step with its retries and timeout; a ``Fail`` when attempts run out."""
        attempts = current.max_retries + 1
        if self.attempt is None:
            tries: Iterable[int] = range(1, attempts + 1)
            errors: list[AttemptError] = []
        else:
            tries = (min(self.attempt, attempts),)
            # The attempts before this one ran in other calls: their errors wait on
            # the run record (see ``step_timings``).
            errors = list(parse_errors(self.record.step_errors))
        for attempt in tries:
            if attempt > 1 and self.attempt is None:
                self.update()  # renew the lease; LeaseLostError if it was taken over
            ctx = StepContext(
                coordination_id=self.cid,
                workflow_name=self.workflow.name,
                step_name=current.name,
                attempt=attempt,
                input=step_input,
                decision=decision,
                patch_book=patch_book,
                children=children,
            )
            started = time.perf_counter()
            try:
                outcome = _call_step(current, state, ctx)
                if not isinstance(outcome, _OUTCOMES):
                    raise TypeError(
                        f"step {current.name!r} returned {outcome!r}; return advance(), "
                        "hibernate(), sleep(), done() or fail()"
                    )
                elapsed = (time.perf_counter() - started) * 1000
                self.timing = StepTiming(elapsed, attempt, tuple(errors))
                return outcome
            except Exception as exc:
                errors.append(AttemptError.of(attempt, exc))
                logger.warning(
                    "workflow %s (%s): step %r attempt %d/%d failed: %r",
                    self.workflow.name,
                    self.cid,
                    current.name,
                    attempt,
                    attempts,
                    exc,
                    exc_info=not isinstance(exc, StepTimeoutError),
                )
                if attempt == attempts:
                    return Fail(f"unhandled exception: {type(exc).__name__}: {exc}")
                if self.attempt is not None:
                    # Written when this execution lets go of the run (``release``).
                    self.unsynced["step_errors"] = json.loads(errors_json(errors))
                    raise StepAttemptFailed(current, attempt, exc) from exc
                if current.retry_delay:
                    time.sleep(current.retry_delay)
        raise AssertionError("unreachable")


#: What a step may return.
_OUTCOMES = (Advance, Pause, Done, Fail)


def _approval_of(snapshot: WorkflowSnapshot, using: str) -> Any:
    """The ``Approval`` row of paused *snapshot*, or ``None``."""
    return models.Approval.objects.using(using).filter(snapshot_id=snapshot.id).first()


def _call_step(current: WorkflowStep, state: Any, ctx: StepContext) -> StepOutcome:
    if current.timeout is None:
        return current.execute(state, ctx)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["outcome"] = current.execute(state, ctx)
        except BaseException as exc:  # handed to the waiting thread
            box["error"] = exc
        finally:
            connections.close_all()  # this thread's connections only

    thread = threading.Thread(
        target=contextvars.copy_context().run,
        args=(target,),
        name=f"fw-step-{current.name}",
        daemon=True,  # a step that never returns must not keep the process alive
    )
    thread.start()
    thread.join(current.timeout)
    if thread.is_alive():
        raise StepTimeoutError(
            f"step {current.name!r} did not finish within {current.timeout:g}s "
            f"(attempt {ctx.attempt})"
        )
    if "error" in box:
        raise box["error"]
    return box["outcome"]


# -- definitions ---------------------------------------------------------------------


class WorkflowDefinition:
    """One version of a named workflow (its steps and store) without a coordination;
    it makes ``Workflow``s and starts runs. Made by ``Workflow.define``."""

    def __init__(
        self,
        name: str,
        steps: Sequence[WorkflowStep | Callable[..., StepOutcome]],
        store: SnapshotStore | str = "default",
        *,
        using: str | None = None,
        version: int = 1,
    ) -> None:
        self.name = _check_name(name)
        self.version = _check_version(version)
        self.steps = _check_steps(name, steps)
        self.store = store
        self.using = using

    def __repr__(self) -> str:
        steps = [s.name for s in self.steps]
        return f"<WorkflowDefinition {self.name!r} v{self.version} {steps}>"

    def workflow(self, coordination_id: str) -> Workflow:
        """The ``Workflow`` of one coordination (on this version)."""
        return Workflow(
            self.name,
            coordination_id,
            self.steps,
            self.store,
            using=self.using,
            version=self.version,
        )

    def start(
        self,
        initial_state: Any = None,
        *,
        idempotency_key: str | None = None,
        coordination_id: str | None = None,
    ) -> StartedRun:
        """Create a run with its seed snapshot and run it, at most once per
        *idempotency_key* (and per *coordination_id*; a new UUID when omitted).

        The run row is one ``INSERT`` on the unique key: of any number of racing
        starts with one key, exactly one creates (and runs) the run; the others get
        ``StartedRun(created=False)`` with that run's current result.

        Inside ``transaction.atomic`` (a stream handler in transactional mode, say)
        the run and its seed commit with the caller's transaction, and the run is
        executed once it commits (``transaction.on_commit``); ``result`` is then
        ``Running``. An ORM snapshot store on the run's database commits the seed and
        the run row together.
        """
        cid = coordination_id or uuid.uuid4().hex
        wf = self.workflow(cid)
        runs = wf.runs
        started = _create_seeded(wf, runs, initial_state, idempotency_key)
        if started is not None:
            record, created = started[1], True
            wf.started_with = started
        else:
            with transaction.atomic(using=runs.db):
                record, created = runs.create(
                    cid, self.name, idempotency_key=idempotency_key, workflow_version=self.version
                )
                if created:
                    wf.started_with = (_point_at_head(wf, runs, record, initial_state), record)
        if not created:
            try:
                existing = workflow_for(record.coordination_id, using=runs.db, mark=False)
            except VersionNotDefinedError:  # started on a version this code lacks
                return StartedRun(record.coordination_id, False, None)
            result = cast(Workflow, existing).current_result()
            return StartedRun(record.coordination_id, False, result)
        connection = connections[runs.db]
        if connection.in_atomic_block:
            transaction.on_commit(lambda: _run_started(wf), using=runs.db)
            return StartedRun(cid, True, Running(initial_state, cid, ""))
        return StartedRun(cid, True, _run_started(wf))

    async def astart(
        self,
        initial_state: Any = None,
        *,
        idempotency_key: str | None = None,
        coordination_id: str | None = None,
    ) -> StartedRun:
        """``start()`` from async code; ``thread_sensitive=True`` (see
        ``Workflow.astart``)."""
        start = sync_to_async(self.start, thread_sensitive=True)
        return await start(
            initial_state, idempotency_key=idempotency_key, coordination_id=coordination_id
        )


def _run_started(workflow: Workflow) -> WorkflowResult:
    try:
        return workflow.run()
    except ExecutionUnavailableError as exc:
        # Recorded and seeded: the recovery sweep continues it once the provider answers.
        logger.warning("workflow %s (%s) was started but not run: %s", workflow.name, workflow, exc)
        return workflow.current_result() or Running(None, workflow.coordination_id, "")
    except ConcurrentRunError:
        # Someone else is driving the run we just created: it is running, not lost.
        logger.info("workflow %s (%s) was started and is run elsewhere", workflow.name, workflow)
        return workflow.current_result() or Running(None, workflow.coordination_id, "")
