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

import json
import os
import time
from typing import Any

from django.conf import settings

from flowwarden_django.workflows import (
    Workflow,
    WorkflowDefinition,
    advance,
    done,
    hibernate,
    step,
)
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore

THREE = "fw-celery-three"
PAUSING = "fw-celery-pausing"
KILLABLE = "fw-celery-killable"
#: Longer than any test waits: the first run of ``slow`` only ends by being killed.
SLOW_SECONDS = 300.0


def executions(log: str) -> list[dict[str, Any]]:
    """The step executions recorded in *log*, in order."""
    try:
        with open(log) as lines:
            return [json.loads(line) for line in lines if line.strip()]
    except FileNotFoundError:
        return []


def _record(state: dict[str, Any], ctx: Any) -> int:
    """Append this execution to the log; how many times the step has started."""
    from celery import current_task

    task = current_task.request.id if current_task else None
    line = {"cid": ctx.coordination_id, "step": ctx.step_name, "pid": os.getpid(), "task": task}
    with open(state["log"], "a") as log:  # one short O_APPEND write per line
        log.write(json.dumps(line) + "\n")
    return sum(
        1
        for e in executions(state["log"])
        if (e["cid"], e["step"]) == (ctx.coordination_id, ctx.step_name)
    )


def _then(state: dict[str, Any], name: str) -> dict[str, Any]:
    return {**state, "trail": [*state["trail"], name]}


@step("one")
def one(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    return advance(_then(state, "one"))


@step("two")
def two(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    return advance(_then(state, "two"))


@step("three")
def three(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    return advance(_then(state, "three"))


@step("pause")
def pause(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    return hibernate(_then(state, "pause"))


@step("decide")
def decide(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    return done({**_then(state, "decide"), "decision": ctx.input})


@step("slow")
def slow(state: dict[str, Any], ctx: Any) -> Any:
    if _record(state, ctx) == 1:
        time.sleep(SLOW_SECONDS)
    return advance(_then(state, "slow"))


def define_workflows(using: str) -> dict[str, WorkflowDefinition]:
    """Register the test workflows, on database *using*; their definitions by name."""
    store = OrmSnapshotStore(using=using)
    return {
        name: Workflow.define(name, steps, store, using=using)
        for name, steps in (
            (THREE, [one, two, three]),
            (PAUSING, [one, pause, decide]),
            (KILLABLE, [one, slow, three]),
        )
    }


if getattr(settings, "FLOWWARDEN_TEST_WORKFLOW_DB", None):  # the worker
    define_workflows(settings.FLOWWARDEN_TEST_WORKFLOW_DB)
