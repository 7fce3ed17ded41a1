"""The refund workflow the approval tests share (core, API and admin).

``review`` lets amounts under 100 through and asks ``alice`` or the ``finance`` group
for larger ones (``expires_in`` and ``on_expiry`` come from the state); ``settle``
records the decision it was handed in ``seen_decisions`` (so a test can tell how
often a run resumed) and finishes with the outcome, the payload's note and the
decider.
"""

from __future__ import annotations

from typing import Any

from flowwarden_django.workflows import (
    Workflow,
    WorkflowDefinition,
    advance,
    await_approval,
    done,
    step,
)

#: The decisions ``settle`` was handed, in order (cleared by ``define_refunds``).
seen_decisions: list[Any] = []


@step
def review(state: dict[str, Any]) -> Any:
    if state["amount"] < 100:
        return advance({**state, "review": "automatic"})
    return await_approval(
        {**state, "review": "manual"},
        f"Refund {state['amount']}?",
        assignees=["alice"],
        group="finance",
        expires_in=state.get("expires_in"),
        on_expiry=state.get("on_expiry", "resume"),
    )


@step
def settle(state: dict[str, Any], ctx: Any) -> Any:
    decision = ctx.decision
    seen_decisions.append(decision)
    if decision is None:
        return done({**state, "outcome": "refunded"})
    return done(
        {
            **state,
            "outcome": "refunded" if decision.approved else decision.decision,
            "note": (decision.payload or {}).get("note"),
            "by": decision.decided_by,
        }
    )


def define_refunds(
    name: str, store: Any = "default", using: str | None = None
) -> WorkflowDefinition:
    """Register the refund workflow as *name* (with a fresh ``seen_decisions``)."""
    seen_decisions.clear()
    return Workflow.define(name, [review, settle], store, using=using)
