"""Waiting for a message: ``wait_for(state, topic, timeout=None)`` from a step, and
what the engine does when a run stands at such a wait (``awaited_message``).

The run waits with status ``waiting_message``, holding no thread or task; its record
names the topic (``waiting_topic``) and the deadline (``wake_at``), and the waiting
snapshot's metadata records both (``message.waitFor``). When the run continues at that
snapshot, the oldest undelivered message of the topic is bound to the snapshot
(``mailbox.deliver_oldest``) and handed to the next step as ``ctx.message``, read from
its row: a retry of that step, or a runner after a crash, gets the same message, and
each message is delivered once, in the order sent. With no message the run keeps
waiting, until its deadline: the recovery sweep wakes it then, as it wakes sleepers,
and the next step gets ``ctx.message is None`` (a message sent after the deadline is
left for the next wait on its topic). Input given to ``resume()`` never becomes the
message: a run that has none keeps waiting and the input is dropped (logged).

Forks and upgrades treat a wait as they treat an approval (``follow_fork``,
``operations.upgrades``): a fork of the waiting snapshot waits again, for a new
message (the one delivered to the source stays the source's), with the source's
deadline; a fork of another snapshot leaves the run ``hibernated``. An upgrade keeps
the wait, and a message delivered to the run's head follows it to the upgrade's
snapshot.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from ....common.app_models import models
from ...definition.graph import check_jump_target
from ...definition.messages import Message
from ...definition.metadata import LAST_STEP
from ...definition.results import WaitingForMessage
from ...definition.steps import Pause, deadline_after
from ...runs.records import RunRecords, RunStatus, unclaimed
from .mailbox import bound_to, check_name, deliver_oldest
from .waking import wake_after_send, wake_if_mail

if TYPE_CHECKING:
    from ...definition.results import WorkflowResult
    from ...storage.snapshot import WorkflowSnapshot

logger = logging.getLogger("flowwarden_django.workflows")

#: Snapshot metadata key of a wait: JSON ``{"topic": ..., "deadline": ISO 8601 or null}``.
WAIT_METADATA = "message.waitFor"


@dataclasses.dataclass(frozen=True)
class WaitForMessage(Pause):
    """Persist *state* and wait for a message on *topic* until *deadline* (``None``:
    no timeout); status ``waiting_message``; then continue at the next step, or at
    step *to* when given. Made by ``wait_for``; see there."""

    topic: str = ""
    deadline: datetime | None = None
    status: ClassVar[str] = RunStatus.WAITING_MESSAGE
    to: str = dataclasses.field(default="", kw_only=True)
    #: What ``on_paused`` found: whether the run was continued at once.
    woke: list[bool] = dataclasses.field(default_factory=list, repr=False, compare=False)

    @property
    def wake_at(self) -> datetime | None:
        """When the sweep wakes the run (its deadline), as ``Sleep.wake_at``."""
        return self.deadline

    @property
    def continued(self) -> bool:
        """Whether the run was continued once the wait was persisted (its message was
        there): its result is then to be read again."""
        return any(self.woke)

    def snapshot_metadata(self) -> dict[str, str]:
        return {WAIT_METADATA: wait_metadata(self.topic, self.deadline)}

    def run_fields(self) -> dict[str, Any]:
        return {"waiting_topic": self.topic, "wake_at": self.deadline}

    def on_paused(self, workflow: Any, snapshot: Any) -> None:
        # A send that committed while the runner still held the run found it held:
        # its wake did nothing, so the runner looks at the mailbox now.
        self.woke.append(wake_if_mail(workflow.coordination_id, workflow.runs.db, workflow))


def wait_for(
    state: Any, topic: str, timeout: float | timedelta | None = None, *, to: str | None = None
) -> WaitForMessage:
    """Persist *state* and wait, holding nothing, for a message on *topic* sent to this
    run (``Workflow.send``, ``ctx.send``); the next step reads it as ``ctx.message``::

        @step
        def ask_for_payment(state):
            return wait_for(state, "payment", timeout=timedelta(days=3))

        @step
        def ship(state, ctx):
            if ctx.message is None:  # three days passed without a payment
                return fail("not paid")
            return advance({**state, "paid": ctx.message.payload["amount"]})

    *timeout* (seconds or a ``timedelta``; ``None``: none): after it the next step
    runs with ``ctx.message is None``, woken by the recovery sweep as a sleep is. A
    message sent before the wait is kept, and delivered when the run waits. *to*: the
    step that reads the message instead of the next one (a loop that handles one
    message per pass, say), as ``hibernate(state, to=...)`` and ``sleep`` take it
    (``definition.graph``). See the module for the guarantees."""
    topic = check_name(topic, "the topic")
    target = check_jump_target(to)
    deadline = None if timeout is None else deadline_after(timeout, "timeout")
    return WaitForMessage(state, topic=topic, deadline=deadline, to=target)


def wait_metadata(topic: str, deadline: datetime | None) -> str:
    """The ``message.waitFor`` metadata of a wait."""
    at = None if deadline is None else deadline.isoformat()
    return json.dumps({"topic": topic, "deadline": at}, sort_keys=True)


def wait_of(snapshot: WorkflowSnapshot) -> tuple[str, datetime | None] | None:
    """``(topic, deadline)`` of the wait *snapshot* records, else ``None``."""
    raw = (snapshot.metadata or {}).get(WAIT_METADATA)
    if not raw:
        return None
    try:
        found = json.loads(raw)
        topic = found["topic"]
        deadline = None if found.get("deadline") is None else parse_datetime(found["deadline"])
    except (ValueError, TypeError, KeyError, AttributeError):
        logger.warning("snapshot %s has an unreadable message wait %r", snapshot.id, raw)
        return None
    if not isinstance(topic, str):
        return None
    return topic, deadline


class Waiter(Protocol):
    """What ``awaited_message`` uses of the engine's execution (``loop._Execution``)."""

    workflow: Any
    runs: RunRecords
    cid: str

    def finish(self, **fields: Any) -> None: ...


