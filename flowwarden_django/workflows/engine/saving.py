"""What one claimed execution writes: the run record's updates, its release, and each
step's snapshot with the run record moved to it (``persist``), in as few statements as
the store allows. ``loop._Execution`` runs the steps on top of it.

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
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import TYPE_CHECKING, Any, cast

from django.db import connections

from ..definition.metadata import LAST_STEP, PAUSE_STATUS, WORKFLOW_DONE, WORKFLOW_NAME
from ..definition.patches import patches_metadata
from ..definition.steps import Advance, Done, Pause, StepOutcome
from ..execution.claim_keeper import HeldClaim, claim_keeper
from ..execution.handoff import CARRY_LIMIT, Handoff
from ..execution.releases import release_or_defer
from ..execution.step_timings import StepTiming
from ..runs.records import ConcurrentRunError, RunRecords, RunStatus
from ..runs.transactions import write_transaction
from ..storage.snapshot import WorkflowSnapshot
from ..storage.store import SnapshotConflictError

if TYPE_CHECKING:
    from ...models import WorkflowRun
    from ..queues.gate import StepGate
    from .workflow import Workflow

#: Numbers each execution's claim key in this process: unlike ``id()``, never reused.
_EXECUTION_NUMBERS = itertools.count(1)


@dataclasses.dataclass(eq=False, repr=False)
class RunWriter:
    """The run-record and snapshot writes of one claimed ``run_local`` call."""

    workflow: Workflow
    runs: RunRecords
    token: str
    lease: Any
    record: WorkflowRun
    #: The one attempt to run of each step (its provider retries), else all of them.
    attempt: int | None = None

    def __post_init__(self) -> None:
        self.cid = self.workflow.coordination_id
        self.name = self.workflow.name
        #: Whether the run record was already released (finished) by this execution.
        self.released = False
        #: The store, resolved once (an alias is not looked up again for every step).
        self.store = self.workflow.store
        #: The head and last step not yet written to the run record (see ``persist``).
        self.unsynced: dict[str, Any] = {}
        #: How the step just executed ran (``execute``), recorded with its snapshot.
        self.timing: StepTiming | None = None
        self.lease_seconds = self.lease.total_seconds()
        #: Whether a step declares patches (``ctx.patched``): only then, or when the
        #: run recorded answers, does a step get a ``PatchBook``.
        self.patching = any(s.patches for s in self.workflow.steps)
        #: Until when (``time.monotonic()``) the lease is young: a third of it after it
        #: was last taken or renewed. Plain steps before then leave the run record alone.
        self.young_until = time.monotonic() + self.lease_seconds / 3
        #: The token a step that leaves the run running hands it on to (``handoff``).
        self.hand_off_to: str | None = None
        #: The hand-off its last step made: when (``time.time()``) and its snapshot.
        self.handed: tuple[float, WorkflowSnapshot] | None = None
        #: What admits its steps when the run is on a queue (``queues.gate``).
        self.gate: StepGate | None = None
        #: The claim the keeper renews, under a key of this execution's own: two
        #: copies of one handed step run under one token (``claim_keeper``).
        self.claim = HeldClaim(
            self.runs.db,
            self.cid,
            self.token,
            self.lease,
            on_renewed=self.renewed,
            key=f"{self.token}#{next(_EXECUTION_NUMBERS)}",
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
            queue=self.record.queue,
            queue_partition=self.record.queue_partition,
            queue_priority=self.record.queue_priority,
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

    def last_copy_out(self) -> bool:
        """Stop this execution's renewals and say whether it was the last copy of its
        handed step in this process (atomically: of two copies failing at once, one
        is told it is the last and records the failure)."""
        return claim_keeper.leave(self.claim)

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

        self.released = True
        release_or_defer(self.runs, self.cid, self.token, self.unsynced)
        self.unsynced = {}

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
        position: dict[str, str] | None = None,
        fenced: bool = False,
        notify: bool = True,
    ) -> WorkflowSnapshot:
        """Save the snapshot of step *step_name* (parent: *head*, ``seq``: head's + 1)
        and move the run record to it; *completes*: it was the workflow's last step
        (falling off the end completes the run); *releases*: let go of the run with
        it (the execution's last step: ``max_steps``), in the same statement;
        *patches*: the run's patch answers, recorded with the snapshot; *position*:
        where the run continues when the step jumped (``graph.position_metadata``);
        *fenced*: never the plain ``INSERT`` below, always the save that moves the run
        only while this runner holds it (a transactional step's); *notify*: call a
        pause's ``on_paused`` (else the caller does, once its transaction committed).

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
            and not (completes or consumed_input or releases or fenced)
            and time.monotonic() < self.young_until
        ):
            metadata = {LAST_STEP: step_name, WORKFLOW_NAME: name, WORKFLOW_DONE: "false"}
            if patches:
                metadata.update(patches_metadata(patches))
            if position:
                metadata.update(position)
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
            metadata[PAUSE_STATUS] = str(outcome.status)
            metadata.update(outcome.snapshot_metadata())
        if patches:
            metadata.update(patches_metadata(patches))
        if position:
            metadata.update(position)
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
        if notify and isinstance(outcome, Pause):
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
