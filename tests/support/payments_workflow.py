"""The payments workflow the message tests of the API, the admin and the command share.

``await-payment`` publishes the event ``stage`` and waits for a message on
``payment``; ``ship`` publishes what it was paid and finishes with the payload.
"""

from __future__ import annotations

from typing import Any

from flowwarden_django.workflows import (
    StepContext,
    Workflow,
    WorkflowDefinition,
    done,
    step,
    wait_for,
)

TOPIC = "payment"


@step("await-payment")
def await_payment(state: dict[str, Any], ctx: StepContext) -> Any:
    ctx.set_event("stage", {"waiting_for": TOPIC})
    return wait_for(state, TOPIC)


@step("ship")
def ship(state: dict[str, Any], ctx: StepContext) -> Any:
    assert ctx.message is not None
    ctx.set_event("stage", {"paid": ctx.message.payload.get("amount")})
    return done({**state, "paid": ctx.message.payload})


def define_payments(
    name: str, store: Any = "default", using: str | None = None
) -> WorkflowDefinition:
    """Register the payments workflow as *name*."""
    return Workflow.define(name, [await_payment, ship], store, using=using)
