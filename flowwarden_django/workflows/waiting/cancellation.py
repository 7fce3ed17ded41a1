"""Cancelling a workflow run: ``Workflow.cancel(reason, by=...)``.

A cancelled run (status ``cancelled``) never saves another step, on any provider. The
cancel writes a snapshot of its own after the run's latest, with
``workflow.cancelled`` metadata (reason, by), and moves the run to it, lets go of any
runner's claim, and cancels the run's pending approvals (audited, with who
cancelled), in one transaction of the run's database.

A step running at that moment finishes, and its result is discarded: its snapshot
would take the ``seq`` the cancel's snapshot took (the store refuses it), and its
runner no longer holds the run. So does a step the run was handed to between two
steps (``handoff``: Celery and Temporal), which may still start. Steps do not see
the cancel while they run; one that must stop early checks ``workflow.status``
itself. The provider is told once the cancel committed
(``ExecutionProvider.cancelled``): Temporal cancels the run's workflow; Celery's
queued tasks find the run moved on and do nothing. The run's unfinished child runs
(``spawn``) are cancelled with it, and a parent waiting for it is continued when it
was the last child running.

Completed and cancelled runs are left as they are (``CancelOutcome.cancelled`` is
False); a failed, paused, sleeping or running run is cancelled.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from functools import partial
from typing import TYPE_CHECKING, Any

from django.db import OperationalError, transaction
from django.utils import timezone

from ...common.app_models import models
from ...common.json_metadata import json_object
from ..definition.metadata import CANCELLED, LAST_STEP, WORKFLOW_DONE, WORKFLOW_NAME
from ..runs.records import RunStatus, UnknownRunError
from ..runs.transactions import write_transaction
from ..storage.store import SnapshotConflictError
from .approvals.transitions import record_event

if TYPE_CHECKING:
    from ..storage.snapshot import WorkflowSnapshot

logger = logging.getLogger("flowwarden_django.workflows")

#: Characters of a cancel's reason kept.
REASON_LIMIT = 1000
#: Times the cancel is tried again when a step wrote its ``seq`` first (or the
#: database broke a deadlock by rolling it back).
CONFLICT_TRIES = 5
#: PostgreSQL's deadlock and serialization failures: the transaction was rolled back.
RETRYABLE_SQLSTATES = ("40P01", "40001")
#: MySQL/MariaDB's deadlock and lock wait timeout.
RETRYABLE_MYSQL_CODES = (1213, 1205)


def _rolled_back(exc: OperationalError) -> bool:
    """Whether the database rolled the transaction back to break a deadlock (or a
    serialization failure): trying again is safe."""
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) in RETRYABLE_SQLSTATES:
        return True
    args = getattr(cause, "args", ())
    return bool(args) and args[0] in RETRYABLE_MYSQL_CODES


@dataclasses.dataclass(frozen=True)
class CancelOutcome:
    """What ``Workflow.cancel`` did: ``cancelled`` is False when the run was already
    completed or cancelled (``status`` says which); ``approvals`` the ids of the
    pending approvals it cancelled."""

    coordination_id: str
    cancelled: bool
    status: str
    approvals: tuple[str, ...] = ()


def cancellation_of(snapshot: WorkflowSnapshot) -> dict[str, Any]:
    """The ``{"reason", "by"}`` a cancel's snapshot records (``{}`` for any other)."""
    if snapshot.metadata.get(CANCELLED) is None:
        return {}
    found = json_object(snapshot.metadata, CANCELLED)
    return {"reason": ""} if found is None else found


def cancel_run(workflow: Any, reason: str = "", *, by: str = "") -> CancelOutcome:
    """Cancel *workflow*'s run (see the module). ``UnknownRunError`` when it has none."""
    reason = str(reason or "")[:REASON_LIMIT]
    runs, store, cid = workflow.runs, workflow.store, workflow.coordination_id
    for _ in range(CONFLICT_TRIES):
        record = runs.get(cid)
        if record is None:
            raise UnknownRunError(f"no workflow run {cid!r}")
        if record.status in RunStatus.FINAL:
            return CancelOutcome(cid, False, record.status)
        try:
            with write_transaction(runs.db):
                # Locks in the order deciding takes them (approval, then run), and the
                # run's row before its snapshot, as a step's save does: no deadlock.
                pending = _lock_pending_approvals(runs.db, cid)
                if not _lock_unfinished_run(runs.db, cid):
                    raise _RunFinished
                head = store.latest(cid)  # read under the run's lock
                saved = (
                    None
                    if head is None
                    else store.save(_cancel_snapshot(workflow, head, reason, by))
                )
                if not _move_run(runs.db, cid, saved, reason):
                    raise _RunFinished
                approvals = _cancel_approvals(runs.db, pending, reason, by)
        except SnapshotConflictError:
            continue  # a step wrote that seq first: cancel after it
        except _RunFinished:
            continue
        except OperationalError as exc:
            if not _rolled_back(exc):
                raise
            continue  # a deadlock or serialization failure: rolled back, try again
        logger.info("workflow %s (%s) cancelled by %s: %s", workflow.name, cid, by or "-", reason)
        transaction.on_commit(lambda: _tell_provider(workflow), using=runs.db)
        after = partial(_after_cancel, runs.db, record, reason, by)
        transaction.on_commit(after, using=runs.db)
        return CancelOutcome(cid, True, RunStatus.CANCELLED, approvals)
    record = runs.get(cid)
    status = record.status if record is not None else RunStatus.CANCELLED
    return CancelOutcome(cid, status == RunStatus.CANCELLED, status)


