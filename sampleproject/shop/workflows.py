"""The shop's workflows (discovered at start-up like ``streams.py``).

``order-approval``: a new order starts one run (the ``orders`` stream starts it,
keyed by the order's id, so a redelivered or replayed event starts nothing; the
async view of ``views.py`` starts it with the same key). ``review`` lets small orders
through and makes large ones wait for a person in the ``approvers`` group (48 hours,
then the run resumes with an ``expired`` decision), and starts the order's
``approval-reminder``. ``fulfil`` applies the decision to the ``Order`` row and
cancels the reminder, which is no longer needed.

``approval-reminder``: sleeps 24 hours (a durable sleep: no thread, no task), then
reminds the approvers if the order still waits.

A withdrawn order (its status set to ``withdrawn`` in MongoDB) cancels both runs
(``withdraw_order``, called by the ``orders`` stream): no step runs for it again, and
its pending approval is cancelled.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from flowwarden_django.models import WorkflowRun
from flowwarden_django.workflows import (
    StepContext,
    Workflow,
    advance,
    await_approval,
    cancel_coordination,
    done,
    sleep,
    step,
)

from .models import Order

logger = logging.getLogger("shop.workflows")

WORKFLOW = "order-approval"
#: Orders from this amount on wait for an approver.
APPROVAL_THRESHOLD_CENTS = 100_000
APPROVERS_GROUP = "approvers"
APPROVAL_EXPIRES_IN = timedelta(hours=48)
REMINDER = "approval-reminder"
#: How long a large order waits before the approvers are reminded of it.
REMIND_AFTER = timedelta(hours=24)


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


def reminder_key(order_id: Any) -> str:
    """One reminder per order."""
    return f"shop.reminders:{order_id}"


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
    # Keyed by the order: a retried step starts no second reminder.
    Workflow.start(
        REMINDER, {"order_id": state["order_id"]}, idempotency_key=reminder_key(state["order_id"])
    )
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
    if decision is not None:
        cancel_runs(reminder_key(state["order_id"]), "the order was decided", by="order-approval")
    return done({**state, "outcome": outcome, "decided_by": by, "comment": comment})


@step
def wait_a_day(state: dict[str, Any]) -> Any:
    return sleep(state, REMIND_AFTER)


@step
def remind(state: dict[str, Any]) -> Any:
    waiting = Order.objects.filter(order_id=state["order_id"], approval="waiting").exists()
    if waiting:  # a real shop would mail the approvers here
        logger.info("order %s still waits for an approver: reminding them", state["order_id"])
    return done({**state, "reminded": waiting})


def cancel_runs(key: str, reason: str, *, by: str) -> bool:
    """Cancel the run started with idempotency key *key*, if there is one and it has not
    finished; whether it was cancelled."""
    run = WorkflowRun.objects.filter(idempotency_key=key).first()
    if run is None:
        return False
    return cancel_coordination(run.pk, reason, by=by).cancelled


def withdraw_order(order_id: Any, *, by: str) -> bool:
    """The customer withdrew the order: cancel its approval run (and the approval it
    waits for) and its reminder; whether the approval run was cancelled."""
    cancelled = cancel_runs(idempotency_key(order_id), "the order was withdrawn", by=by)
    cancel_runs(reminder_key(order_id), "the order was withdrawn", by=by)
    return cancelled


order_approval = Workflow.define(WORKFLOW, [review, fulfil])
approval_reminder = Workflow.define(REMINDER, [wait_a_day, remind])
