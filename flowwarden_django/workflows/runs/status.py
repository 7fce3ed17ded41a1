"""The statuses of a workflow run (``WorkflowRun.status``) and the groups the engine
and the operations test them by."""

from __future__ import annotations


class RunStatus:
    """The values of ``WorkflowRun.status`` (``WorkflowRun.Status``), importable before
    the app registry is ready."""

    RUNNING = "running"
    HIBERNATED = "hibernated"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    #: Its version, or the step it stands after, is not defined by the code that
    #: tried to continue it: it waits for that definition or an upgrade.
    NEEDS_UPGRADE = "needs_upgrade"
    #: A step returned ``sleep(...)``: it continues by itself at ``wake_at`` (or
    #: earlier, when run or resumed).
    SLEEPING = "sleeping"
    #: Stopped for good by ``Workflow.cancel`` (or its endpoint, action or command).
    CANCELLED = "cancelled"
    #: A step returned ``spawn(...)``: it continues once every child run finished.
    WAITING_CHILDREN = "waiting_children"
    #: A step returned ``wait_for(...)``: it continues once a message of its topic
    #: (``waiting_topic``) is sent, or at its deadline (``wake_at``).
    WAITING_MESSAGE = "waiting_message"
    #: Its next step waits for a slot of its queue (``FLOWWARDEN["WORKFLOW_QUEUES"]``):
    #: it continues, in priority then arrival order, once one is free.
    WAITING_SLOT = "waiting_slot"

    #: A paused run: it holds no runner and continues when run or resumed.
    PAUSED = (HIBERNATED, WAITING, SLEEPING, WAITING_CHILDREN, WAITING_MESSAGE, WAITING_SLOT)
    #: A run that never continues again (a failed one does, when run again).
    FINAL = (COMPLETED, CANCELLED)
    #: What an upgrade may move to another version.
    #: (Not a run waiting for its children: an upgrade would lose what it waits for.)
    UPGRADABLE = (HIBERNATED, WAITING, SLEEPING, FAILED, NEEDS_UPGRADE, WAITING_MESSAGE)