@dataclasses.dataclass(frozen=True)
class _Coordination:
    """What ``cancel_run`` needs of a run whose definition this process may lack."""

    name: str
    coordination_id: str
    runs: Any
    store: Any


def cancel_coordination(
    coordination_id: str, reason: str = "", *, by: str = "", using: str | None = None
) -> CancelOutcome:
    """Cancel run *coordination_id* of the runs in *using*, whether or not this process
    defines its workflow (or its version): the endpoint, the admin action and the
    command cancel any run. ``UnknownRunError`` when there is none."""
    from ..definition.registry import store_for_workflow, workflow_registry
    from ..runs.records import RunRecords
    from ..storage.store import snapshot_stores

    runs = RunRecords(using)
    record = runs.get(coordination_id)
    if record is None:
        raise UnknownRunError(f"no workflow run {coordination_id!r}")
    name = record.workflow_name
    if workflow_registry.defines(name, record.workflow_version):
        workflow = workflow_registry.get(name, record.workflow_version).workflow(coordination_id)
        return cancel_run(workflow, reason, by=by)
    store = store_for_workflow(name)
    store = snapshot_stores[store] if isinstance(store, str) else store
    return cancel_run(_Coordination(name, coordination_id, runs, store), reason, by=by)


class _RunFinished(Exception):
    """The run completed (or was cancelled) between the read and the cancel."""


def _cancel_snapshot(
    workflow: Any, head: WorkflowSnapshot, reason: str, by: str
) -> WorkflowSnapshot:
    metadata = {
        LAST_STEP: head.metadata.get(LAST_STEP, ""),
        WORKFLOW_NAME: workflow.name,
        WORKFLOW_DONE: "false",
        CANCELLED: json.dumps({"reason": reason, "by": by}, separators=(",", ":")),
    }
    return head.successor(head.state, agent_name=workflow.name, metadata=metadata)


def _move_run(db: str, cid: str, saved: WorkflowSnapshot | None, reason: str) -> bool:
    fields: dict[str, Any] = {
        "status": RunStatus.CANCELLED,
        "failure_reason": reason,
        "runner": "",
        "claimed_until": None,
        "resume_input": None,
        "wake_at": None,
        "updated_at": timezone.now(),
    }
    if saved is not None:
        fields["head_snapshot_id"] = saved.id
    rows = models.WorkflowRun.objects.using(db).filter(pk=cid).exclude(status__in=RunStatus.FINAL)
    return rows.update(**fields) == 1


def _lock_pending_approvals(db: str, cid: str) -> list[Any]:
    rows = models.Approval.objects.using(db).select_for_update()
    return list(rows.filter(coordination_id=cid, status=models.Approval.Status.PENDING))


def _lock_unfinished_run(db: str, cid: str) -> bool:
    rows = models.WorkflowRun.objects.using(db).select_for_update().filter(pk=cid)
    return rows.exclude(status__in=RunStatus.FINAL).exists()


def _cancel_approvals(db: str, pending: list[Any], reason: str, by: str) -> tuple[str, ...]:
    now = timezone.now()
    cancelled = []
    for approval in pending:
        approval.status = models.Approval.Status.CANCELLED
        approval.decided_at = now
        approval.save(using=db, update_fields=["status", "decided_at"])
        detail = f"the run was cancelled: {reason}" if reason else "the run was cancelled"
        record_event(approval, "cancelled", using=db, actor=by, at=now, detail=detail)
        cancelled.append(str(approval.pk))
    return tuple(cancelled)


def _after_cancel(db: str, record: Any, reason: str, by: str) -> None:
    """Cancel the run's unfinished children, and continue its parent if this was the
    last child it waited for."""
    from .children import notify_parent, unfinished_children_of

    for child in unfinished_children_of(record.coordination_id, db):
        try:
            cancel_coordination(child, reason, by=by, using=db)
        except UnknownRunError:
            continue
    notify_parent(record)


def _tell_provider(workflow: Any) -> None:
    from ..execution.providers import configured_provider

    try:
        configured_provider().cancelled(workflow)
    except Exception:  # the cancel stands; the provider's tasks find the run cancelled
        logger.warning(
            "workflow %s (%s): telling the execution provider of the cancel failed",
            workflow.name,
            workflow.coordination_id,
            exc_info=True,
        )
