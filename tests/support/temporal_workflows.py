"""The workflows the Temporal worker runs in ``tests/integrations/test_temporal.py``.

Both processes define them with ``define_workflows(using)``: the test on its
``postgres`` alias, the worker on its ``default`` database (the same PostgreSQL test
database). Every step execution appends one JSON line (coordination, step, pid,
attempt) to the file named by ``state["log"]`` before anything else: that is how the
test counts executions and sees a step start. ``slow`` sleeps on its first execution
of a coordination (the test kills the worker there) and returns at once after.
"""

from __future__ import annotations

import logging
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
    sleep,
    spawn,
    step,
    wait_for,
)
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from tests.support import step_log
from tests.support.step_log import record, then

TWENTY = "fw-temporal-twenty"
#: One step (what the scheduled-start test starts).
ONE = "fw-temporal-one"
PAUSING = "fw-temporal-pausing"
APPROVING = "fw-temporal-approving"
EXPIRING = "fw-temporal-expiring"
KILLABLE = "fw-temporal-killable"
FLAKY = "fw-temporal-flaky"
#: Short steps (local activities): marked ``short=True``, or with a short ``timeout``.
SHORT = "fw-temporal-short"
KILLABLE_SHORT = "fw-temporal-killable-short"
#: Two versions, each run by the worker that defines it (a rolling deploy); short
#: steps in version 1 (local activities), regular ones in version 2.
ROLLING = "fw-temporal-rolling"
#: Version 1 pauses after ``a``; version 2 has no ``a`` (the upgrade story).
UPGRADED = "fw-temporal-upgraded"
#: ``one``, a sleep of ``state["nap"]`` seconds, ``three``.
SLEEPING = "fw-temporal-sleeping"
#: ``one``, a step sleeping ``state["sleep"]`` seconds every time, ``three``.
LONG_STEP = "fw-temporal-long-step"
#: Spawns five ``FAN_CHILD`` runs and sums their values; the child whose ``n`` is
#: ``state["stall"]`` sleeps on its first execution (the test kills the worker there).
FAN_OUT = "fw-temporal-fan-out"
FAN_CHILD = "fw-temporal-fan-child"
#: ``bump`` (short: a local activity) and ``check`` (a regular one) in a loop:
#: ``check`` jumps back to ``bump`` twice, then hibernates back to it, then ends.
LOOPING = "fw-temporal-looping"
#: ``one``, a wait for a message on "go" (``state["timeout"]`` seconds, or none),
#: ``heard``; and the same with three waits in a row (``tests/integrations/
#: test_temporal_messages.py``). Each step after a wait appends what it got to
#: ``state["heard"]``; each wait publishes the event "listening", ``heard`` the event
#: "heard".
LISTENING = "fw-temporal-listening"
LISTENING_THRICE = "fw-temporal-listening-thrice"
#: ``listen`` (a wait for a message on "item") and ``handle``, which appends the
#: message's payload to ``state["handled"]`` and jumps back to ``listen`` until
#: ``LOOP_TIMES`` were handled (``tests/integrations/test_temporal_messages.py``). With
#: ``state["wait_in_handle"]``, ``handle`` waits itself and continues at itself
#: (``wait_for(..., to="handle")``).
MESSAGE_LOOP = "fw-temporal-message-loop"
LOOP_TIMES = 5
#: ``one``, ``slow``, ``three``, ``four`` (``tests/faults/test_temporal_partitions.py``):
#: ``slow``'s first execution waits until the file ``state["release"]`` exists, any
#: later one sleeps ``state["sleep"]`` seconds.
PARTITIONED = "fw-temporal-partitioned"
#: Longer than any test waits: the first run of ``slow`` only ends by being killed.
SLOW_SECONDS = 300.0


def _record(state: dict[str, Any], ctx: Any) -> int:
    return record(state, ctx, attempt=ctx.attempt, at=time.time())


def _plain(name: str, **options: Any) -> Any:
    @step(name, **options)
    def body(state: dict[str, Any], ctx: Any) -> Any:
        _record(state, ctx)
        return advance(then(state, name))

    return body


