"""A workflow whose one approval reminds and escalates (``await_approval(remind_every=...,
escalate_after=..., escalate_to=...)``), for the reminder and notification tests.

``ask`` asks ``alice`` and the ``finance`` group, reminding every ``remind_every`` s and
escalating after ``escalate_after`` s to ``escalate_to`` (all from the state);
``finish`` ends the run with the decision.
"""

from __future__ import annotations

from typing import Any

from flowwarden_django.workflows import Workflow, WorkflowDefinition, await_approval, done, step

#: Its name in the Temporal and Celery workers.
REMINDING = "fw-reminding"


@step
def ask(state: dict[str, Any]) -> Any:
    escalate_to = state.get("escalate_to")
    return await_approval(
        state,
        f"Pay invoice {state['invoice']}?",
        assignees=["alice"],
        group="finance",
        remind_every=state.get("remind_every"),
        escalate_after=state.get("escalate_after") if escalate_to is not None else None,
        escalate_to=escalate_to,
    )


@step
def finish(state: dict[str, Any], ctx: Any) -> Any:
    return done({**state, "decision": ctx.decision.decision if ctx.decision else None})


def define_reminders(
    name: str, store: Any = "default", using: str | None = None
) -> WorkflowDefinition:
    """Register the reminder workflow as *name*."""
    return Workflow.define(name, [ask, finish], store, using=using)
