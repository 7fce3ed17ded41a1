"""The state changes of an approval, made while its row is locked (inside the
caller's transaction): each writes its audit event, moves the run, and resumes it
once the transaction commits."""

from __future__ import annotations

import logging
import uuid
from functools import partial
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from ....common.app_models import models
from ...definition.decisions import ApprovalDecision
from ...definition.registry import workflow_for
from ...runs.records import ConcurrentRunError, RunRecords, RunStatus
from .errors import UnknownApprovalError

if TYPE_CHECKING:
    from datetime import datetime

    from ....models import Approval
    from ...definition.results import WorkflowResult

logger = logging.getLogger("flowwarden_django.workflows")


class ResumeOutcome:
    """Filled once the transaction commits: the result of resuming the run in this
    process (``None`` when it was not resumed here)."""

    def __init__(self) -> None:
        self.result: WorkflowResult | None = None


def load_locked(approval_id: Any, using: str) -> Approval:
    """The approval *approval_id*, its row locked until the transaction ends
    (``UnknownApprovalError`` when there is none, or the id is no UUID)."""
    try:
        key = approval_id if isinstance(approval_id, uuid.UUID) else uuid.UUID(str(approval_id))
        return models.Approval.objects.using(using).select_for_update().get(pk=key)
    except (ValueError, models.Approval.DoesNotExist):
        raise UnknownApprovalError(f"no approval {approval_id!r}") from None


def record_event(
    approval: Approval,
    action: str,
    *,
    using: str,
    actor: str = "",
    at: datetime | None = None,
    comment: str = "",
    payload: Any = None,
    detail: str = "",
) -> None:
    """Add an ``ApprovalEvent`` to *approval*'s audit trail."""
    models.ApprovalEvent.objects.using(using).create(
        approval=approval,
        action=action,
        actor=actor,
        at=at or timezone.now(),
        comment=comment,
        payload=payload,
        detail=detail,
    )


def resume_on_commit(approval: Approval, using: str) -> ResumeOutcome:
    """Continue *approval*'s run once the current transaction commits.

    The run already holds the decision as its input (``accept_decision``), so it is
    continued with ``run()``, not ``resume(input)``: if another runner continued it
    first (and it waits again, for another approval), this call finds it waiting and
    does nothing, instead of handing it this old decision. When this process cannot
    resume it (its workflow is not defined here, the broker is
    down, another runner holds it), the recovery sweep or the next ``run()``
    continues it; that is logged, never raised.
    """
    outcome = ResumeOutcome()
    cid = approval.coordination_id

    def resume() -> None:
        try:
            workflow = workflow_for(cid, using=using)
        except LookupError as exc:
            logger.warning(
                "approval %s was decided, but run %s cannot be resumed here (%s); "
                "a process that defines the workflow continues it (recovery sweep)",
                approval.pk,
                cid,
                exc,
            )
            return
        try:
            outcome.result = workflow.run()
        except ConcurrentRunError as exc:
            logger.info("approval %s: run %s is being run elsewhere: %s", approval.pk, cid, exc)
        except Exception:
            logger.exception(
                "approval %s was decided, but resuming run %s failed; the recovery sweep "
                "continues it",
                approval.pk,
                cid,
            )

    transaction.on_commit(resume, using=using)
    return outcome


def expire_locked(approval: Approval, now: datetime, using: str) -> bool:
    """Expire pending *approval* (its row locked): resume its run with an ``expired``
    decision or fail it, per the approval's ``on_expiry``. False (nothing changed)
    when a runner holds the run right now: try again later."""
    runs = RunRecords(using)
    cid, head = approval.coordination_id, approval.snapshot_id
    decision = ApprovalDecision(str(approval.pk), "expired", decided_at=now.isoformat())
    if approval.on_expiry == models.Approval.OnExpiry.FAIL:
        moved = runs.fail_waiting(cid, head, f"approval {approval.pk} expired")
        detail = "the run failed"
    else:
        moved = runs.accept_decision(cid, head, decision.as_input())
        detail = "the run resumes with an expired decision"
    if not moved:
        if run_waits_for(approval, using) is not False:
            return False  # claimed at this instant (or released meanwhile): not decided
        detail = "the run was not waiting for it any more"
    approval.status = models.Approval.Status.EXPIRED
    approval.decided_at = now
    approval.save(using=using, update_fields=["status", "decided_at"])
    record_event(approval, "expired", using=using, at=now, detail=detail)
    if moved and approval.on_expiry != models.Approval.OnExpiry.FAIL:
        resume_on_commit(approval, using)
    elif moved:  # failed: a parent waiting for this run may go on
        transaction.on_commit(partial(_notify_parent_of, cid, using), using=using)
    return True


def _notify_parent_of(coordination_id: str, using: str) -> None:
    from ..children import notify_parent

    record = RunRecords(using).get(coordination_id)
    if record is not None:
        notify_parent(record)


def cancel_locked(approval: Approval, now: datetime, using: str, reason: str) -> None:
    """Cancel pending *approval* (its row locked): it is no longer wanted."""
    approval.status = models.Approval.Status.CANCELLED
    approval.decided_at = now
    approval.save(using=using, update_fields=["status", "decided_at"])
    record_event(approval, "cancelled", using=using, at=now, detail=reason)


def run_waits_for(approval: Approval, using: str) -> bool | None:
    """True when the run waits at *approval*'s snapshot, ``None`` when it does but a
    runner holds it right now (try again), False when it moved on."""
    run = RunRecords(using).get(approval.coordination_id)
    if run is None or run.status != RunStatus.WAITING:
        return False
    if run.head_snapshot_id != approval.snapshot_id:
        return False
    held = run.runner and run.claimed_until is not None and run.claimed_until > timezone.now()
    return None if held else True
