"""A run's mailbox: its ``WorkflowMessage`` rows, one topic at a time.

* ``store_message`` inserts a message in the caller's transaction (a savepoint), at
  most once per ``(run, idempotency key)``: the unique key turns a second insert into
  an ``IntegrityError``, after which the first message is read back.
* ``deliver_oldest`` binds the oldest undelivered message of a topic to a waiting
  snapshot: one conditional ``UPDATE ... WHERE delivered_to IS NULL`` on the row
  found, tried again when another binder took it first; ``delivered_to`` is unique,
  so a snapshot never gets two. ``bound_to`` reads the message a snapshot got: what a
  retry, or a runner after a crash, hands the step again.
* ``wake_for_mail`` / ``runs_with_mail`` find a run that waits for a topic its
  mailbox holds a message of (one conditional ``UPDATE``, one query for the sweep).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from ....common.app_models import models
from ....common.user_input import UserJSONError, check_text
from ...runs.records import RunRecords, RunStatus

if TYPE_CHECKING:
    from ....models import WorkflowMessage

#: The most characters of a topic, a sender, an idempotency key or an event's key.
MAX_NAME_CHARS = 255
#: How many times a delivery looks again when another binder took the message it found.
DELIVERY_TRIES = 10


def check_name(value: Any, what: str, *, blank: bool = False) -> str:
    """*value* when it is text of at most ``MAX_NAME_CHARS``, storable (and not blank
    unless *blank*); else ``UserJSONError``."""
    text = check_text(value, what=what, max_chars=MAX_NAME_CHARS)
    if not blank and not text.strip():
        raise UserJSONError(f"{what} must not be blank", "json_invalid")
    return text


def _rows(using: str) -> Any:
    return models.WorkflowMessage.objects.using(using)


def sent_with(coordination_id: str, idempotency_key: str, using: str) -> WorkflowMessage | None:
    """The message sent to run *coordination_id* with *idempotency_key*, or ``None``."""
    found = _rows(using).filter(coordination_id=coordination_id, idempotency_key=idempotency_key)
    return found.first()


def store_message(
    coordination_id: str,
    topic: str,
    payload: dict[str, Any],
    *,
    idempotency_key: str | None,
    sender: str,
    using: str,
) -> tuple[WorkflowMessage, bool]:
    """Insert the message (in the caller's transaction, if any) and return
    ``(row, True)``; ``(first row, False)`` when *idempotency_key* was sent to the run
    before (nothing stored)."""
    if idempotency_key is not None:
        existing = sent_with(coordination_id, idempotency_key, using)
        if existing is not None:
            return existing, False
    row = models.WorkflowMessage(
        coordination_id=coordination_id,
        topic=topic,
        payload=payload,
        sender=sender,
        sent_at=timezone.now(),
        idempotency_key=idempotency_key,
    )
    try:
        # A savepoint inside the caller's transaction: a clash on the key must not
        # break it (PostgreSQL aborts a transaction after an error otherwise).
        with transaction.atomic(using=using):
            row.save(using=using, force_insert=True)
    except IntegrityError:
        if idempotency_key is None:
            raise
        existing = sent_with(coordination_id, idempotency_key, using)  # committed first
        if existing is None:
            raise
        return existing, False
    return row, True


def bound_to(snapshot_id: str, using: str) -> WorkflowMessage | None:
    """The message delivered to waiting snapshot *snapshot_id*, or ``None``."""
    return _rows(using).filter(delivered_to=snapshot_id).first()


def deliver_oldest(
    coordination_id: str,
    topic: str,
    snapshot_id: str,
    using: str,
    *,
    sent_by: datetime | None = None,
) -> WorkflowMessage | None:
    """Bind the oldest undelivered message of *topic* (sent by *sent_by*, when given)
    to waiting snapshot *snapshot_id* and return it; the message bound to it already,
    if one is; ``None`` when the mailbox has none."""
    rows = _rows(using)
    pending = rows.filter(coordination_id=coordination_id, topic=topic, delivered_to=None)
    if sent_by is not None:
        pending = pending.filter(sent_at__lte=sent_by)
    for _ in range(DELIVERY_TRIES):
        oldest = pending.order_by("id").first()
        if oldest is None:
            return bound_to(snapshot_id, using)
        now = timezone.now()
        try:
            with transaction.atomic(using=using):
                taken = rows.filter(pk=oldest.pk, delivered_to=None).update(
                    delivered_to=snapshot_id, delivered_at=now
                )
        except IntegrityError:  # another runner of this run bound one to the snapshot
            return bound_to(snapshot_id, using)
        if taken == 1:
            oldest.delivered_to, oldest.delivered_at = snapshot_id, now
            return oldest
    return bound_to(snapshot_id, using)


def _mail_for_topic() -> Any:
    """A run's undelivered messages of the topic it waits for (``OuterRef``)."""
    return models.WorkflowMessage.objects.filter(
        coordination_id=OuterRef("pk"), topic=OuterRef("waiting_topic"), delivered_to=None
    )


def wake_for_mail(coordination_id: str, using: str) -> bool:
    """Make run *coordination_id* ``running`` if it waits for a message, no runner
    holds it, and its mailbox holds one of the topic it waits for: one conditional
    ``UPDATE``; True if it did. Whoever called continues it."""
    rows = (
        models.WorkflowRun.objects.using(using)
        .filter(pk=coordination_id, status=RunStatus.WAITING_MESSAGE, runner="")
        .filter(Exists(_mail_for_topic()))
    )
    fields = {"status": RunStatus.RUNNING, "wake_at": None, "updated_at": timezone.now()}
    return rows.update(**fields) == 1


def runs_with_mail(*, using: str | None = None, limit: int | None = 100) -> list[Any]:
    """Runs waiting for a message their mailbox holds, oldest first (at most *limit*):
    the sweep continues them (a wake after a send lost in a crash, or sent from a
    process that does not define the run's workflow)."""
    rows = (
        models.WorkflowRun.objects.using(RunRecords(using).db)
        .filter(status=RunStatus.WAITING_MESSAGE, runner="")
        .filter(Exists(_mail_for_topic()))
        .order_by("updated_at", "coordination_id")
    )
    return list(rows if limit is None else rows[:limit])
