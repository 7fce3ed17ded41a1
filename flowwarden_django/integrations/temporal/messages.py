"""What the Temporal workflow and its activities send each other: plain dataclasses,
safe to import inside the workflow sandbox (no Django, no project code).

No ``from __future__ import annotations`` here: the SDK converts every message with
``typing.get_type_hints``, which evaluates string annotations again each time (about
130 us for a ``RunReport``, 50 us with real ones), twice a step."""

import dataclasses
from typing import Any

#: Activity names (the worker registers the implementations in ``activities``).
STEP_ACTIVITY = "flowwarden.step"
EXPIRE_ACTIVITY = "flowwarden.expire_approval"
STATUS_ACTIVITY = "flowwarden.status"
#: The Temporal workflow type and its one signal.
WORKFLOW_TYPE = "flowwarden.Run"
WAKE_SIGNAL = "wake"
#: What a Temporal Schedule starts at each tick, and the activity that starts the run.
SCHEDULED_START_TYPE = "flowwarden.ScheduledStart"
SCHEDULED_START_ACTIVITY = "flowwarden.start_scheduled"
#: The error type of a step activity on a worker that does not define the run's
#: version: the workflow offers the step again, as a regular activity, to any worker.
VERSION_HANDBACK = "VersionNotDefined"
#: The error type of a step activity whose input (a ``wake`` signal's) the engine
#: refused (``common.user_input``): not retried; the workflow drops the wake.
INPUT_REFUSED = "InputRefused"
#: Attempts of a step's activity beyond its own ``max_retries + 1``: a killed worker,
#: a run held by another runner, a database away. Then the activity fails, and with it
#: the run's Temporal workflow; the recovery sweep starts another for a run still
#: ``running``.
EXTRA_ATTEMPTS = 20
#: Seconds before a handed-back step is offered again (the n-th wait, then the last).
#: Which worker takes an activity is Temporal's choice, so a step may be offered a
#: few times before a worker of its version takes it; short waits keep that quick (a
#: version no worker defines costs its run about 90 history events a minute).
HANDBACK_DELAYS = (0.1, 0.25, 0.5, 1.0, 2.0)


@dataclasses.dataclass(frozen=True)
class StepPolicy:
    """How Temporal schedules one step's activity: the step's ``max_retries``,
    ``retry_delay`` and ``timeout`` (``None``: the ``STEP_TIMEOUT`` setting), and
    whether it is a local activity (a short step: see ``policies``)."""

    max_retries: int = 0
    retry_delay: float = 0.0
    timeout: float | None = None
    local: bool = False


@dataclasses.dataclass(frozen=True)
class Wake:
    """The signal that makes a run's Temporal workflow act.

    ``origin="run"``: ``run()``/``resume(input)``/a decision/a message sent to the
    run continues it (the next step runs even if the run is paused; a message's wake
    carries no input: the step reads the message from its row); ``"recover"``: the worker's recovery
    sweep found the run stalled (continued only if still ``running``); ``"dispatch"``:
    a queue handed the run, which waited for a slot, one (continued only if
    ``running``, as ``"recover"``); ``"refresh"``:
    the run changed outside (a fork), so the workflow re-reads what it waits for.
    ``policy``: how to schedule the step the wake continues with, when the sender
    knows it (``None``: as a regular activity with the default options).
    """

    origin: str = "run"
    input: Any = None
    policy: StepPolicy | None = None
    #: The version of the run's workflow (``None``: the activity reads the run's).
    version: int | None = None


@dataclasses.dataclass(frozen=True)
class RunStart:
    """The Temporal workflow's argument: which run it drives."""

    coordination_id: str
    workflow: str
    using: str | None = None
    #: Seconds a step without its own ``timeout`` may take (start-to-close).
    step_timeout: float = 600.0
    #: Seconds without a heartbeat after which a step's worker is taken for dead.
    heartbeat_timeout: float = 10.0


@dataclasses.dataclass(frozen=True)
class ScheduledStart:
    """A Temporal Schedule's action: start *workflow* (its state a template) for the
    current tick of *schedule* (every *every* seconds)."""

    schedule: str
    workflow: str
    state: Any = None
    every: float = 60.0
    #: The action's scheduled time (ISO 8601), set by the workflow from Temporal's
    #: ``TemporalScheduledStartTime``.
    scheduled_at: str | None = None


@dataclasses.dataclass(frozen=True)
class StepRequest:
    """One step activity: continue *coordination_id* by one step."""

    coordination_id: str
    workflow: str
    origin: str
    input: Any = None
    using: str | None = None
    #: The version of the run's workflow (``None``: the activity reads the run's); a
    #: worker that does not define it hands the step back (``VERSION_HANDBACK``).
    version: int | None = None
    #: Where the previous step left the run held (``workflows.handoff``, as
    #: ``Handoff.as_dict`` has it): the step takes the run from there.
    handoff: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class RunReport:
    """Where a run stands after an activity: its status, the policy of its next step,
    the next due time of the approval it waits for (its expiry, next reminder or
    escalation: ``expires_at``) and the wake time of a sleeping run (ISO 8601, UTC)."""

    status: str
    last_step: str = ""
    next_policy: StepPolicy | None = None
    expires_at: str | None = None
    detail: str = ""
    #: The version the run is on (an upgrade may have moved it).
    version: int | None = None
    #: When a sleeping run wakes, or a wait for a message times out (ISO 8601, UTC).
    wake_at: str | None = None
    #: The run handed on to its next step by this one (``workflows.handoff``).
    handoff: dict[str, Any] | None = None
