"""The workflows the Celery worker runs in ``tests/integrations/test_celery_workflows.py``.

Both processes define them with ``define_workflows(using)``: the test on its
``postgres`` alias, the worker (``tests.celery_workflow_settings``) on its
``default`` database, which is the same PostgreSQL test database; the worker does
it when it imports this module.

Every step execution appends one JSON line to the file named by ``state["log"]``
(coordination, step, pid, Celery task id) before doing anything else; that is how
the test counts executions and sees a step start. The ``slow`` step sleeps on its
first execution of a coordination (the test kills it there) and returns at once
on the next.
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings

from flowwarden_django.workflows import (
    Workflow,
    WorkflowDefinition,
    advance,
    await_approval,
    done,
    hibernate,
    step,
)
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from tests.step_log import record, then

THREE = "fw-celery-three"
PAUSING = "fw-celery-pausing"
KILLABLE = "fw-celery-killable"
APPROVING = "fw-celery-approving"
SLOW_SECOND = "fw-celery-slow-second"
#: Longer than any test waits: the first run of ``slow`` only ends by being killed.
SLOW_SECONDS = 300.0


def _record(state: dict[str, Any], ctx: Any) -> int:
    from celery import current_task

    return record(state, ctx, task=current_task.request.id if current_task else None)


@step("one")
def one(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    return advance(then(state, "one"))


@step("two")
def two(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    return advance(then(state, "two"))


@step("three")
def three(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    return advance(then(state, "three"))


@step("pause")
def pause(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    return hibernate(then(state, "pause"))


@step("decide")
def decide(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    return done({**then(state, "decide"), "decision": ctx.input})


@step("ask")
def ask(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    return await_approval(then(state, "ask"), "Approve the test order")


@step("settle")
def settle(state: dict[str, Any], ctx: Any) -> Any:
    """What the step after the approval saw: ``ctx.decision``'s fields."""
    _record(state, ctx)
    decision = ctx.decision
    seen = None if decision is None else [decision.decision, decision.comment, decision.decided_by]
    return done({**then(state, "settle"), "decision": seen})


@step("slow")
def slow(state: dict[str, Any], ctx: Any) -> Any:
    if _record(state, ctx) == 1:
        time.sleep(SLOW_SECONDS)
    return advance(then(state, "slow"))


@step("four")
def four(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    return advance(then(state, "four"))


@step("slow")
def slow_every_time(state: dict[str, Any], ctx: Any) -> Any:
    """Sleeps ``state["sleep"]`` seconds each time it runs."""
    _record(state, ctx)
    time.sleep(state["sleep"])
    return advance(then(state, "slow"))


def define_workflows(using: str) -> dict[str, WorkflowDefinition]:
    """Register the test workflows, on database *using*; their definitions by name."""
    store = OrmSnapshotStore(using=using)
    return {
        name: Workflow.define(name, steps, store, using=using)
        for name, steps in (
            (THREE, [one, two, three]),
            (PAUSING, [one, pause, decide]),
            (KILLABLE, [one, slow, three]),
            (APPROVING, [one, ask, settle]),
            (SLOW_SECOND, [one, slow_every_time, three, four]),
        )
    }


if getattr(settings, "FLOWWARDEN_TEST_WORKFLOW_DB", None):  # the worker
    define_workflows(settings.FLOWWARDEN_TEST_WORKFLOW_DB)
