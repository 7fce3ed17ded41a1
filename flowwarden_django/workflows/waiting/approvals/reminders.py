"""Reminders and escalation of pending approvals (``await_approval(remind_every=...,
escalate_after=..., escalate_to=...)``), a step of every sweep.

``remind_and_escalate_due`` is called by the recovery sweep (every Celery worker's,
``flowwarden_temporal_worker``'s, ``flowwarden_workflows recover --every``'s) and by
the approval sweep (``sweep_approvals``), so they come within one sweep interval of
their time; on Temporal, the run's workflow also sets a durable timer to the next one
(``next_due_at``), whose activity sends it. Each reminder is one conditional
``UPDATE`` guarded on the values read (``next_reminder_at``, ``reminders_sent``): of
two sweepers, one sends it. It moves ``next_reminder_at`` to the first time after
now (a sweep that was down for a while sends one reminder, not the ones it missed),
and writes the ``reminded`` audit event and its notification in the same transaction.
Escalation happens once (``escalated_at`` is null in its guard): a group named in
``escalate_to`` becomes the approval's group (the old group can no longer decide it),
usernames are added to its assignees (the old assignees keep it); audited
(``escalated``, with what changed) and notified to the new deciders. A claim held at
that time is released in the same transaction (the claimant would otherwise keep the
new deciders out), audited as ``released`` by the system (no actor).
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime

from django.db.models import F
from django.utils import timezone

from ....common.app_models import models
from ...runs.records import RunRecords
from ...runs.transactions import write_transaction
from .notifications import notify

logger = logging.getLogger("flowwarden_django.workflows")


@dataclasses.dataclass
class ReminderResult:
    """What one ``remind_and_escalate_due`` did: "<approval id>#<number>" per reminder,
    approval ids escalated."""

    reminded: list[str] = dataclasses.field(default_factory=list)
    escalated: list[str] = dataclasses.field(default_factory=list)


def next_due_at(approval: models.Approval) -> datetime | None:
    """When *approval* (pending) next has something due: its expiry, its next reminder
    or its escalation; ``None``: nothing (the Temporal workflow's durable timer)."""
    due = [approval.expires_at, approval.next_reminder_at if approval.remind_every else None]
    if approval.escalated_at is None:
        due.append(approval.escalate_at)
    times = [at for at in due if at is not None]
    return min(times) if times else None


def remind_and_escalate_due(
    using: str | None = None,
    *,
    now: datetime | None = None,
    limit: int = 500,
    coordination_id: str | None = None,
) -> ReminderResult:
    """Send the due reminders and escalations of pending approvals in database *using*
    (at most *limit* of each; of run *coordination_id* only: its durable timer fired);
    idempotent and safe from several processes at once."""
    db = RunRecords(using).db
    now = now or timezone.now()
    result = ReminderResult()
    pending = models.Approval.objects.using(db).filter(status=models.Approval.Status.PENDING)
    if coordination_id is not None:
        pending = pending.filter(coordination_id=coordination_id)
    due = pending.filter(next_reminder_at__lte=now, remind_every__isnull=False)
    for approval in due.order_by("next_reminder_at")[:limit]:
        try:
            number = _remind(approval, now, db)
        except Exception:  # one bad row must not stop the sweep
            logger.exception("approval %s: the reminder failed", approval.pk)
            continue
        if number:
            result.reminded.append(f"{approval.pk}#{number}")
    due = pending.filter(escalate_at__lte=now, escalated_at__isnull=True)
    for approval in due.order_by("escalate_at")[:limit]:
        try:
            escalated = _escalate(approval, now, db)
        except Exception:
            logger.exception("approval %s: the escalation failed", approval.pk)
            continue
        if escalated:
            result.escalated.append(str(approval.pk))
    return result


def _remind(approval: models.Approval, now: datetime, db: str) -> int:
    """Reminder number n of *approval*, if no other sweeper sent it first; n or 0."""
    every, due = approval.remind_every, approval.next_reminder_at
    if not every or every.total_seconds() <= 0 or due is None:
        return 0
    following = due + every
    if following <= now:  # missed ones are skipped, not sent in a burst
        following += every * ((now - following) // every + 1)
    number = approval.reminders_sent + 1
    with write_transaction(db):
        moved = (
            models.Approval.objects.using(db)
            .filter(
                pk=approval.pk,
                status=models.Approval.Status.PENDING,
                next_reminder_at=due,
                reminders_sent=approval.reminders_sent,
            )
            .update(next_reminder_at=following, reminders_sent=F("reminders_sent") + 1)
        )
        if moved != 1:
            return 0
        models.ApprovalEvent.objects.using(db).create(
            approval=approval,
            action=models.ApprovalEvent.Action.REMINDED,
            at=now,
            payload={"number": number, "next_reminder_at": following.isoformat()},
        )
        notify(approval, models.ApprovalNotification.Event.REMINDED, number, using=db)
    logger.info("approval %s: reminder %d sent", approval.pk, number)
    return number


def _escalate(approval: models.Approval, now: datetime, db: str) -> bool:
    """Escalate *approval* to its ``escalate_to`` once; whether this call did."""
    to_group = approval.escalate_to_group or ""
    to_users = sorted({str(name) for name in approval.escalate_to_users or () if name})
    with write_transaction(db):
        rows = models.Approval.objects.using(db).filter(pk=approval.pk)
        # Locked first, so the claim read is the one this escalation releases (a claim
        # or a decision racing it waits for the commit).
        holder = rows.select_for_update().values_list("claimed_by", flat=True).first()
        changes: dict[str, object] = {"escalated_at": now, "claimed_by": "", "claimed_at": None}
        if to_group:
            changes["group"] = to_group
        moved = rows.filter(status=models.Approval.Status.PENDING, escalated_at=None).update(
            **changes
        )
        if moved != 1:
            return False
        models.ApprovalAssignee.objects.using(db).bulk_create(
            [models.ApprovalAssignee(approval=approval, username=name) for name in to_users],
            ignore_conflicts=True,
        )
        models.ApprovalEvent.objects.using(db).create(
            approval=approval,
            action=models.ApprovalEvent.Action.ESCALATED,
            at=now,
            comment=f"escalated to {to_group or ', '.join(to_users)}",
            payload={
                "from_group": approval.group,
                "to_group": to_group,
                "added_assignees": to_users,
            },
        )
        if holder:
            models.ApprovalEvent.objects.using(db).create(
                approval=approval,
                action=models.ApprovalEvent.Action.RELEASED,
                at=now,
                payload={"claimed_by": holder},
                detail=f"the claim of {holder} released: the approval was escalated",
            )
        notify(
            approval,
            models.ApprovalNotification.Event.ESCALATED,
            users=to_users,
            group=to_group,
            using=db,
        )
    logger.info("approval %s escalated to %s", approval.pk, to_group or to_users)
    return True
