"""Notifications of approval events: its request, an assignment, a reminder, an
escalation.

``notify`` writes one ``ApprovalNotification`` row (an outbox) in the event's own
transaction; the row is unique per (approval, event, number), so an event retried or
swept twice is notified once. After the commit, ``deliver`` takes the row with one
conditional ``UPDATE`` (``sending_at`` from null to now) and only then sends the
signal (``approval_requested`` and the others, ``signals``) and, with
``FLOWWARDEN["APPROVAL_EMAILS"]`` on, the email (``emails``). A process that dies
after taking the row loses that notification rather than sending it twice: at most
once, by choice (an approver reminded twice learns to ignore reminders). A row never
taken (the process died between the commit and the delivery) is delivered by the next
sweep (``deliver_pending``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING

from django.db import IntegrityError, transaction
from django.utils import timezone

from ....common.app_models import models
from ....common.robust_signals import send_logged
from .emails import emails_enabled, send_emails
from .signals import BY_EVENT

if TYPE_CHECKING:
    from ....models import Approval, ApprovalNotification

logger = logging.getLogger("flowwarden_django.workflows")

#: A row left untaken this long after its transaction is the sweep's to deliver (the
#: process that wrote it delivers it at its commit, normally well within this).
DELIVER_GRACE = timedelta(seconds=10)


def recipients_of(
    approval: Approval, users: Iterable[str] | None = None, group: str | None = None
) -> list[dict[str, str]]:
    """``[{"user": name}, ..., {"group": name}]``: *users* and *group*, or when both are
    ``None`` the approval's assignees and group (as they are now)."""
    if users is None and group is None:
        users = [a.username for a in approval.assignments.all()]
        group = approval.group
    names = sorted({name for name in users or () if name})
    return [{"user": name} for name in names] + ([{"group": group}] if group else [])


def notify(
    approval: Approval,
    event: str,
    number: int = 0,
    *,
    users: Iterable[str] | None = None,
    group: str | None = None,
    using: str | None = None,
) -> ApprovalNotification | None:
    """Record that *event* (an ``ApprovalNotification.Event``; *number*: which
    reminder) of *approval* is to be notified to *users* and *group* (both ``None``:
    its assignees and group), in the caller's transaction, and deliver it once that
    commits. ``None`` when this event was notified already."""
    db = using or approval._state.db or "default"
    row = models.ApprovalNotification(
        approval=approval,
        event=event,
        number=number,
        recipients=recipients_of(approval, users, group),
        created_at=timezone.now(),
    )
    try:
        with transaction.atomic(using=db):  # a savepoint: the caller's work stays
            row.save(using=db, force_insert=True)
    except IntegrityError:
        return None
    transaction.on_commit(partial(deliver, row.pk, using=db), using=db)
    return row


def deliver(pk: int, *, using: str) -> bool:
    """Take notification *pk* (once: a conditional ``UPDATE``), send its signal and its
    email; whether this call took it. Never raises: a failure is logged (and an email
    that failed is recorded in the row's ``error``)."""
    try:
        taken = (
            models.ApprovalNotification.objects.using(using)
            .filter(pk=pk, sending_at__isnull=True)
            .update(sending_at=timezone.now())
        )
        if taken != 1:
            return False
        row = models.ApprovalNotification.objects.using(using).select_related("approval").get(pk=pk)
    except Exception:  # the database is away: the sweep delivers it (if not taken)
        logger.exception("approval notification %s could not be taken", pk)
        return False
    _signal(row)
    error = ""
    if emails_enabled():
        try:
            send_emails(row)
        except Exception as exc:
            logger.exception("the email of approval notification %s failed", pk)
            error = f"{type(exc).__name__}: {exc}"[:2000]
    try:
        models.ApprovalNotification.objects.using(using).filter(pk=pk).update(
            sent_at=timezone.now(), error=error
        )
    except Exception:
        logger.exception("approval notification %s: recording its delivery failed", pk)
    return True


def _signal(row: ApprovalNotification) -> None:
    signal = BY_EVENT.get(row.event)
    if signal is None or not signal.receivers:
        return
    send_logged(
        signal,
        logger,
        "approval signal receiver %r failed on %s",
        row,
        sender=type(row.approval),
        approval=row.approval,
        event=row.event,
        number=row.number,
        recipients=row.recipients,
        notification=row,
    )


def deliver_pending(*, using: str, limit: int = 500) -> list[int]:
    """Deliver the notifications nobody took within ``DELIVER_GRACE`` of their
    writing (their process died before its commit hook ran); their ids."""
    due = timezone.now() - DELIVER_GRACE
    rows = models.ApprovalNotification.objects.using(using).filter(
        sending_at__isnull=True, created_at__lte=due
    )
    pks = list(rows.order_by("created_at").values_list("pk", flat=True)[:limit])
    return [pk for pk in pks if deliver(pk, using=using)]
