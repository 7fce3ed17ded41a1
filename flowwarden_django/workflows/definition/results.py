"""What running a workflow returns: ``Completed``, ``Hibernated`` (``Waiting``,
``Sleeping``, ``WaitingForChildren``, ``WaitingForMessage``), ``Failed``,
``Cancelled``, ``NeedsUpgrade`` or ``Running`` (all ``WorkflowResult``), and
``StartedRun`` from ``Workflow.start``.

They live below the engine so that execution providers and approvals can name them
without importing it; ``engine`` and ``flowwarden_django.workflows`` re-export them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from ..runs.records import RunStatus


class WorkflowResult:
    """What ``run()`` / ``resume()`` returned: ``Completed``, ``Hibernated``, ``Failed``
    or ``Running``. ``status`` is the run's status afterwards."""

    coordination_id: str
    status: str


@dataclasses.dataclass(frozen=True)
class Completed(WorkflowResult):
    """The workflow finished (a ``done`` outcome, or the last step advanced)."""

    final_state: Any
    coordination_id: str
    status: ClassVar[str] = RunStatus.COMPLETED


@dataclasses.dataclass(frozen=True)
class Hibernated(WorkflowResult):
    """A step paused the run (``hibernated``, or ``waiting`` for an approval); run or
    resume it later to continue at the step after ``last_step_name`` (or at the step
    that step jumped to: ``definition.graph``)."""

    saved_state: Any
    coordination_id: str
    last_step_name: str
    status: str = RunStatus.HIBERNATED


@dataclasses.dataclass(frozen=True)
class Waiting(Hibernated):
    """The run waits for a decision (status ``waiting``): an approval, or an input a
    step asked for. A ``Hibernated`` too, so code that tests for a pause still sees
    one; its name says what the run waits for."""

    status: str = RunStatus.WAITING


@dataclasses.dataclass(frozen=True)
class Sleeping(Hibernated):
    """A step returned ``sleep(...)``: the run waits, holding no thread or task, and
    continues by itself at ``wake_at`` (or earlier when run or resumed). A
    ``Hibernated`` too."""

    wake_at: Any = None
    status: str = RunStatus.SLEEPING


@dataclasses.dataclass(frozen=True)
class WaitingForChildren(Hibernated):
    """A step returned ``spawn(...)``: the run continues once every child run has
    finished. A ``Hibernated`` too."""

    status: str = RunStatus.WAITING_CHILDREN


@dataclasses.dataclass(frozen=True)
class WaitingForMessage(Hibernated):
    """A step returned ``wait_for(...)``: the run waits, holding nothing, for a message
    on ``topic`` (``Workflow.send``), or until ``deadline`` (``None``: no timeout). A
    ``Hibernated`` too."""

    topic: str = ""
    deadline: Any = None
    status: str = RunStatus.WAITING_MESSAGE


@dataclasses.dataclass(frozen=True)
class WaitingForSlot(Hibernated):
    """The run's next step waits for a slot of ``queue`` (``FLOWWARDEN["WORKFLOW_QUEUES"]``):
    the run holds nothing, and continues by itself, in priority then arrival order,
    once one is free. A ``Hibernated`` too."""

    queue: str = ""
    status: str = RunStatus.WAITING_SLOT


def paused(
    state: Any,
    coordination_id: str,
    last_step: str,
    status: str,
    wake_at: Any = None,
    topic: str = "",
    queue: str = "",
) -> Hibernated:
    """The result of a run paused with *status*: ``Waiting``, ``Sleeping``,
    ``WaitingForChildren``, ``WaitingForMessage`` (on *topic*, *wake_at* its
    deadline), ``WaitingForSlot`` (of *queue*) or ``Hibernated``."""
    if status == RunStatus.WAITING:
        return Waiting(state, coordination_id, last_step)
    if status == RunStatus.WAITING_MESSAGE:
        return WaitingForMessage(state, coordination_id, last_step, topic=topic, deadline=wake_at)
    if status == RunStatus.SLEEPING:
        return Sleeping(state, coordination_id, last_step, wake_at=wake_at)
    if status == RunStatus.WAITING_CHILDREN:
        return WaitingForChildren(state, coordination_id, last_step)
    if status == RunStatus.WAITING_SLOT:
        return WaitingForSlot(state, coordination_id, last_step, queue=queue)
    return Hibernated(state, coordination_id, last_step, status)


@dataclasses.dataclass(frozen=True)
class Cancelled(WorkflowResult):
    """The run was cancelled (``Workflow.cancel``): it never runs another step.
    ``state`` is where it stood; ``reason`` what the canceller gave."""

    state: Any
    coordination_id: str
    reason: str = ""
    status: ClassVar[str] = RunStatus.CANCELLED


@dataclasses.dataclass(frozen=True)
class Failed(WorkflowResult):
    """Step ``last_step_name`` failed; ``last_state`` is the state it was given. Nothing
    was persisted for it: a later run executes it again."""

    last_state: Any
    coordination_id: str
    last_step_name: str
    reason: str
    status: ClassVar[str] = RunStatus.FAILED


@dataclasses.dataclass(frozen=True)
class NeedsUpgrade(WorkflowResult):
    """The run cannot continue on the code that tried: its version, or the step it
    stands after (``last_step_name``), is not defined (``reason`` says which). Nothing
    ran and nothing was lost (its state, its position and any input wait with it);
    it continues once that definition is back or an upgrade moved it (see
    ``workflows.upgrades``)."""

    state: Any
    coordination_id: str
    last_step_name: str
    reason: str
    status: ClassVar[str] = RunStatus.NEEDS_UPGRADE


@dataclasses.dataclass(frozen=True)
class Running(WorkflowResult):
    """The run is not finished and not paused: an execution provider queued its next
    step, ``max_steps`` was reached, or another runner is driving it.
    ``last_step_name`` is the last completed step (``""`` before the first);
    ``snapshot_id``, when known, the id of the snapshot the run stands at;
    ``next_step_name`` the step it continues at when its last step jumped there
    (``advance(state, to=...)``), else ``""`` (the step after ``last_step_name``)."""

    state: Any
    coordination_id: str
    last_step_name: str
    snapshot_id: str | None = dataclasses.field(default=None, compare=False, repr=False)
    next_step_name: str = dataclasses.field(default="", compare=False, repr=False)
    status: ClassVar[str] = RunStatus.RUNNING


@dataclasses.dataclass(frozen=True)
class StartedRun:
    """What ``Workflow.start`` returned. ``created`` is False when the idempotency key
    (or the coordination) already had a run: nothing was started or run again, and
    ``result`` is that run's current result (``Running`` while it is in flight)."""

    coordination_id: str
    created: bool
    result: WorkflowResult | None
