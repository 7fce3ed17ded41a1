"""The workflow the timeline and diagram tests share: a step that fails once then
succeeds, an approval, a sleep, two child runs, a last step that loops back.

``drive_orders`` takes one run through all of it: the flaky step's second attempt
succeeds, the approval is approved, the sleep is woken early, and the children
complete in-process, which continues the parent to its end.
"""

from __future__ import annotations

import itertools
from typing import Any

from django.contrib.auth.models import User

from flowwarden_django.models import Approval, WorkflowRun
from flowwarden_django.workflows import (
    Workflow,
    WorkflowDefinition,
    advance,
    approve,
    await_approval,
    done,
    sleep,
    spawn,
    step,
    workflow_registry,
)

ORDERS = "tl-orders"
CHILD = "tl-parcel"
_failures = itertools.count()


class FlakyError(RuntimeError):
    """What the flaky step raises on its first attempt of a run."""


@step("reserve", max_retries=1, retry_delay=0)
def reserve(state: dict[str, Any]) -> Any:
    if not state.get("failed_once") and next(_failures) % 2 == 0:
        raise FlakyError("the stock service timed out")
    return advance({**state, "reserved": True})


@step("review", kind="approval")
def review(state: dict[str, Any]) -> Any:
    return await_approval(state, "Ship this order?")


@step("cool-off", kind="sleep")
def cool_off(state: dict[str, Any]) -> Any:
    return sleep(state, for_=3600)


@step("pack", kind="spawn")
def pack(state: dict[str, Any]) -> Any:
    return spawn(state, [(CHILD, {"parcel": 1}), (CHILD, {"parcel": 2})])


@step("ship", goes_to=["reserve"])
def ship(state: dict[str, Any]) -> Any:
    return done({**state, "shipped": True})


@step("parcel")
def parcel(state: dict[str, Any]) -> Any:
    return done({**state, "packed": True})


def define_orders() -> WorkflowDefinition:
    """Register the child workflow and the orders workflow (unregister with
    ``forget_orders``)."""
    Workflow.define(CHILD, [parcel])
    return Workflow.define(ORDERS, [reserve, review, cool_off, pack, ship])


def forget_orders() -> None:
    for name in (ORDERS, CHILD):
        if name in workflow_registry:
            workflow_registry.unregister(name)


def drive_orders(cid: str, user: User) -> WorkflowRun:
    """Start run *cid* and take it to its end; returns its record."""
    global _failures
    _failures = itertools.count()  # its first attempt of reserve fails
    definition = workflow_registry.get(ORDERS)
    definition.start({"order": 7}, coordination_id=cid)
    assert WorkflowRun.objects.get(pk=cid).status == WorkflowRun.Status.WAITING
    approve(Approval.objects.get(coordination_id=cid).pk, user)
    assert WorkflowRun.objects.get(pk=cid).status == WorkflowRun.Status.SLEEPING
    definition.workflow(cid).run()  # woken early
    return WorkflowRun.objects.get(pk=cid)