def awaited_message(
    execution: Waiter, head: WorkflowSnapshot, pending_input: Any
) -> tuple[WorkflowResult | None, Message | None]:
    """What the step after *head* gets when *head* waits for a message:
    ``(None, message)`` to go on (``message`` is ``None`` when *head* waits for
    nothing, and when its deadline passed without one), or ``(result, None)``: the run
    waits (it is released with status ``waiting_message``), or it was continued
    meanwhile (``result`` is then its current result)."""
    wait = wait_of(head)
    if wait is None:
        return None, None
    topic, deadline = wait
    db, cid = execution.runs.db, execution.cid
    timed_out = deadline is not None and deadline <= timezone.now()
    row = bound_to(head.id, db) or deliver_oldest(
        cid, topic, head.id, db, sent_by=deadline if timed_out else None
    )
    if row is not None:
        return None, Message.from_row(row)
    last_step = head.metadata.get(LAST_STEP, "")
    if timed_out:
        logger.info(
            "workflow %s (%s): no message on %r came by the deadline of step %r's wait",
            execution.workflow.name,
            cid,
            topic,
            last_step,
        )
        return None, None
    if pending_input is not None:
        logger.warning(
            "workflow %s (%s): the input given is not a message; ignored, the run waits "
            "for a message on %r (send one with Workflow.send)",
            execution.workflow.name,
            cid,
            topic,
        )
    execution.finish(
        status=RunStatus.WAITING_MESSAGE,
        head_snapshot_id=head.id,
        waiting_topic=topic,
        wake_at=deadline,
        resume_input=None,
    )
    if wake_if_mail(cid, db, execution.workflow):  # sent while this runner held the run
        return execution.workflow.current_result(), None
    return WaitingForMessage(head.state, cid, last_step, topic=topic, deadline=deadline), None


def follow_fork(forked: WorkflowSnapshot, runs: RunRecords) -> bool:
    """After a fork: when *forked* waits for a message (a fork of a waiting snapshot),
    make the unclaimed run wait there (for a new message, with the source's deadline;
    a cancelled run stays cancelled) and wake it once that commits if its mailbox
    holds one; True if it waits there. Else a run that waited for a message becomes
    ``hibernated``: ``run()`` continues it from the fork."""
    cid, db = forked.coordination_id, runs.db
    rows = models.WorkflowRun.objects.using(db).filter(pk=cid)
    now = timezone.now()
    wait = wait_of(forked)
    if wait is None:
        rows.filter(status=RunStatus.WAITING_MESSAGE).update(
            status=RunStatus.HIBERNATED, wake_at=None, updated_at=now
        )
        return False
    topic, deadline = wait
    waits = rows.filter(unclaimed()).exclude(status=RunStatus.CANCELLED)
    fields = {"status": RunStatus.WAITING_MESSAGE, "head_snapshot_id": forked.id}
    fields.update(waiting_topic=topic, wake_at=deadline, resume_input=None, failure_reason="")
    if waits.update(**fields, updated_at=now) != 1:
        return False
    transaction.on_commit(partial(wake_after_send, cid, db), using=db)
    return True
