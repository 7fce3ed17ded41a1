"""The approval sweep (``flowwarden_approvals sweep``, the ``expire_approvals``
task): expire due approvals, cancel the ones whose run moved on, restore the
approval of a run left waiting without one, send due reminders and escalations
(``reminders``) and deliver notifications left undelivered (``notifications``).

Idempotent and safe to run from several processes at once: every change is made
with the approval's row locked, after checking again that it is still due. Without a
database, it sweeps every database a defined workflow keeps its runs (and their
approvals) in (``definition.databases.workflow_databases``), not only the router's default.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db.models import Exists, OuterRef
from django.utils import timezone

from ....common.app_models import models
from ...definition.databases import in_every_workflow_database
from ...definition.registry import workflow_registry
from ...runs.records import RunRecords, RunStatus
from ...runs.transactions import write_transaction
from .notifications import deliver_pending
from .reminders import remind_and_escalate_due
from .request import request_approval, request_from_snapshot
from .transitions import cancel_locked, expire_locked, run_waits_for

if TYPE_CHECKING:
    from ....models import Approval

logger = logging.getLogger("flowwarden_django.workflows")


@dataclasses.dataclass
class SweepResult:
    """What one sweep did (approval ids, and coordination ids for ``restored``)."""

    expired: list[str] = dataclasses.field(default_factory=list)
    cancelled: list[str] = dataclasses.field(default_factory=list)
    restored: list[str] = dataclasses.field(default_factory=list)
    reminded: list[str] = dataclasses.field(default_factory=list)
    escalated: list[str] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, list[str]]:
        return dataclasses.asdict(self)

    def add(self, other: SweepResult) -> None:
        """Add what *other* (the sweep of another database) did."""
        self.expired += other.expired
        self.cancelled += other.cancelled
        self.restored += other.restored
        self.reminded += other.reminded
        self.escalated += other.escalated


def sweep_approvals(
    *, now: datetime | None = None, using: str | None = None, limit: int = 500
) -> SweepResult:
    """Restore missing approvals, then expire due ones and cancel stale ones (at most
    *limit* of each per call and database), in database *using*, by default in each
    of ``workflow_databases()``. A database that fails (is down, say) does not keep
    the others from being swept: its error is raised once they were."""
    now = now or timezone.now()
    if using is not None:
        return _sweep_database(RunRecords(using).db, now, limit)
    result = SweepResult()
    for swept in in_every_workflow_database(lambda db: _sweep_database(db, now, limit)):
        result.add(swept)
    return result


def _sweep_database(db: str, now: datetime, limit: int) -> SweepResult:
    restored = restore_missing_approvals(using=db, limit=limit)
    expired = expire_due_approvals(now=now, using=db, limit=limit)
    cancelled = cancel_stale_approvals(using=db, limit=limit)
    reminders = remind_and_escalate_due(db, now=now, limit=limit)
    deliver_pending(using=db, limit=limit)
    return SweepResult(
        restored=restored,
        expired=expired,
        cancelled=cancelled,
        reminded=reminders.reminded,
        escalated=reminders.escalated,
    )


def expire_due_approvals(
    *,
    now: datetime | None = None,
    using: str | None = None,
    limit: int = 500,
    coordination_id: str | None = None,
) -> list[str]:
    """Expire pending approvals whose ``expires_at`` has passed (of one run with
    *coordination_id*: its durable timer fired); their ids."""
    db = RunRecords(using).db
    now = now or timezone.now()
    due = models.Approval.objects.using(db).filter(
        status=models.Approval.Status.PENDING, expires_at__lte=now
    )
    if coordination_id is not None:
        due = due.filter(coordination_id=coordination_id)

    def expire(approval: Approval) -> bool:
        if approval.expires_at is None or approval.expires_at > now:
            return False
        return expire_locked(approval, now, db)  # False: its run is being run: the next sweep

    pks = due.order_by("expires_at").values_list("pk", flat=True)[:limit]
    return _settle_each(db, pks, expire, "expired", "approval %s of run %s expired")


def cancel_stale_approvals(
    *, using: str | None = None, limit: int = 500, coordination_id: str | None = None
) -> list[str]:
    """Cancel pending approvals whose run is no longer waiting at their snapshot
    (it was forked, resumed by hand, or deleted), of one coordination or all; their
    ids."""
    db = RunRecords(using).db
    waiting_here = models.WorkflowRun.objects.using(db).filter(
        pk=OuterRef("coordination_id"),
        status=RunStatus.WAITING,
        head_snapshot_id=OuterRef("snapshot_id"),
    )
    stale = models.Approval.objects.using(db).filter(status=models.Approval.Status.PENDING)
    stale = stale.filter(~Exists(waiting_here)).order_by("requested_at")
    if coordination_id is not None:
        stale = stale.filter(coordination_id=coordination_id)

    def cancel(approval: Approval) -> bool:
        if run_waits_for(approval, db) is not False:
            return False
        reason = "the run was not waiting for it any more"
        cancel_locked(approval, timezone.now(), db, reason)
        return True

    pks = stale.values_list("pk", flat=True)[:limit]
    return _settle_each(db, pks, cancel, "cancelled", "approval %s cancelled: run %s moved on")


def _settle_each(
    db: str, pks: Iterable[Any], settle: Callable[[Approval], bool], what: str, done: str
) -> list[str]:
    """Call *settle* on each approval of *pks* still pending, its row locked, each in
    its own transaction; the ids of those it settled (returned True for). One bad row
    does not stop the others: its error is logged (the approval could not be *what*);
    *done* logs each settled one (``pk``, its coordination)."""
    settled = []
    for pk in pks:
        try:
            with write_transaction(db):
                approval = (
                    models.Approval.objects.using(db).select_for_update().filter(pk=pk).first()
                )
                if approval is None or approval.status != models.Approval.Status.PENDING:
                    continue
                if not settle(approval):
                    continue
        except Exception:  # one bad row must not stop the sweep
            logger.exception("approval %s could not be %s", pk, what)
            continue
        settled.append(str(pk))
        logger.info(done, pk, approval.coordination_id)
    return settled


def restore_missing_approvals(*, using: str | None = None, limit: int = 500) -> list[str]:
    """Make the approval of each waiting run whose head snapshot asks for one but has
    none (the process died between the pause and the approval); their coordinations.
    Runs of workflows this process does not define are skipped."""
    db = RunRecords(using).db
    has_approval = models.Approval.objects.using(db).filter(
        snapshot_id=OuterRef("head_snapshot_id")
    )
    orphans = models.WorkflowRun.objects.using(db).filter(
        ~Exists(has_approval), status=RunStatus.WAITING, head_snapshot_id__isnull=False
    )
    restored = []
    known = workflow_registry.names()
    for run in orphans.filter(workflow_name__in=known).order_by("updated_at")[:limit]:
        try:
            definition = workflow_registry.get(run.workflow_name, run.workflow_version)
            workflow = definition.workflow(run.coordination_id)
            snapshot = workflow.store.load(run.head_snapshot_id)
            request = None if snapshot is None else request_from_snapshot(snapshot)
            if snapshot is None or request is None:
                continue
            request_approval(snapshot, request, using=db)
        except Exception:
            logger.exception("the approval of waiting run %s could not be restored", run.pk)
            continue
        restored.append(run.coordination_id)
        logger.warning("run %s was waiting without its approval; restored it", run.pk)
    return restored
