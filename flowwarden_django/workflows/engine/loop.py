"""The step loop: one claimed ``run_local`` call runs the steps after the run's latest
snapshot until one pauses, finishes or fails, or the list ends (``_Execution.run``),
each step with its retries and timeout (``execute``); ``saving.RunWriter`` writes
what they produce.

``run()`` resumes from the latest snapshot (highest ``seq``): it executes the steps
after ``workflow.lastStep`` until one hibernates, finishes or fails, or the list ends.

* ``advance(state)``: snapshot, go on. ``hibernate(state)``: snapshot, status
  ``hibernated``, return ``Hibernated``; the next run starts at the following step.
* ``done(state)``: snapshot with ``workflow.done = "true"``, status ``completed``; a
  later run returns ``Completed`` without running anything (even after a middle step).
* ``fail(reason)``, or an exception on every attempt: status ``failed``, nothing
  persisted, so a later run executes the same step again.
* Falling off the end of the list is ``Completed``.
* ``advance(state, to="poll")`` (``hibernate``, ``sleep``, ``wait_for`` too): the
  snapshot records the jump (``workflow.nextStep``) and the run continues at that
  step, now or when it wakes; a jump its step may not make fails the run (``definition.graph``).

Steps must be idempotent: a retry repeats a step, and a crash between a step's side
effect and its snapshot repeats it on resume. ``ctx.idempotency_key`` helps.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, cast

from django.utils import timezone

from ...common import tracing
from ...common.app_models import models
from ..definition.decisions import ApprovalDecision
from ..definition.graph import (
    furthest_index,
    jump_of,
    jump_problem,
    position_metadata,
    step_index,
)
from ..definition.messages import Message
from ..definition.metadata import CANCELLED as CANCELLED_METADATA
from ..definition.metadata import FURTHEST_STEP, LAST_STEP, NEXT_STEP, WORKFLOW_DONE
from ..definition.patches import NO_PATCHES, PATCHES_METADATA, PatchBook, recorded_patches
from ..definition.results import (
    Cancelled,
    Completed,
    Failed,
    Hibernated,
    NeedsUpgrade,
    Running,
    Waiting,
    WaitingForChildren,
    WorkflowResult,
    paused,
)
from ..definition.steps import Advance, Done, Fail, Pause, StepContext, StepOutcome, WorkflowStep
from ..execution.run_traces import run_attributes
from ..execution.step_timings import AttemptError, StepTiming, errors_json, parse_errors
from ..operations.upgrades import UPGRADE_METADATA, upgrade_of
from ..queues.gate import gate_for
from ..runs.leases import runner_instance
from ..runs.records import ConcurrentRunError, RunStatus
from ..runs.transactions import write_transaction
from ..storage.snapshot import WorkflowSnapshot
from ..storage.store import SnapshotConflictError
from ..waiting.approvals.request import AwaitApproval, decision_on, request_from_snapshot
from ..waiting.approvals.sweep import cancel_stale_approvals
from ..waiting.cancellation import cancellation_of
from ..waiting.children import (
    CHILDREN,
    ChildrenLostError,
    ChildResult,
    Spawn,
    children_results,
    continue_if_ready,
    spawned,
)
from ..waiting.messages.sending import AttemptOutbox
from ..waiting.messages.waiting import awaited_message
from .calling import StepAttemptFailed, StepTimeoutError, call_step
from .opening import Opened, seed_snapshot
from .saving import RunWriter
from .signals import send_step_attempted
from .transactional import (
    RolledBack,
    SaveFailed,
    attempt_transaction,
    commit_with,
    transaction_alias,
)

logger = logging.getLogger("flowwarden_django.workflows")


class _Execution(RunWriter):
    """One claimed ``run_local`` call: the step loop."""

    def run(
        self, initial_state: Any, max_steps: int | None, opened: Opened | None = None
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
            seed = seed_snapshot(wf, initial_state)
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
        start = wf._start_index(last_step, head.metadata.get(NEXT_STEP, ""))
        if start is None or (UPGRADE_METADATA in head.metadata and self.upgraded_away(head)):
            return self.needs_upgrade(head, last_step)
        asked, decision = self.decision_asked(head, pending_input)
        if asked is not None:
            return asked
        if decision is not None:
            pending_input = decision.as_input()
        waited, message = awaited_message(self, head, pending_input)
        if waited is not None:
            return waited
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
        index, executed = start, 0
        gate = self.gate = gate_for(self)
        while True:
            if max_steps is not None and executed >= max_steps:
                self.finish()
                return _running(head, self.cid, last_step)
            current = wf.steps[index]
            if gate is not None:
                refused = gate.before_step(head)
                if refused is not None:  # the run waits for a slot, holding nothing
                    return refused
            book = None
            if self.patching or PATCHES_METADATA in head.metadata:
                furthest = furthest_index(wf.steps, head.metadata)
                book = PatchBook(recorded_patches(head.metadata), wf.steps, index, furthest)
            state = first_state if executed == 0 else head.state
            # The last step this execution may run lets go of the run with its snapshot.
            releases = max_steps is not None and executed + 1 >= max_steps
            place = _Place(
                current, index, index == last, head, book, pending_input is not None, releases
            )
            committed: list[WorkflowSnapshot] = []
            outcome = self.execute(
                current,
                state,
                pending_input,
                decision,
                book or NO_PATCHES,
                children,
                message,
                head,
                commit=functools.partial(self.commit_outcome, place, committed)
                if current.transactional
                else None,
            )
            outcome, target = self.checked_outcome(place, outcome)
            if isinstance(outcome, Fail):
                if not self.last_copy_out():
                    # The other copy's attempt decides: this one wrote nothing.
                    raise ConcurrentRunError(self.cid, self.token)
                failed = {"failure_reason": outcome.reason}
                if self.record.step_errors is not None:  # this round's errors: forgotten
                    failed["step_errors"] = None
                self.finish(status=RunStatus.FAILED, **failed)
                return Failed(head.state, self.cid, current.name, outcome.reason)
            if committed:  # saved with the step's writes; told once committed
                head = committed[0]
                if isinstance(outcome, Pause):
                    outcome.on_paused(self.workflow, head)
            else:
                head = self.save_outcome(place, outcome, target)
            last_step = current.name
            pending_input = decision = message = None
            children = ()
            if isinstance(outcome, Spawn) or getattr(outcome, "continued", False):
                # Its children (or its message) may have continued it (in-process).
                return self.workflow.current_result() or paused(
                    head.state, self.cid, current.name, outcome.status
                )
            if isinstance(outcome, Pause):
                wake_at, topic = getattr(outcome, "wake_at", None), getattr(outcome, "topic", "")
                return paused(head.state, self.cid, current.name, outcome.status, wake_at, topic)
            if (index == last and not target) or isinstance(outcome, Done):
                return Completed(head.state, self.cid)
            if releases:
                return _running(head, self.cid, last_step)
            index = cast(int, step_index(wf.steps, target)) if target else index + 1
            executed += 1

    def checked_outcome(self, place: _Place, outcome: StepOutcome) -> tuple[StepOutcome, str]:
        """*outcome* of the step at *place*, a ``Fail`` when it jumps where its step
        may not; the step it jumps to (``""``: the next one)."""
        target = "" if isinstance(outcome, Fail) else jump_of(outcome)
        if target:
            steps = self.workflow.steps
            problem = jump_problem(self.workflow.name, steps, place.index, target)
            if problem:
                logger.error("workflow %s (%s): %s", self.name, self.cid, problem)
                return Fail(problem), ""
        return outcome, target

    def save_outcome(
        self, place: _Place, outcome: StepOutcome, target: str, notify: bool = True
    ) -> WorkflowSnapshot:
        """Persist *outcome* of the step at *place* (``persist``)."""
        current, book, head = place.step, place.book, place.head
        return self.persist(
            head,
            current.name,
            outcome,
            consumed_input=place.consumed_input,
            completes=place.is_last and not target,
            releases=place.releases,
            patches=None if book is None else book.after(current),
            position=position_metadata(self.workflow.steps, head.metadata, place.index, target),
            fenced=current.transactional,
            notify=notify,
        )

    def commit_outcome(
        self, place: _Place, committed: list[WorkflowSnapshot], outcome: StepOutcome
    ) -> None:
        """Save *outcome* of the transactional step at *place* in its attempt's
        transaction (into *committed*); ``RolledBack`` for a ``Fail``."""
        outcome, target = self.checked_outcome(place, outcome)
        if isinstance(outcome, Fail):
            raise RolledBack(outcome)
        committed.append(self.save_outcome(place, outcome, target, notify=False))

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
            furthest = head.metadata.get(FURTHEST_STEP)
            head = self.persist(
                head,
                last_step,
                outcome,
                consumed_input=pending_input is not None,
                patches=recorded_patches(head.metadata) or None,
                position=None if furthest is None else {FURTHEST_STEP: furthest},
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
            reason = self.workflow._missing_step_reason(last_step, head.metadata.get(NEXT_STEP, ""))
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

    def execute(
        self,
        current: WorkflowStep,
        state: Any,
        step_input: Any,
        decision: ApprovalDecision | None = None,
        patch_book: PatchBook | None = None,
        children: tuple[ChildResult, ...] = (),
        message: Message | None = None,
        head: WorkflowSnapshot | None = None,
        commit: Callable[[StepOutcome], Any] | None = None,
    ) -> StepOutcome:
        """Run one step (from snapshot *head*) with its retries and timeout; a ``Fail``
        when attempts run out. A transactional step's *commit* saves its outcome in
        each attempt's transaction (``engine.transactional``): an error of the save is
        raised as it is, never retried as the step's."""
        attempts = current.max_retries + 1
        if current.transactional:  # ImproperlyConfigured: no attempt could commit
            transaction_alias(self, current)
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
                message=message,
                outbox=AttemptOutbox(self.cid, head.id if head else "", current.name, self.runs.db),
            )
            if self.gate is not None:
                self.gate.step_begins()
            started = time.perf_counter()
            started_at = timezone.now().isoformat()
            try:
                # The attributes are only made when a span is recorded.
                attributes = functools.partial(self.step_attributes, current, attempt)
                with (
                    tracing.span("flowwarden.workflow.step", attributes),
                    attempt_transaction(self, current),
                ):
                    outcome = call_step(current, state, ctx)
                    if not isinstance(outcome, _OUTCOMES):
                        raise TypeError(
                            f"step {current.name!r} returned {outcome!r}; return advance(), "
                            "hibernate(), sleep(), done() or fail()"
                        )
                    elapsed = (time.perf_counter() - started) * 1000
                    self.timing = StepTiming(
                        elapsed,
                        attempt,
                        tuple(errors),
                        started_at=started_at,
                        worker=runner_instance(),
                        provider=self.workflow.executed_by,
                    )
                    if commit is not None:
                        commit_with(commit, outcome)
                self.attempted(current, attempt, elapsed)
                return outcome
            except RolledBack as rolled_back:  # a Fail: its writes undone
                self.attempted(current, attempt, (time.perf_counter() - started) * 1000)
                return rolled_back.outcome
            except SaveFailed as failed:  # refused by the fence, say: its writes undone
                self.attempted(current, attempt, (time.perf_counter() - started) * 1000)
                raise failed.error from failed.error.__cause__
            except Exception as exc:
                elapsed = (time.perf_counter() - started) * 1000
                self.attempted(current, attempt, elapsed, type(exc).__name__)
                errors.append(
                    AttemptError.of(
                        attempt,
                        exc,
                        started_at=started_at,
                        duration_ms=elapsed,
                        worker=runner_instance(),
                    )
                )
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

    def step_attributes(self, current: WorkflowStep, attempt: int) -> dict[str, Any]:
        return {
            **run_attributes(self.workflow),
            "flowwarden.step": current.name,
            "flowwarden.attempt": attempt,
        }

    def attempted(self, current: WorkflowStep, attempt: int, ms: float, error: str = "") -> None:
        send_step_attempted(
            self.workflow.name, self.workflow.version, current.name, attempt, ms / 1000, error
        )


@dataclasses.dataclass(frozen=True)
class _Place:
    """Where the step loop is: the step about to run, its index (and whether it is
    the last), the snapshot it runs from, its patch book, whether it consumes the
    run's input, and whether the execution lets go of the run with its snapshot."""

    step: WorkflowStep
    index: int
    is_last: bool
    head: WorkflowSnapshot
    book: PatchBook | None
    consumed_input: bool
    releases: bool


#: What a step may return.
_OUTCOMES = (Advance, Pause, Done, Fail)


def _running(head: WorkflowSnapshot, cid: str, last_step: str) -> Running:
    """``Running`` at *head*, naming the step the run continues at when it jumped."""
    return Running(head.state, cid, last_step, head.id, head.metadata.get(NEXT_STEP, ""))


def _approval_of(snapshot: WorkflowSnapshot, using: str) -> Any:
    """The ``Approval`` row of paused *snapshot*, or ``None``."""
    return models.Approval.objects.using(using).filter(snapshot_id=snapshot.id).first()