@step("pause")
def pause(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    return hibernate(then(state, "pause"))


@step("ask")
def ask(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    return await_approval(
        then(state, "ask"),
        "Approve the test order",
        expires_in=state.get("expires_in"),
    )


@step("decide")
def decide(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    decision = ctx.decision.decision if ctx.decision is not None else ctx.input
    comment = ctx.decision.comment if ctx.decision is not None else None
    return done({**then(state, "decide"), "decision": decision, "comment": comment})


@step("slow")
def slow(state: dict[str, Any], ctx: Any) -> Any:
    if _record(state, ctx) == 1:
        time.sleep(SLOW_SECONDS)
    return advance(then(state, "slow"))


@step("slow", transactional=True)
def slow_until_released(state: dict[str, Any], ctx: Any) -> Any:
    """On its first execution, waits for ``state["release"]`` even when the SDK
    cancels it (as a step blocked in a call that does not look at cancellation would):
    it then returns, and its worker tries to save it. Transactional: its ``Effect``
    row commits with its snapshot (``step_log.write_effect``)."""
    step_log.write_effect(state, ctx)
    if _record(state, ctx) == 1:
        while True:
            try:
                step_log.wait_for_file(state["release"])
                break
            except BaseException as exc:  # temporalio's CancelledError, raised in here
                logging.getLogger("flowwarden_django.tests").warning(
                    "the slow step was cancelled by the SDK (%r); it waits on", exc
                )
    else:
        time.sleep(state["sleep"])
    return advance(then(state, "slow"))


@step("slow", short=True)
def slow_short(state: dict[str, Any], ctx: Any) -> Any:
    if _record(state, ctx) == 1:
        time.sleep(SLOW_SECONDS)
    return advance(then(state, "slow"))


@step("nap")
def nap(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    return sleep(then(state, "nap"), state["nap"])


def _heard(state: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """*state* with the message this step got (``None`` after a timeout) appended to
    ``heard`` when the step before it waited for one; else *state*."""
    if not state.get("trail", [""])[-1].startswith("listen"):
        return state
    message = ctx.message
    got = None if message is None else {"id": message.id, "payload": message.payload}
    return {**state, "heard": [*state.get("heard", []), got]}


def _listen(name: str) -> Any:
    @step(name)
    def body(state: dict[str, Any], ctx: Any) -> Any:
        _record(state, ctx)
        state = _heard(state, ctx)
        ctx.set_event("listening", {"step": name})
        return wait_for(then(state, name), "go", timeout=state.get("timeout"))

    return body


@step("heard")
def heard(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    state = _heard(state, ctx)
    ctx.set_event("heard", state["heard"][-1])
    return done(then(state, "heard"))


@step("long")
def long(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    time.sleep(state["sleep"])
    return advance(then(state, "long"))


@step("fan_out")
def fan_out(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    children = [
        (FAN_CHILD, {"n": n, "log": state["log"], "stall": state.get("stall")}) for n in range(1, 6)
    ]
    return spawn(state, children, then="results")


@step("collect")
def collect(state: dict[str, Any], ctx: Any) -> Any:
    record(state, ctx, attempt=ctx.attempt, children=len(ctx.children))
    return done({**state, "total": sum(r["state"]["value"] for r in state["results"])})


@step("enrich")
def enrich(state: dict[str, Any], ctx: Any) -> Any:
    if record(state, ctx, n=state["n"]) == 1 and state["n"] == state.get("stall"):
        time.sleep(SLOW_SECONDS)
    return advance({**state, "value": state["n"] * 10})


@step("flaky", max_retries=2, retry_delay=0.2)
def flaky(state: dict[str, Any], ctx: Any) -> Any:
    if _record(state, ctx) < 3:
        raise RuntimeError("not yet")
    return advance(then(state, "flaky"))


@step("bump", short=True)
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
    return advance(state)


@step("listen")
def loop_listen(state: dict[str, Any], ctx: Any) -> Any:
    _record(state, ctx)
    return wait_for(then(state, "listen"), "item")


@step("handle", goes_to=["listen", "handle"])
def loop_handle(state: dict[str, Any], ctx: Any) -> Any:
    """Logs the message it got (``message``: its id), appends its payload to
    ``handled``; jumps back until ``LOOP_TIMES`` were handled."""
    message = ctx.message
    record(state, ctx, attempt=ctx.attempt, message=None if message is None else message.id)
    state = then(state, "handle")
    state = {**state, "handled": [*state.get("handled", []), message and message.payload]}
    if len(state["handled"]) >= LOOP_TIMES:
        return done(state)
    if state.get("wait_in_handle"):
        return wait_for(state, "item", to="handle")
    return advance(state, to="listen")


def versioned(name: str, version: int, outcome: Any = advance, **options: Any) -> Any:
    """A step of version *version* that logs its version and the worker's tag."""

    @step(name, **options)
    def body(state: dict[str, Any], ctx: Any) -> Any:
        tag = os.environ.get("FLOWWARDEN_TEST_WORKER_TAG", "")
        record(state, ctx, attempt=ctx.attempt, version=version, tag=tag)
        return outcome(then(state, name))

    return body


#: The steps of each version of the versioned workflows.
VERSIONED = {
    (ROLLING, 1): lambda: [versioned("r1", 1, short=True), versioned("r2", 1, short=True)],
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
    twenty = [_plain(f"s{index:02d}") for index in range(1, 21)]
    return {
        name: Workflow.define(name, steps, store, using=using)
        for name, steps in (
            (TWENTY, twenty),
            (ONE, [_plain("one")]),
            (PAUSING, [_plain("one"), pause, decide]),
            (APPROVING, [_plain("one"), ask, decide]),
            (EXPIRING, [_plain("one"), ask, decide]),
            (KILLABLE, [_plain("one"), slow, _plain("three")]),
            (FLAKY, [_plain("one"), flaky, _plain("three")]),
            (SLEEPING, [_plain("one"), nap, _plain("three")]),
            (LISTENING, [_plain("one"), _listen("listen"), heard]),
            (
                LISTENING_THRICE,
                [_plain("one"), _listen("listen1"), _listen("listen2"), _listen("listen3"), heard],
            ),
            (LONG_STEP, [_plain("one"), long, _plain("three")]),
            (
                PARTITIONED,
                [_plain("one"), slow_until_released, _plain("three"), _plain("four")],
            ),
            (FAN_CHILD, [enrich]),
            (FAN_OUT, [fan_out, collect]),
            (LOOPING, [bump, check, _plain("finish")]),
            (MESSAGE_LOOP, [loop_listen, loop_handle]),
            (
                SHORT,
                [
                    _plain("one", short=True),
                    _plain("two", timeout=2),  # within LOCAL_ACTIVITY_TIMEOUT: local
                    _plain("three", timeout=2, short=False),  # kept a regular activity
                    _plain("four", short=True),
                ],
            ),
            (
                KILLABLE_SHORT,
                [_plain("one", short=True), slow_short, _plain("three", short=True)],
            ),
        )
    }
