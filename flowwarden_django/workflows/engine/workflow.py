"""The workflow engine's facade: ``Workflow`` (one coordination of a workflow: run it,
resume, cancel, fork, read it) and ``WorkflowDefinition`` (one version of a named
workflow, which starts runs).

A workflow is a named, ordered list of steps; a *coordination* is one run of it. The
run's history is a chain of snapshots in a ``SnapshotStore``: a seed snapshot with the
initial state (``workflow.lastStep = ""``), then one per completed step, each derived
from the previous one (``parent_id``) and saved at the next ``seq``. The run's status
and its current runner live in a ``WorkflowRun`` row (``runs``).

Two runners of one coordination cannot both advance it: ``run()`` first claims the run
record (one conditional ``UPDATE``, ``opening``); the loser gets ``ConcurrentRunError``.
Each step snapshot is saved at an explicit ``seq``: a runner that lost its lease fails
on the store's unique ``(coordination, seq)`` rather than fork the chain. The steps run
in ``loop``; what they write is ``saving``'s.

The facade sits on top of the other workflow packages, and none of them imports it:
approvals reach a run through the registry, providers through ``ExecutableWorkflow``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, cast

from asgiref.sync import sync_to_async
from django.db import DatabaseError

from ...common.async_twins import method_twin
from ...common.user_input import check_resume_input
from ..definition.checks import check_name, check_steps, check_version
from ..definition.graph import WorkflowGraph, continue_index, graph_of
from ..definition.metadata import LAST_STEP, NEXT_STEP
from ..definition.registry import workflow_for, workflow_registry
from ..definition.results import (
    Cancelled,
    Completed,
    Failed,
    NeedsUpgrade,
    Running,
    StartedRun,
    WorkflowResult,
    paused,
)
from ..definition.steps import StepOutcome, WorkflowStep
from ..execution.claim_keeper import claim_keeper
from ..execution.handoff import Handoff
from ..execution.providers import resolve_provider
from ..execution.run_traces import run_span
from ..operations.forking import fork_snapshot
from ..operations.upgrades import WorkflowUpgrade, upgrade_registry
from ..queues.placing import check_queue_name, placement
from ..runs.records import (
    HANDOFF_PREFIX,
    ClaimTerms,
    ConcurrentRunError,
    RunClaim,
    RunRecords,
    RunStatus,
    UnknownRunError,
    check_run_of,
    new_handoff_token,
    new_runner_token,
    run_lease,
)
from ..storage.snapshot import CheckpointQuery, WorkflowSnapshot, check_id
from ..storage.store import SnapshotStore, UnknownSnapshotError, snapshot_stores
from ..waiting.cancellation import CancelOutcome, cancel_run
from ..waiting.children import FINISHED as CHILD_FINISHED
from ..waiting.children import notify_parent
from ..waiting.messages.facade import RunMessaging
from .loop import _Execution
from .opening import open_handed, open_run, save_seed, take
from .starting import start_run

if TYPE_CHECKING:
    from ...models import WorkflowRun

logger = logging.getLogger("flowwarden_django.workflows")


class Workflow(RunMessaging):
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

    ``send()`` a message to the run (a step waits for it with ``wait_for``), and
    ``get_event()`` read what it publishes (``ctx.set_event``).

    For async code: ``astart``, ``arun``, ``aresume``, ``afork``, ``asend`` and
    ``aget_event``, the same calls run in Django's thread-sensitive executor
    (``sync_to_async``).
    """

    executed_by: ClassVar[str] = "inprocess"  # the provider, recorded in each step's timing

    def __init__(
        self,
        name: str,
        coordination_id: str,
        steps: Sequence[WorkflowStep | Callable[..., StepOutcome]],
        store: SnapshotStore | str = "default",
        *,
        using: str | None = None,
        version: int = 1,
        queue: str | None = None,
    ) -> None:
        self._name = check_name(name)
        self._version = check_version(version)
        #: The queue whose limits the run's steps obey (``workflows.queues``), if any.
        self.queue = check_queue_name(queue)
        if not isinstance(coordination_id, str) or not coordination_id.strip():
            raise ValueError(f"coordination_id must be a non-blank string, not {coordination_id!r}")
        if len(coordination_id) > 255:
            raise ValueError("coordination_id is longer than 255 characters")
        self._coordination_id = coordination_id
        self._steps = check_steps(name, steps)
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

    def graph(self) -> WorkflowGraph:
        """Where each step may go: the next step, and the steps its ``goes_to``
        declares (see ``definition.graph``)."""
        return graph_of(self._steps)

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

    arun = method_twin(
        run,
        """``run()`` from async code: same result, errors and snapshot signals.

        Runs ``run()`` through ``sync_to_async(thread_sensitive=True)``: the claim, the
        snapshots and the run record are ORM work, which Django confines to the
        thread-sensitive executor (one connection per database, shared with the
        request's other sync code). With the in-process provider the steps run there
        too, so a long step holds that thread (and every other thread-sensitive call
        of the process) until it returns; under ASGI run long steps on the Celery or
        Temporal provider, where this returns ``Running`` once the work is queued.
        """,
    )

    aresume = method_twin(
        resume,
        """``resume(input)`` from async code: same result, errors and snapshot signals.

        ``thread_sensitive=True``, as ``arun``: it claims the run, stores *input* and
        (in-process) runs the steps in the thread-sensitive executor.
        """,
    )

    def cancel(self, reason: str = "", *, by: str = "") -> CancelOutcome:
        """Cancel this run: it never runs another step (see ``workflows.cancellation``);
        *by* names who cancelled (kept with the reason and in the approvals' audit).
        ``CancelOutcome.cancelled`` is False when it was already completed or
        cancelled. ``UnknownRunError`` when there is no run."""
        return cancel_run(self, reason, by=by)

    acancel = method_twin(cancel, """``cancel()`` from async code.""")

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
            opened = open_handed(self, runs, handed, lease)
        if opened is not None:
            token = opened.record.runner
        else:
            token = new_runner_token()
            opened = open_run(self, runs, token, lease, input, initial_state)
        execution = _Execution(self, runs, token, lease, opened.record, attempt)
        execution.hand_off_to = hand_off
        if opened.handed_at is not None:
            # Young for what is left of a third of the lease since the hand-off.
            young = lease.total_seconds() / 3 - (time.time() - opened.handed_at)
            execution.young_until = time.monotonic() + young
        kept = execution.keep_alive()
        result: WorkflowResult | None = None
        with run_span(self, opened.head if opened.head_known else None):
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
                if execution.gate is not None:  # its queue slot, after the run's release
                    execution.gate.close(result.status if result is not None else "")
        if opened.record.parent_coordination_id and result.status in CHILD_FINISHED:
            notify_parent(opened.record)
        return result, execution.handoff()

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
            claim = RunClaim(self._coordination_id, self._name, token, lease, None, self._version)
            take(self, runs, claim)
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
                head = save_seed(self, initial_state)
                runs.update(self._coordination_id, token, lease, head_snapshot_id=head.id)
            return head
        finally:
            from ..execution.releases import release_or_defer

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
            wake_at, topic = record.wake_at, record.waiting_topic
            return paused(state, cid, last_step, record.status, wake_at, topic, record.queue)
        if record.status == RunStatus.NEEDS_UPGRADE:
            return NeedsUpgrade(state, cid, last_step, record.failure_reason)
        if record.status == RunStatus.FAILED:
            next_step = "" if head is None else head.metadata.get(NEXT_STEP, "")
            index = self._start_index(last_step, next_step)
            failed = (
                self._steps[index].name
                if index is not None and index < len(self._steps)
                else last_step
            )
            return Failed(state, cid, failed, record.failure_reason)
        return Running(state, cid, last_step)

    def _start_index(self, last_step: str, next_step: str = "") -> int | None:
        """The index of the step after *last_step*, or of *next_step* when the last
        step jumped there; ``None`` when the step is not a step of this definition
        (the run then needs an upgrade: it is never started over from the first
        step)."""
        return continue_index(self._steps, last_step, next_step)

    def _missing_step_reason(self, last_step: str, next_step: str = "") -> str:
        if next_step:
            return (
                f"the step this run continues at (step {last_step!r} jumped to it), "
                f"{next_step!r}, is not a step of version {self._version} of workflow "
                f"{self._name!r} (its steps: {', '.join(s.name for s in self._steps)}); "
                "define that version as it was, or declare an upgrade that maps the step "
                "and run `manage.py flowwarden_workflows upgrade`"
            )
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
        source's ``workflow.lastStep``, or at the step it jumped to): a way to redo
        steps from an earlier point.
        A run waiting for an approval becomes ``hibernated`` and the approval is
        cancelled (``forking.fork_snapshot``)."""
        source = self.store.load(check_id(snapshot_id, "snapshot_id"))
        if source is None or source.coordination_id != self._coordination_id:
            raise UnknownSnapshotError(
                f"coordination {self._coordination_id!r} has no snapshot {snapshot_id!r}"
            )
        return fork_snapshot(self.store, snapshot_id, new_state, using=self.runs.db)

    afork = method_twin(
        fork,
        """``fork(snapshot_id, new_state)`` from async code: same snapshot, errors
        (``UnknownSnapshotError``, ...) and ``snapshot_forked`` signal.

        ``thread_sensitive=True``: the fork loads the source, saves the child, moves
        the run and cancels a pending approval through the ORM, and tells the provider
        on commit (``transaction.on_commit``): on the thread-sensitive executor's
        connection, inside the surrounding sync code's transaction if there is one.
        """,
    )

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
        queue: str | None = None,
    ) -> WorkflowDefinition:
        """Declare a workflow by name (registered, so ``Workflow.start(name)`` and
        ``Workflow.for_coordination(cid)`` find it, in any process that imports it).

        *version* (default 1: what every run made before versions records) numbers
        this definition of the workflow. Define a new version whenever a change would
        not fit runs already under way (a step removed, renamed or moved, a state
        that changes shape), and keep the old one defined beside it until its runs
        are finished or upgraded: ``Workflow.start`` starts runs on the highest
        version, and each run continues on its own. See "Upgrading workflows" in
        the README. *queue*: a queue of ``FLOWWARDEN["WORKFLOW_QUEUES"]`` whose
        limits the steps of every run obey (see "Queues" in the docs)."""
        definition = WorkflowDefinition(
            name, steps, store, using=using, version=version, queue=queue
        )
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
        **placing: Any,
    ) -> StartedRun:
        """Start registered workflow *name* at most once per *idempotency_key*; see
        ``WorkflowDefinition.start`` (and its *queue*, *priority*, *partition_key*)."""
        # Workflow.define registers WorkflowDefinitions.
        definition = cast(WorkflowDefinition, workflow_registry.get(name))
        return definition.start(
            initial_state,
            idempotency_key=idempotency_key,
            coordination_id=coordination_id,
            **placing,
        )

    @classmethod
    async def astart(
        cls,
        name: str,
        initial_state: Any = None,
        *,
        idempotency_key: str | None = None,
        coordination_id: str | None = None,
        **placing: Any,
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
            name,
            initial_state,
            idempotency_key=idempotency_key,
            coordination_id=coordination_id,
            **placing,
        )

    @classmethod
    def for_coordination(cls, coordination_id: str, *, using: str | None = None) -> Workflow:
        """The ``Workflow`` of an existing run, from its record's registered workflow.
        ``UnknownRunError`` / ``LookupError`` when the run or its workflow is unknown."""
        return cast(Workflow, workflow_for(coordination_id, using=using))


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
        queue: str | None = None,
    ) -> None:
        self.name = check_name(name)
        self.version = check_version(version)
        self.steps = check_steps(name, steps)
        self.store = store
        self.using = using
        self.queue = check_queue_name(queue)

    def __repr__(self) -> str:
        steps = [s.name for s in self.steps]
        return f"<WorkflowDefinition {self.name!r} v{self.version} {steps}>"

    def graph(self) -> WorkflowGraph:
        """Where each step may go (``Workflow.graph``)."""
        return graph_of(self.steps)

    def workflow(
        self, coordination_id: str, kind: type[Workflow] = Workflow, **extra: Any
    ) -> Workflow:
        """The ``Workflow`` of one coordination (on this version); *kind*, a subclass
        of ``Workflow``, with its own keyword arguments *extra*, makes the runner of a
        provider's step (which then also obeys this definition's queue)."""
        return kind(
            self.name,
            coordination_id,
            self.steps,
            self.store,
            using=self.using,
            version=self.version,
            queue=self.queue,
            **extra,
        )

    def start(
        self,
        initial_state: Any = None,
        *,
        idempotency_key: str | None = None,
        coordination_id: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        partition_key: str | None = None,
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

        *queue* puts this run on a queue of ``FLOWWARDEN["WORKFLOW_QUEUES"]`` (instead
        of its workflow's); *priority* (lower first, on a queue with ``"priority":
        True``) and *partition_key* (on a ``"partitioned"`` one) place it there.
        ``UnknownQueueError`` (a ``LookupError``) or ``ValueError`` before anything is
        written when they do not fit the queue.
        """
        placed = placement(self.queue, queue, priority, partition_key)
        return start_run(
            self,
            initial_state,
            idempotency_key=idempotency_key,
            coordination_id=coordination_id,
            placed=placed,
        )

    astart = method_twin(
        start,
        """``start()`` from async code; ``thread_sensitive=True`` (see ``Workflow.astart``).""",
    )
