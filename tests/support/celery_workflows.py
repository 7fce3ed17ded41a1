"""The workflows the Celery worker runs in ``tests/integrations/test_celery_workflows.py``.

Both processes define them with ``define_workflows(using)``: the test on its
``postgres`` alias, the worker (``tests.support.celery_workflow_settings``) on its
``default`` database, which is the same PostgreSQL test database; the worker does
it when it imports this module.

Every step execution appends one JSON line to the file named by ``state["log"]``
(coordination, step, pid, Celery task id; for the versioned workflows also the
version the step belongs to and the worker's ``FLOWWARDEN_TEST_WORKER_TAG``) before
doing anything else; that is how
the test counts executions and sees a step start. The ``slow`` step sleeps on its
first execution of a coordination (the test kills it there) and returns at once
on the next.
"""

from __future__ import annotations

import os
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
    sleep,
    spawn,
    step,
    wait_for,
)
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from tests.support import step_log
from tests.support.step_log import record, then

THREE = "fw-celery-three"
PAUSING = "fw-celery-pausing"
KILLABLE = "fw-celery-killable"
APPROVING = "fw-celery-approving"
SLOW_SECOND = "fw-celery-slow-second"
#: Two versions, each run by the worker that defines it (a rolling deploy).
ROLLING = "fw-celery-rolling"
#: Version 1 pauses after ``a``; version 2 has no ``a`` (the upgrade story).
UPGRADED = "fw-celery-upgraded"
#: ``one``, a sleep of ``state["nap"]`` seconds, ``three``.
SLEEPING = "fw-celery-sleeping"
#: Spawns five ``FAN_CHILD`` runs and sums their values; the child whose ``n`` is
#: ``state["stall"]`` sleeps on its first execution (the test kills it there).
FAN_OUT = "fw-celery-fan-out"
FAN_CHILD = "fw-celery-fan-child"
#: ``one``, a wait for a message on "go" (``state["timeout"]`` seconds, or none), ``heard``.
LISTENING = "fw-celery-listening"
#: ``bump`` then ``check``, which jumps back to ``bump`` twice, then hibernates back
#: to it, then ends the run.
LOOPING = "fw-celery-looping"
#: ``listen`` (a wait for a message on "item") and ``handle``, which appends the
#: message's payload to ``state["handled"]`` and jumps back to ``listen`` until
#: ``LOOP_TIMES`` were handled (``tests/integrations/test_celery_messages.py``). With
#: ``state["wait_in_handle"]``, ``handle`` waits itself and continues at itself
#: (``wait_for(..., to="handle")``).
MESSAGE_LOOP = "fw-celery-message-loop"
LOOP_TIMES = 5
#: ``one``, ``slow``, ``three``, ``four`` (``tests/faults/test_celery_partitions.py``):
#: ``slow``'s first execution waits until the file ``state["release"]`` exists, any
#: later one sleeps ``state["sleep"]`` seconds. ``slow`` is transactional and writes one
#: ``Effect`` row per execution (``step_log.write_effect``).
PARTITIONED = "fw-celery-partitioned"
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


