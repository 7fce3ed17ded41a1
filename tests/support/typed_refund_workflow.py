"""A refund workflow whose approval is typed by ``RefundDecisionForm``: ``review``
asks ``alice`` or the ``finance`` group, with the order's total as the form's
initial data; ``settle`` records the payload it was handed in ``seen_payloads``."""

from __future__ import annotations

from typing import Any

from flowwarden_django.workflows import (
    Workflow,
    WorkflowDefinition,
    await_approval,
    done,
    step,
)
from tests.testapp.forms import RefundDecisionForm

#: The decision payloads ``settle`` was handed, in order (cleared by ``define``).
seen_payloads: list[Any] = []


@step
def review(state: dict[str, Any]) -> Any:
    return await_approval(
        state,
        f"Refund order {state['order']}?",
        assignees=["alice"],
        group="finance",
        form=state.get("form", RefundDecisionForm),
        initial={"order_total": state["total"], "amount": state["total"]},
    )


@step
def settle(state: dict[str, Any], ctx: Any) -> Any:
    seen_payloads.append(ctx.decision.payload)
    return done({**state, "outcome": ctx.decision.decision, "payload": ctx.decision.payload})


def define_typed_refunds(name: str = "typed_refund", store: Any = "default") -> WorkflowDefinition:
    """Register the typed refund workflow as *name* (with a fresh ``seen_payloads``)."""
    seen_payloads.clear()
    return Workflow.define(name, [review, settle], store)
