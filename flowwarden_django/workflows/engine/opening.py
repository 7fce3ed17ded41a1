"""Opening a run for one execution: claiming its record (one conditional ``UPDATE``,
with a lease), in the same statement as its seed or its latest snapshot where the
store can, or taking it as the previous step handed it on (``handoff``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NamedTuple

from django.db import DatabaseError

from ...common import tracing
from ...common.app_models import models
from ..definition.metadata import LAST_STEP, WORKFLOW_DONE, WORKFLOW_NAME
from ..execution.handoff import Handoff
from ..runs.records import ClaimTerms, ConcurrentRunError, RunClaim, RunRecords, RunStatus
from ..storage.snapshot import WorkflowSnapshot, new_snapshot_id
from ..storage.store import SnapshotConflictError, SnapshotStore

if TYPE_CHECKING:
    from ...models import WorkflowRun
    from .workflow import Workflow

logger = logging.getLogger("flowwarden_django.workflows")


def seed_snapshot(workflow: Workflow, initial_state: Any) -> WorkflowSnapshot:
    """A new run's first snapshot (with the trace context it started in, if traced)."""
    headers = tracing.start_headers(workflow.name, workflow.coordination_id)
    return WorkflowSnapshot(
        id=new_snapshot_id(),
        coordination_id=workflow.coordination_id,
        state=initial_state,
        agent_name=workflow.name,
        seq=1,
        metadata={
            LAST_STEP: "",
            WORKFLOW_NAME: workflow.name,
            WORKFLOW_DONE: "false",
            **tracing.seed_metadata(headers),
        },
    )


def create_seeded(
    workflow: Workflow,
    runs: RunRecords,
    initial_state: Any,
    idempotency_key: str | None,
    placed: dict[str, Any] | None = None,
) -> tuple[WorkflowSnapshot, WorkflowRun] | None:
    """Create the run at its seed and write the seed in ONE statement where the store
    can (the ORM store on the run's PostgreSQL database, outside a transaction):
    ``(seed, record)``; *placed*: its queue fields, in the same statement. ``None``
    when that path does not apply or the coordination or key exists
    (``WorkflowDefinition.start`` then goes the long way, which finds the existing
    run)."""
    opener = getattr(workflow.store, "open_run", None)
    if opener is None:
        return None
    cid = workflow.coordination_id
    seed = seed_snapshot(workflow, initial_state)
    statement = runs.create_statement(
        cid,
        workflow.name,
        seed.id,
        idempotency_key=idempotency_key,
        workflow_version=workflow.version,
        placed=placed,
    )
    if statement is None:
        return None
    opened = opener(seed, statement, run_using=runs.db)
    if opened is None or opened[0] is None:
        return None
    row, seeded = opened
    record = runs.claimed(row)
    if seeded is None:  # the coordination had snapshots: the run continues the latest
        return point_at_head(workflow, runs, record, initial_state), record
    return seeded, record


def point_at_head(
    workflow: Workflow, runs: RunRecords, record: WorkflowRun, initial_state: Any
) -> WorkflowSnapshot:
    """Point the run just created at its coordination's latest snapshot (a seed of
    *initial_state* when there is none) and return that head."""
    head = workflow.store.latest(workflow.coordination_id) or save_seed(workflow, initial_state)
    runs.set_head(workflow.coordination_id, head.id)
    record.head_snapshot_id = head.id
    return head


def save_seed(workflow: Workflow, initial_state: Any) -> WorkflowSnapshot:
    try:
        return workflow.store.save(seed_snapshot(workflow, initial_state))
    except SnapshotConflictError as exc:
        raise ConcurrentRunError(workflow.coordination_id) from exc


class Opened(NamedTuple):
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
    def of(cls, record: WorkflowRun, seeded: WorkflowSnapshot | None) -> Opened:
        """*record*, claimed by a statement that wrote *seeded* (``None``: no seed)."""
        if seeded is None:
            return cls(record)
        return cls(record, seeded, head_known=True, seeded=True)


