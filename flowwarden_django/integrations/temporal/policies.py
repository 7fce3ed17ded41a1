"""How each step's activity is scheduled: its retries, their delay, its timeout, and
whether it runs as a *local* activity.

A local activity runs inside the workflow task of the worker that drives the run: no
activity task round trip through the server, so a short step costs a few
milliseconds instead of one workflow task and one activity task (about 100 ms on a
dev server). A step is local when it is marked ``short=True``, or when it is not
marked (``short=None``) and its own ``timeout`` is at most
``TEMPORAL["LOCAL_ACTIVITY_TIMEOUT"]`` (5 s by default). ``short=False``, and every
step without a timeout, stays a regular activity: the kind that heartbeats, so a
long step's dead worker is noticed within ``HEARTBEAT_TIMEOUT``.
"""

from __future__ import annotations

from ...workflows.definition.steps import WorkflowStep
from .messages import StepPolicy


def is_local(step: WorkflowStep, local_activity_timeout: float) -> bool:
    """Whether *step* runs as a local activity (see the module docstring)."""
    if step.short is not None:
        return step.short
    return step.timeout is not None and step.timeout <= local_activity_timeout


def policy_of(step: WorkflowStep | None, local_activity_timeout: float) -> StepPolicy | None:
    """The activity options of *step* (``None`` for no step)."""
    if step is None:
        return None
    return StepPolicy(
        step.max_retries,
        float(step.retry_delay or 0),
        step.timeout,
        local=is_local(step, local_activity_timeout),
    )
