"""The workflows the Temporal worker runs in ``tests/integrations/test_temporal.py``.

Both processes define them with ``define_workflows(using)``: the test on its
``postgres`` alias, the worker on its ``default`` database (the same PostgreSQL test
database). Every step execution appends one JSON line (coordination, step, pid,
attempt) to the file named by ``state["log"]`` before anything else: that is how the
test counts executions and sees a step start. ``slow`` sleeps on its first execution
of a coordination (the test kills the worker there) and returns at once after.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

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

TWENTY = "fw-temporal-twenty"
PAUSING = "fw-temporal-pausing"
APPROVING = "fw-temporal-approving"
EXPIRING = "fw-temporal-expiring"
KILLABLE = "fw-temporal-killable"
FLAKY = "fw-temporal-flaky"
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
    line = {
        "cid": ctx.coordination_id,
        "step": ctx.step_name,
        "pid": os.getpid(),
        "attempt": ctx.attempt,
        "at": time.time(),
    }
    with open(state["log"], "a") as log:  # one short O_APPEND write per line
        log.write(json.dumps(line) + "\n")
    return sum(
        1
        for e in executions(state["log"])
        if (e["cid"], e["step"]) == (ctx.coordination_id, ctx.step_name)
    )


def _then(state: dict[str, Any], name: str) -> dict[str, Any]:
    return {**state, "trail": [*state.get("trail", []), name]}


def _plain(name: str) -> Any:
    @step(name)
    def body(state: dict[str, Any], ctx: Any) -> Any:
        _record(state, ctx)
        return advance(_then(state, name))

    return body


@step("pause")
def pause(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    return hibernate(_then(state, "pause"))


@step("ask")
def ask(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    return await_approval(
        _then(state, "ask"),
        "Approve the test order",
        expires_in=state.get("expires_in"),
    )


@step("decide")
def decide(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    decision = ctx.decision.decision if ctx.decision is not None else ctx.input
    return done({**_then(state, "decide"), "decision": decision})


@step("slow")
def slow(state: dict[str, Any], ctx: Any) -> Any:
    if _record(state, ctx) == 1:
        time.sleep(SLOW_SECONDS)
    return advance(_then(state, "slow"))


@step("flaky", max_retries=2, retry_delay=0.2)
def flaky(state: dict[str, Any], ctx: Any) -> Any:
    if _record(state, ctx) < 3:
        raise RuntimeError("not yet")
    return advance(_then(state, "flaky"))


def define_workflows(using: str) -> dict[str, WorkflowDefinition]:
    """Register the test workflows, on database *using*; their definitions by name."""
    store = OrmSnapshotStore(using=using)
    twenty = [_plain(f"s{index:02d}") for index in range(1, 21)]
    return {
        name: Workflow.define(name, steps, store, using=using)
        for name, steps in (
            (TWENTY, twenty),
            (PAUSING, [_plain("one"), pause, decide]),
            (APPROVING, [_plain("one"), ask, decide]),
            (EXPIRING, [_plain("one"), ask, decide]),
            (KILLABLE, [_plain("one"), slow, _plain("three")]),
            (FLAKY, [_plain("one"), flaky, _plain("three")]),
        )
    }
