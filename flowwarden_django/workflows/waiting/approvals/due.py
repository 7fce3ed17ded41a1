"""When an approval is due, and which are overdue.

An approval is *overdue* when it is pending and one of its deadlines has passed:
its escalation time (``escalate_at``; so an escalated approval stays overdue, since
escalation sets ``escalated_at`` only once ``escalate_at`` has passed) or its expiry
(``expires_at``, until the sweep expires it). Reminders are not deadlines: an
approval with only ``remind_every`` is never overdue.

``overdue_q`` is one filter on indexed columns: ``fw_approval_escalate`` and
``fw_approval_expiry`` lead with ``status`` then the time, so PostgreSQL answers it
from an index scan of the pending approvals, not by reading the table
(``tests/inbox/test_inbox_due.py``).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import TYPE_CHECKING

from django.db.models import Q
from django.utils import timezone

from ....common.app_models import models

if TYPE_CHECKING:
    from ....models import Approval


def overdue_q(now: datetime | None = None) -> Q:
    """Pending approvals whose escalation time or expiry is at or before *now*."""
    now = now or timezone.now()
    pending = Q(status=models.Approval.Status.PENDING)
    return pending & (Q(escalate_at__lte=now) | Q(expires_at__lte=now))


@dataclasses.dataclass(frozen=True)
class DueTimes:
    """An approval's deadlines as a page shows them: when it is due (its expiry),
    when it escalates or escalated, and whether it is overdue (see the module)."""

    due_at: datetime | None
    escalate_at: datetime | None
    escalated_at: datetime | None
    overdue: bool


def due_times(approval: Approval, now: datetime | None = None) -> DueTimes:
    """*approval*'s deadlines; none but ``escalated_at`` once it is no longer pending
    (they no longer apply)."""
    now = now or timezone.now()
    pending = approval.status == models.Approval.Status.PENDING
    due_at = approval.expires_at if pending else None
    escalate_at = approval.escalate_at if pending and approval.escalated_at is None else None
    passed = [at for at in (approval.expires_at, approval.escalate_at) if at is not None]
    return DueTimes(
        due_at=due_at,
        escalate_at=escalate_at,
        escalated_at=approval.escalated_at,
        overdue=pending and any(at <= now for at in passed),
    )