def open_handed(workflow: Workflow, runs: RunRecords, handed: Handoff, lease: Any) -> Opened | None:
    """The run as *handed* left it, without a statement: its token and carried
    head, when the hand-off is of this version and still young (see ``handoff``);
    ``None``: claim the run."""
    uncarry = getattr(workflow.store, "uncarry", None)
    if handed.head is None or uncarry is None or handed.version != workflow.version:
        return None
    if handed.age() >= lease.total_seconds() / 3:
        return None
    try:
        head = uncarry(workflow.coordination_id, handed.head)
    except Exception:  # not readable here (another key, say): the claim reads it
        logger.debug("workflow %s: carried head unreadable", workflow.name, exc_info=True)
        return None
    record = models.WorkflowRun(
        coordination_id=workflow.coordination_id,
        workflow_name=workflow.name,
        workflow_version=workflow.version,
        status=RunStatus.RUNNING,
        last_step=head.metadata.get(LAST_STEP, ""),
        head_snapshot_id=head.id,
        runner=handed.token,
        attempts=handed.attempts,
        parent_coordination_id=handed.parent_coordination_id,
        queue=handed.queue,
        queue_partition=handed.queue_partition,
        queue_priority=handed.queue_priority,
    )
    record._state.adding = False
    record._state.db = runs.db
    return Opened(record, head, head_known=True, handed_at=handed.at)


def open_run(
    workflow: Workflow, runs: RunRecords, token: str, lease: Any, input: Any, initial_state: Any
) -> Opened:
    """``_take``, and where the store can (the ORM store on the run's PostgreSQL
    database), in the claim's own statement: the seed of a run the claim creates
    (``OrmSnapshotStore.open_run``), or the latest snapshot of a run claimed on
    terms (``OrmSnapshotStore.claim_run``)."""
    store = workflow.store
    claim = RunClaim(workflow.coordination_id, workflow.name, token, lease, input, workflow.version)
    terms = workflow._claim_terms()
    try:
        if terms is None:
            opened = _open_or_seed(workflow, runs, store, claim, initial_state)
        else:
            opened = _open_on_terms(workflow, runs, store, claim, terms)
    except DatabaseError:
        from ..execution.releases import release_after_failed_claim

        release_after_failed_claim(runs, claim.coordination_id, token)
        raise
    if opened is not None:
        return opened
    return Opened(take(workflow, runs, claim))


def _open_or_seed(
    workflow: Workflow,
    runs: RunRecords,
    store: SnapshotStore,
    claim: RunClaim,
    initial_state: Any,
) -> Opened | None:
    opener = getattr(store, "open_run", None)
    if opener is None:
        return None
    seed = None
    # Most likely a new run: creating it is cheaper than the claim's upsert.
    new = (
        runs.create_claimed_statement(claim)
        if initial_state is not None and claim.resume_input is None
        else None
    )
    if new is not None:
        seed = seed_snapshot(workflow, initial_state)
        opened = opener(seed, new.statement, run_using=runs.db)
        if opened is None:
            return None
        row, seeded = opened
        if row is not None:
            return Opened.of(new.record(row), seeded)
        # The run exists (nothing was written): claim it.
    statement = runs.claim_statement(claim)
    if statement is None:
        return None
    opened = opener(seed or seed_snapshot(workflow, initial_state), statement, run_using=runs.db)
    if opened is None:
        return None
    row, seeded = opened
    if row is None:
        # Raises, unless the run was deleted meanwhile.
        runs.refused(claim.coordination_id, claim.workflow_name, claim.workflow_version)
        return None
    return Opened.of(runs.claimed(row), seeded)


def _open_on_terms(
    workflow: Workflow, runs: RunRecords, store: SnapshotStore, claim: RunClaim, terms: ClaimTerms
) -> Opened | None:
    claimer = getattr(store, "claim_run", None)
    statement = None if claimer is None else runs.claim_statement_for(claim, terms)
    if statement is None:
        return None
    found = claimer(statement, run_using=runs.db)
    if found is None:
        return None
    row, latest = found
    if row is None:
        workflow._refused(runs, terms)
    return Opened(runs.claimed(row), latest, head_known=True)


def take(workflow: Workflow, runs: RunRecords, claim: RunClaim) -> WorkflowRun:
    """``_claim``, and when a database error breaks it off, let go of the claim it
    may have taken already (the ``UPDATE`` committed, then reading the row back
    failed): nobody else knows the claim's runner token, so the run would wait for
    the whole lease."""
    try:
        return _claim(workflow, runs, claim)
    except DatabaseError:
        from ..execution.releases import release_after_failed_claim

        release_after_failed_claim(runs, claim.coordination_id, claim.runner)
        raise


def _claim(workflow: Workflow, runs: RunRecords, claim: RunClaim) -> WorkflowRun:
    terms = workflow._claim_terms()
    if terms is None:
        return runs.claim_or_create(claim)
    try:
        return runs.claim(
            claim.coordination_id,
            claim.runner,
            claim.lease,
            resume_input=claim.resume_input,
            workflow_name=claim.workflow_name,
            workflow_version=claim.workflow_version,
            where=terms.as_q(),
            held_by=terms.held_by,
        )
    except ConcurrentRunError:
        workflow._refused(runs, terms)
