"""The shop's order-approval workflow (discovered at start-up like ``streams.py``).

A new order starts one run (the ``orders`` stream starts it, keyed by the order's
id, so a redelivered or replayed event starts nothing; the async view of ``views.py``
starts it with the same key). ``review`` lets small orders through and makes large
ones wait for a person in the ``approvers`` group (48 hours, then the run resumes
with an ``expired`` decision). ``fulfil`` applies the decision to the ``Order`` row.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from flowwarden_django.workflows import StepContext, Workflow, advance, await_approval, done, step

from .models import Order

WORKFLOW = "order-approval"
#: Orders from this amount on wait for an approver.
APPROVAL_THRESHOLD_CENTS = 100_000
APPROVERS_GROUP = "approvers"
APPROVAL_EXPIRES_IN = timedelta(hours=48)


def idempotency_key(order_id: Any) -> str:
    """One run per order: the key the stream starts the run with."""
    return f"shop.orders:{order_id}"


def initial_state(doc: dict[str, Any]) -> dict[str, Any]:
    """The run's initial state, from the order's document."""
    return {
        "order_id": doc["_id"],
        "customer": doc.get("customer", ""),
        "total_cents": doc.get("total_cents", 0),
    }


def start_for_order(doc: dict[str, Any]) -> bool:
    """Start the order's run unless it has one; whether this call started it."""
    state = initial_state(doc)
    started = Workflow.start(WORKFLOW, state, idempotency_key=idempotency_key(doc["_id"]))
    return started.created


def dollars(cents: int) -> str:
    return f"${cents / 100:,.2f}"


@step
def review(state: dict[str, Any]) -> Any:
    if state["total_cents"] < APPROVAL_THRESHOLD_CENTS:
        Order.objects.filter(order_id=state["order_id"]).update(approval="not needed")
        return advance({**state, "review": "automatic"})
    Order.objects.filter(order_id=state["order_id"]).update(approval="waiting")
    return await_approval(
        {**state, "review": "manual"},
        f"Approve order {state['order_id']} of {state['customer'] or 'a customer'} "
        f"for {dollars(state['total_cents'])}?",
        group=APPROVERS_GROUP,
        expires_in=APPROVAL_EXPIRES_IN,
    )


@step
def fulfil(state: dict[str, Any], ctx: StepContext) -> Any:
    decision = ctx.decision
    if decision is None:  # no approval was needed
        outcome, by, comment = "fulfilled", None, ""
    else:
        outcome = "fulfilled" if decision.approved else decision.decision
        by, comment = decision.decided_by, decision.comment
    approval = "not needed" if decision is None else decision.decision
    Order.objects.filter(order_id=state["order_id"]).update(approval=approval)
    return done({**state, "outcome": outcome, "decided_by": by, "comment": comment})


order_approval = Workflow.define(WORKFLOW, [review, fulfil])
