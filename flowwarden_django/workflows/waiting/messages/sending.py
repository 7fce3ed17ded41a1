"""Sending a message to a run: ``Workflow.for_coordination(cid).send(topic, payload)``
(``asend`` from async code), ``send_message`` for a run this process may not define
(the API, a command), and ``ctx.send`` from a step (``AttemptOutbox``).

A send checks its arguments (``UserJSONError`` before anything is read or written),
reads the run (``UnknownRunError``), returns the first message when its idempotency
key was sent to the run before (whatever the run's status is now: a step retried
after its target finished sends nothing, and raises nothing), refuses a finished
run (``RunFinishedError`` for a completed run, ``RunCancelledError`` for a cancelled
one), inserts the message on the run's
database in the caller's transaction when there is one (it commits or rolls back
with the caller's own writes), and wakes the run once that commits
(``transaction.on_commit``; at once without a transaction). The recovery sweep wakes
it when that wake is lost (a crash right after the commit).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from functools import partial
from typing import TYPE_CHECKING, Any

from django.db import transaction

from ....common.async_twins import thread_sensitive_twin
from ....common.stream_attempts import current_stream_attempt
from ....common.user_input import check_message_payload
from ...definition.messages import Message
from ...runs.records import RunRecords, RunStatus, UnknownRunError
from .errors import RunCancelledError, RunFinishedError
from .events import set_event
from .mailbox import MAX_NAME_CHARS, check_name, sent_with, store_message
from .waking import wake_after_send

if TYPE_CHECKING:
    from ....models import WorkflowMessage
    from ...definition.registry import Coordination

logger = logging.getLogger("flowwarden_django.workflows")


@dataclasses.dataclass(frozen=True)
class SentMessage:
    """What ``send_message`` did: the stored ``message``, and ``created``: False when
    its idempotency key had been sent before (this call stored nothing)."""

    message: Message
    created: bool


def check_message(
    topic: Any, payload: Any, idempotency_key: Any, sender: Any
) -> tuple[str, dict[str, Any], str | None, str]:
    """The arguments of a send, checked (``UserJSONError`` when one is refused)."""
    topic = check_name(topic, "the topic")
    payload = check_message_payload(payload)
    if idempotency_key is not None:
        idempotency_key = check_name(idempotency_key, "the idempotency key")
    sender = check_name(sender, "the sender", blank=True)
    return topic, payload, idempotency_key, sender


def send_message(
    coordination_id: str,
    topic: str,
    payload: dict[str, Any],
    *,
    idempotency_key: str | None = None,
    sender: str = "",
    using: str | None = None,
    workflow: Coordination | None = None,
) -> SentMessage:
    """Send *payload* on *topic* to run *coordination_id* of the runs in database
    *using* (see the module), whether or not this process defines its workflow;
    *workflow*: the run's ``Workflow``, to wake it with (``Workflow.send`` passes
    itself; default: the registered definition of the run's workflow, if any)."""
    topic, payload, idempotency_key, sender = check_message(topic, payload, idempotency_key, sender)
    runs = RunRecords(using)
    db = runs.db
    record = runs.get(coordination_id)
    if record is None:
        raise UnknownRunError(f"no workflow run {coordination_id!r}")
    repeated = None if idempotency_key is None else sent_with(coordination_id, idempotency_key, db)
    if repeated is not None:  # a repeat (a retried step's): the first, whatever the run is now
        _log_repeat(repeated, topic, payload)
        return SentMessage(Message.from_row(repeated), False)
    if record.status == RunStatus.CANCELLED:
        raise RunCancelledError(coordination_id, record.status)
    if record.status == RunStatus.COMPLETED:
        raise RunFinishedError(coordination_id, record.status)
    _warn_if_apart_from_stream(coordination_id, db, idempotency_key)
    row, created = store_message(
        coordination_id, topic, payload, idempotency_key=idempotency_key, sender=sender, using=db
    )
    if created:
        if getattr(workflow, "version", record.workflow_version) != record.workflow_version:
            workflow = None  # not the run's definition: its registered one continues it
        wake = partial(
            wake_after_send,
            coordination_id,
            db,
            record.workflow_name,
            record.workflow_version,
            workflow,
        )
        transaction.on_commit(wake, using=db)
    else:
        _log_repeat(row, topic, payload)
    return SentMessage(Message.from_row(row), created)


asend_message = thread_sensitive_twin(
    send_message,
    """``send_message`` from async code: through ``sync_to_async(thread_sensitive=True)``,
    as ``aapprove`` (the insert joins the thread-sensitive connection's transaction,
    and the wake waits for its commit; in-process, the woken run's steps run there).""",
)


#: ``(stream, database)`` pairs ``_warn_if_apart_from_stream`` has warned about.
_warned_apart: set[tuple[str, str]] = set()


def _warn_if_apart_from_stream(coordination_id: str, db: str, idempotency_key: str | None) -> None:
    """Warn (once per stream and database) when a transactional stream's handler
    sends, without an idempotency key, to a run whose database is not the one its
    checkpoint commits on: that message commits apart from the stream's anchor, so a
    crash between the two commits delivers the event, and sends, again."""
    attempt = current_stream_attempt()
    if attempt is None or idempotency_key is not None or attempt.using == db:
        return
    if (attempt.stream, db) in _warned_apart:
        return
    _warned_apart.add((attempt.stream, db))
    logger.warning(
        "stream %r commits its checkpoint on database %r, but its handler sends a message "
        "to run %s, whose runs are on database %r: the message commits apart from the "
        "checkpoint, so it is not exactly once (an event delivered again after a crash "
        "sends again). Keep the runs on the stream's database, or pass "
        "idempotency_key=<the event's id>",
        attempt.stream,
        attempt.using,
        coordination_id,
        db,
    )


def _log_repeat(row: WorkflowMessage, topic: str, payload: dict[str, Any]) -> None:
    if row.topic != topic or row.payload != payload:
        logger.warning(
            "a message to run %s reused idempotency key %r with another topic or "
            "payload; nothing sent, the first message (%s) stands",
            row.coordination_id,
            row.idempotency_key,
            row.pk,
        )


def step_message_key(position: str, step_name: str, count: int) -> str:
    """The idempotency key of send number *count* (from 1) of one attempt of step
    *step_name* run from snapshot *position*: the same for every attempt, retry and
    redelivery of that step there."""
    key = f"step:{position}:{count}:{step_name}"
    if len(key) <= MAX_NAME_CHARS:
        return key
    digest = hashlib.sha256(step_name.encode("utf-8", "surrogatepass")).hexdigest()
    return f"step:{position}:{count}:{digest}"


class AttemptOutbox:
    """``ctx.send`` and ``ctx.set_event`` of one attempt of a step of run
    *coordination_id* (in database *using*), run from snapshot *position*: each
    attempt gets a new one, so its sends are numbered from 1 again and a retry sends
    the same keys (``step_message_key``)."""

    def __init__(self, coordination_id: str, position: str, step_name: str, using: str) -> None:
        self.coordination_id = coordination_id
        self.position = position
        self.step_name = step_name
        self.using = using
        self.sent = 0

    def send(
        self, coordination_id: str, topic: str, payload: Any, *, using: str | None = None
    ) -> Message:
        """Send to run *coordination_id*, by default of this run's database."""
        self.sent += 1
        key = step_message_key(self.position, self.step_name, self.sent)
        return send_message(
            coordination_id,
            topic,
            payload,
            idempotency_key=key,
            sender=self.coordination_id,
            using=using or self.using,
        ).message

    def set_event(self, key: str, value: Any) -> None:
        set_event(self.coordination_id, key, value, using=self.using)