@step("nap")
def nap(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    return sleep(then(state, "nap"), state["nap"])


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


@step("listen")
def listen(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    ctx.set_event("listening", {"step": "listen"})
    return wait_for(then(state, "listen"), "go", timeout=state.get("timeout"))


@step("heard")
def heard(state: dict[str, Any], ctx: Any) -> Any:
    """What the step after the wait got: ``ctx.message``'s payload, or ``None``."""
    _record(state, ctx)
    message = ctx.message
    ctx.set_event("heard", None if message is None else {"id": message.id, **message.payload})
    return done({**then(state, "heard"), "heard": None if message is None else message.payload})


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


@step("slow", transactional=True)
def slow_until_released(state: dict[str, Any], ctx: Any) -> Any:
    """Transactional: its ``Effect`` row commits with its snapshot (``write_effect``)."""
    step_log.write_effect(state, ctx)
    if _record(state, ctx) == 1:
        step_log.wait_for_file(state["release"])
    else:
        time.sleep(state["sleep"])
    return advance(then(state, "slow"))


@step("fan_out")
def fan_out(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    children = [
        (FAN_CHILD, {"n": n, "log": state["log"], "stall": state.get("stall")}) for n in range(1, 6)
    ]
    return spawn(state, children, then="results")


@step("collect")
def collect(state: dict[str, Any], ctx: Any) -> Any:
    from celery import current_task

    record(
        state,
        ctx,
        task=current_task.request.id if current_task else None,
        children=len(ctx.children),
    )
    return done({**state, "total": sum(r["state"]["value"] for r in state["results"])})


@step("enrich")
def enrich(state: dict[str, Any], ctx: Any) -> Any:
    from celery import current_task

    task = current_task.request.id if current_task else None
    if record(state, ctx, task=task, n=state["n"]) == 1 and state["n"] == state.get("stall"):
        time.sleep(SLOW_SECONDS)
    return advance({**state, "value": state["n"] * 10})


@step("bump")
def bump(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    return advance({**then(state, "bump"), "n": state.get("n", 0) + 1})


@step("check", goes_to=["bump"])
def check(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    state = then(state, "check")
    if state["n"] < 3:
        return advance(state, to="bump")
    if state["n"] == 3:
        return hibernate(state, to="bump")  # resumed: bump again
    return done(state)


@step("listen")
def loop_listen(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    return wait_for(then(state, "listen"), "item")


@step("handle", goes_to=["listen", "handle"])
def loop_handle(state: dict[str, Any], ctx: Any) -> Any:
    """Logs the message it got (``message``: its id), appends its payload to
    ``handled``; jumps back until ``LOOP_TIMES`` were handled."""
    from celery import current_task

    message = ctx.message
    task = current_task.request.id if current_task else None
    record(state, ctx, task=task, message=None if message is None else message.id)
    state = then(state, "handle")
    state = {**state, "handled": [*state.get("handled", []), message and message.payload]}
    if len(state["handled"]) >= LOOP_TIMES:
        return done(state)
    if state.get("wait_in_handle"):
        return wait_for(state, "item", to="handle")
    return advance(state, to="listen")


def versioned(name: str, version: int, outcome: Any = advance) -> Any:
    """A step of version *version* that logs its version and the worker's tag."""

    @step(name)
    def run(state: dict[str, Any], ctx: Any) -> Any:
        _record_tagged(state, ctx, version)
        return outcome(then(state, name))

    return run


def _record_tagged(state: dict[str, Any], ctx: Any, version: int) -> None:
    from celery import current_task

    task = current_task.request.id if current_task else None
    tag = os.environ.get("FLOWWARDEN_TEST_WORKER_TAG", "")
    record(state, ctx, task=task, version=version, tag=tag)


#: The steps of each version of the versioned workflows.
VERSIONED = {
    (ROLLING, 1): lambda: [versioned("r1", 1), versioned("r2", 1)],
    (ROLLING, 2): lambda: [versioned("r1", 2), versioned("r2", 2), versioned("r3", 2)],
    (UPGRADED, 1): lambda: [
        versioned("a", 1, hibernate),
        versioned("b", 1),
        versioned("c", 1),
    ],
    (UPGRADED, 2): lambda: [versioned("b2", 2), versioned("c", 2)],
}


def define_versions(using: str, versions: tuple[int, ...]) -> dict[tuple[str, int], Any]:
    """Register *versions* of the versioned workflows, on database *using*."""
    return step_log.define_versions(VERSIONED, using, versions)


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
            (SLEEPING, [one, nap, three]),
            (FAN_CHILD, [enrich]),
            (FAN_OUT, [fan_out, collect]),
            (LISTENING, [one, listen, heard]),
            (LOOPING, [bump, check]),
            (MESSAGE_LOOP, [loop_listen, loop_handle]),
            (PARTITIONED, [one, slow_until_released, three, four]),
        )
    }


if getattr(settings, "FLOWWARDEN_TEST_WORKFLOW_DB", None):  # the worker
    define_workflows(settings.FLOWWARDEN_TEST_WORKFLOW_DB)
    # The versions this worker's "deploy" defines (a rolling deploy runs two).
    _versions = os.environ.get("FLOWWARDEN_TEST_WORKFLOW_VERSIONS", "1,2")
    define_versions(
        settings.FLOWWARDEN_TEST_WORKFLOW_DB, tuple(int(v) for v in _versions.split(","))
    )
