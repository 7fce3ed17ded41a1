"""The shop's workflows (discovered at start-up like ``streams.py``).

``order-approval``: a new order starts one run (the ``orders`` stream starts it,
keyed by the order's id, so a redelivered or replayed event starts nothing; the
async view of ``views.py`` starts it with the same key). ``review`` lets small orders
through and makes large ones wait for a person in the ``approvers`` group, with a
typed decision form (``forms.OrderDecisionForm``: the amount approved, at most the
order's total, and a reason from a list). While it waits, its approvers are reminded
every 12 hours; after 24 hours it escalates to the ``managers`` group (a claim held
then is released); after 48 hours the run resumes with an ``expired`` decision.
``fulfil`` applies the decision to the ``Order`` row and the approved amount and
reason to the run's state.

An order on invoice terms (its document has ``"terms": "invoice"``) is not done once
fulfilled: ``fulfil`` makes it wait for its payment (``wait_for(state, "paid",
timeout=PAYMENT_DUE_IN)``), holding nothing, and ``collect`` records the payment, or
marks the order overdue when none came in 14 days. The ``payments`` stream (see
``streams.py``) sends the message with ``record_payment``: in one transaction with the
order marked paid and the stream's checkpoint, so each payment resumes its order's run
exactly once, across crashes.

A withdrawn order (its status set to ``withdrawn`` in MongoDB) cancels its run
(``withdraw_order``, called by the ``orders`` stream): no step runs for it again, and
its pending approval is cancelled.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from decimal import Decimal
from typing import Any

from flowwarden_django.models import WorkflowRun
from flowwarden_django.workflows import (
    RunFinishedError,
    StepContext,
    Workflow,
    advance,
    await_approval,
    cancel_coordination,
    done,
    step,
    wait_for,
)

from .forms import OrderDecisionForm, decision_initial
from .models import Order

logger = logging.getLogger("shop.workflows")

WORKFLOW = "order-approval"
#: Orders from this amount on wait for an approver.
APPROVAL_THRESHOLD_CENTS = 100_000
APPROVERS_GROUP = "approvers"
APPROVAL_EXPIRES_IN = timedelta(hours=48)
#: How often the approvers are reminded of a large order that still waits.
REMIND_EVERY = timedelta(hours=12)
#: How long a large order waits before it goes to the managers.
ESCALATE_AFTER = timedelta(hours=24)
MANAGERS_GROUP = "managers"
#: The workflow that reminded the approvers before ``remind_every`` did (the demo
#: still removes an earlier demo's runs of it).
LEGACY_REMINDER = "approval-reminder"
#: The topic a run on invoice terms waits for, and how long it waits.
PAID = "paid"
PAYMENT_DUE_IN = timedelta(days=14)


def idempotency_key(order_id: Any) -> str:
    """One run per order: the key the stream starts the run with."""
    return f"shop.orders:{order_id}"


def initial_state(doc: dict[str, Any]) -> dict[str, Any]:
    """The run's initial state, from the order's document."""
    return {
        "order_id": doc["_id"],
        "customer": doc.get("customer", ""),
        "total_cents": doc.get("total_cents", 0),
        # "invoice": the order is paid after it is fulfilled (its run waits for that).
        "terms": doc.get("terms", "prepaid"),
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
        form=OrderDecisionForm,
        initial=decision_initial(state["total_cents"]),
        remind_every=REMIND_EVERY,
        escalate_after=ESCALATE_AFTER,
        escalate_to=MANAGERS_GROUP,
    )


def approved_cents(payload: Any) -> int | None:
    """The amount approved, in cents, from the decision form's cleaned data."""
    amount = payload.get("approved_amount") if isinstance(payload, dict) else None
    return None if amount is None else int(Decimal(str(amount)) * 100)


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
    fulfilled = {**state, "outcome": outcome, "decided_by": by, "comment": comment}
    if decision is not None and decision.approved:
        # The typed form's cleaned data: {"approved_amount": "2500.00", "reason": ...}.
        fulfilled["approved_cents"] = approved_cents(decision.payload)
        fulfilled["reason"] = (decision.payload or {}).get("reason", "")
    if outcome == "fulfilled" and state.get("terms") == "invoice":
        # Invoiced: wait, holding nothing, for the payments stream's message.
        Order.objects.filter(order_id=state["order_id"]).update(payment="due")
        return wait_for(fulfilled, PAID, timeout=PAYMENT_DUE_IN)
    return done(fulfilled)


@step
def collect(state: dict[str, Any], ctx: StepContext) -> Any:
    payment = ctx.message
    if payment is None:  # PAYMENT_DUE_IN passed without one
        Order.objects.filter(order_id=state["order_id"]).update(payment="overdue")
        return done({**state, "payment": "overdue"})
    # The payments stream marked the order paid when it sent this, in one transaction.
    return done({**state, "payment": "paid", **payment.payload})


class PaymentForUnknownOrder(LookupError):
    """A payment for an order this app has no run of (yet): the ``payments`` stream
    parks it as a dead letter, to replay once the order is there."""


def payment_key(payment_id: Any) -> str:
    """A payment's idempotency key: its document's ``_id``, the same on every delivery."""
    return f"shop.payments:{payment_id}"


def record_payment(doc: dict[str, Any]) -> bool:
    """Mark order ``doc["order_id"]`` paid and send its run the payment (``paid``);
    whether the run took it (False: it has finished, so nothing waits for a payment).

    Called by the ``payments`` stream's handler, in its transaction: the order's row,
    the message and the stream's checkpoint commit together, and the run wakes once
    they did. The idempotency key (the payment's ``_id``) is not what makes it exactly
    once there; it keeps a payment delivered again after a checkpoint reset or a
    replay from sending twice."""
    order_id, cents = doc["order_id"], doc.get("amount_cents", 0)
    run = WorkflowRun.objects.filter(idempotency_key=idempotency_key(order_id)).first()
    if run is None:
        raise PaymentForUnknownOrder(f"payment {doc['_id']}: no order {order_id} here (yet)")
    Order.objects.filter(order_id=order_id).update(payment="paid", paid_cents=cents)
    payload = {"payment_id": str(doc["_id"]), "paid_cents": cents}
    try:
        Workflow.for_coordination(run.pk).send(
            PAID, payload, idempotency_key=payment_key(doc["_id"]), sender="shop.payments"
        )
    except RunFinishedError as exc:  # completed (paid when placed) or cancelled (withdrawn)
        logger.info("payment %s for order %s: %s", doc["_id"], order_id, exc)
        return False
    return True


def cancel_runs(key: str, reason: str, *, by: str) -> bool:
    """Cancel the run started with idempotency key *key*, if there is one and it has not
    finished; whether it was cancelled."""
    run = WorkflowRun.objects.filter(idempotency_key=key).first()
    if run is None:
        return False
    return cancel_coordination(run.pk, reason, by=by).cancelled


def withdraw_order(order_id: Any, *, by: str) -> bool:
    """The customer withdrew the order: cancel its approval run (and the approval it
    waits for); whether it was cancelled."""
    return cancel_runs(idempotency_key(order_id), "the order was withdrawn", by=by)


order_approval = Workflow.define(WORKFLOW, [review, fulfil, collect])
