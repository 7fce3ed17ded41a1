"""A run that waits for messages in a loop (issue 47, "Done when": a loop test), in
process, on SQLite and PostgreSQL: ``listen`` waits for a message on "item"; ``handle``
appends its payload to the state and jumps back to ``listen`` (``advance(state,
to="listen")``) until five were handled, then ends the run.

Three ways the messages come: all five before the run first waits (the mailbox keeps
them, one per wait, in the order sent), one at a time while the run waits, and with
repeated idempotency keys mixed in (each message delivered once). Every time the run
completes with the five payloads in order, each message bound to its own waiting
snapshot, and one chain of snapshots at increasing ``seq``.

A wait may itself jump: ``wait_for(state, topic, to="step")`` continues at that step
once the message came (as ``hibernate`` and ``sleep`` do), within the step's
``goes_to``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from flowwarden_django.workflows import (
    Completed,
    Failed,
    RunStatus,
    StepContext,
    WaitingForMessage,
    Workflow,
    WorkflowDefinition,
    advance,
    done,
    hibernate,
    step,
    wait_for,
)
from flowwarden_django.workflows.definition.metadata import NEXT_STEP
from flowwarden_django.workflows.waiting.messages.waiting import WaitForMessage
from tests.support.messages import (
    ALIASES,
    LOOP_TIMES,
    assert_handled_once_in_order,
    mailbox,
    new_cid,
    run_of,
    waits_with,
)
from tests.support.polling import wait_until
from tests.support.step_log import assert_chained

pytestmark = pytest.mark.django_db(transaction=True)

Define = Callable[..., WorkflowDefinition]
LOOP = ["listen", "handle"] * LOOP_TIMES


def item(n: int) -> dict[str, Any]:
    return {"n": n}


PAYLOADS = [item(n) for n in range(1, LOOP_TIMES + 1)]


@step("prepare")
def prepare(state: dict[str, Any]) -> Any:
    """Stops the run before its first wait (a run exists to send to)."""
    return hibernate(state)


def listen_and_handle(calls: Counter[str], *, prepared: bool = False) -> list[Any]:
    """``listen`` → ``handle``, which jumps back to ``listen`` until ``LOOP_TIMES``
    messages were handled; ``prepare`` before them when *prepared*. *calls* counts
    each step's executions, and ``handle``'s per message id."""

    @step("listen")
    def listen(state: dict[str, Any]) -> Any:
        calls["listen"] += 1
        return wait_for(state, "item")

    @step("handle", goes_to=["listen"])
    def handle(state: dict[str, Any], ctx: StepContext) -> Any:
        assert ctx.message is not None and ctx.message.topic == "item"
        calls["handle"] += 1
        calls[f"message-{ctx.message.id}"] += 1
        state = {**state, "handled": [*state["handled"], ctx.message.payload]}
        if len(state["handled"]) < LOOP_TIMES:
            return advance(state, to="listen")
        return done(state)

    return [prepare, listen, handle] if prepared else [listen, handle]


def assert_each_handled_once(calls: Counter[str], alias: str, cid: str) -> None:
    assert (calls["listen"], calls["handle"]) == (LOOP_TIMES, LOOP_TIMES)
    assert {calls[f"message-{row.pk}"] for row in mailbox(alias, cid)} == {1}


@ALIASES
def test_five_messages_sent_before_the_first_wait_are_handled_one_per_pass_in_order(
    alias: str, define: Define
):
    calls: Counter[str] = Counter()
    loop = define(listen_and_handle(calls, prepared=True))
    cid = new_cid()
    assert loop.start({"handled": []}, coordination_id=cid).result.status == RunStatus.HIBERNATED
    wf = Workflow.for_coordination(cid, using=alias)
    for payload in PAYLOADS:
        wf.send("item", payload)
    assert run_of(alias, cid).status == RunStatus.HIBERNATED  # kept, nothing woken
    assert wf.run() == Completed({"handled": PAYLOADS}, cid)
    assert_handled_once_in_order(wf, mailbox(alias, cid), PAYLOADS, ["prepare", *LOOP])
    assert_each_handled_once(calls, alias, cid)


@ALIASES
def test_five_messages_sent_one_at_a_time_while_the_run_waits_are_handled_in_order(
    alias: str, define: Define
):
    calls: Counter[str] = Counter()
    loop = define(listen_and_handle(calls))
    cid = new_cid()
    first = loop.start({"handled": []}, coordination_id=cid).result
    assert isinstance(first, WaitingForMessage) and first.topic == "item"
    wf = Workflow.for_coordination(cid, using=alias)
    for n, payload in enumerate(PAYLOADS):
        wait_until(lambda n=n: waits_with(alias, cid, n), f"run {cid} at wait {n + 1}")
        wf.send("item", payload)
    wait_until(lambda: wf.status() == RunStatus.COMPLETED, f"run {cid} completed")
    assert_handled_once_in_order(wf, mailbox(alias, cid), PAYLOADS, LOOP)
    assert_each_handled_once(calls, alias, cid)


@ALIASES
def test_repeated_idempotency_keys_mixed_in_deliver_each_message_once(alias: str, define: Define):
    """Two messages (each sent twice) before the first wait, then the three others one
    at a time while the run waits, each followed by a repeat of itself and of the one
    before (already handled): a repeat stores nothing, and no wait gets one."""
    calls: Counter[str] = Counter()
    loop = define(listen_and_handle(calls, prepared=True))
    cid = new_cid()
    loop.start({"handled": []}, coordination_id=cid)
    wf = Workflow.for_coordination(cid, using=alias)

    def send(n: int, repeat: bool = False) -> Any:
        # A repeat carries another payload: were it delivered, the order would show it.
        return wf.send("item", item(-n if repeat else n), idempotency_key=f"item-{n}")

    sent = {n: send(n) for n in (1, 2)}
    assert send(1, repeat=True) == sent[1] and send(2, repeat=True) == sent[2]
    wf.run()
    for n in (3, 4, 5):
        wait_until(lambda n=n: waits_with(alias, cid, n - 1), f"run {cid} at wait {n}")
        sent[n] = send(n)
        assert send(n, repeat=True) == sent[n]
        assert send(n - 1, repeat=True) == sent[n - 1]
    wait_until(lambda: wf.status() == RunStatus.COMPLETED, f"run {cid} completed")
    rows = mailbox(alias, cid)
    assert [row.pk for row in rows] == [sent[n].id for n in range(1, 6)]
    assert_handled_once_in_order(wf, rows, PAYLOADS, ["prepare", *LOOP])
    assert_each_handled_once(calls, alias, cid)


# -- a wait that jumps ----------------------------------------------------------------


def handle_and_wait_again(calls: Counter[str], goes_to: list[str]) -> list[Any]:
    """``listen`` waits once; ``handle`` handles a message and waits for the next,
    continuing at itself (``wait_for(..., to="handle")``) until ``LOOP_TIMES`` were
    handled; then ``after``."""

    @step("listen")
    def listen(state: dict[str, Any]) -> Any:
        return wait_for(state, "item")

    @step("handle", goes_to=goes_to)
    def handle(state: dict[str, Any], ctx: StepContext) -> Any:
        assert ctx.message is not None
        calls[f"message-{ctx.message.id}"] += 1
        state = {**state, "handled": [*state["handled"], ctx.message.payload]}
        if len(state["handled"]) < LOOP_TIMES:
            return wait_for(state, "item", to="handle")
        return advance(state)

    @step("after")
    def after(state: dict[str, Any]) -> Any:
        calls["after"] += 1
        return done({**state, "after": True})

    return [listen, handle, after]


def test_wait_for_takes_a_jump_target_as_hibernate_and_sleep_do():
    assert wait_for({}, "item").to == ""
    assert wait_for({}, "item", to="handle").to == "handle"
    assert isinstance(wait_for({}, "item", 5, to="handle"), WaitForMessage)
    with pytest.raises(ValueError, match="to= names a step"):
        wait_for({}, "item", to="  ")


@ALIASES
def test_a_wait_that_jumps_continues_at_its_target_with_the_message(alias: str, define: Define):
    calls: Counter[str] = Counter()
    loop = define(handle_and_wait_again(calls, ["handle"]))
    cid = new_cid()
    loop.start({"handled": []}, coordination_id=cid)
    wf = Workflow.for_coordination(cid, using=alias)
    wf.send("item", PAYLOADS[0])
    result = wf.current_result()
    assert isinstance(result, WaitingForMessage) and result.last_step_name == "handle"
    # The jump is on the waiting snapshot: where the run continues when woken.
    assert wf.history()[-1].metadata.get(NEXT_STEP) == "handle"
    for n, payload in enumerate(PAYLOADS[1:], start=1):
        wait_until(lambda n=n: run_of(alias, cid).status == RunStatus.WAITING_MESSAGE, "a wait")
        assert sum(row.delivered_to is not None for row in mailbox(alias, cid)) == n
        wf.send("item", payload)
    assert wf.current_result() == Completed({"handled": PAYLOADS, "after": True}, cid)
    steps = ["listen", *["handle"] * LOOP_TIMES, "after"]
    assert_chained(wf, steps)
    waits = [s.id for s in wf.history()[1 : LOOP_TIMES + 1]]  # listen's, then handle's
    rows = mailbox(alias, cid)
    assert [row.payload for row in rows] == PAYLOADS
    assert [row.delivered_to for row in rows] == waits
    assert {calls[f"message-{row.pk}"] for row in rows} == {1}
    assert calls["after"] == 1


@ALIASES
def test_a_wait_that_jumps_where_its_step_may_not_go_fails_the_run_and_persists_nothing(
    alias: str, define: Define
):
    calls: Counter[str] = Counter()
    loop = define(handle_and_wait_again(calls, ["listen"]))
    cid = new_cid()
    loop.start({"handled": []}, coordination_id=cid)
    wf = Workflow.for_coordination(cid, using=alias)
    before = len(wf.history())
    wf.send("item", PAYLOADS[0])
    result = wf.current_result()
    assert isinstance(result, Failed)
    assert "step 'handle' jumps to 'handle', which its goes_to does not declare" in result.reason
    assert len(wf.history()) == before  # nothing persisted: a later run retries the step
    # The message stays bound to listen's wait: a later run of handle gets it again.
    assert [row.delivered_to for row in mailbox(alias, cid)] == [wf.history()[-1].id]


@ALIASES
def test_a_wait_that_jumps_and_times_out_is_woken_by_the_sweep_at_its_target(
    alias: str, define: Define, sweep: Callable[[], list[str]]
):
    ran: list[tuple[str, Any]] = []

    @step("ask", goes_to=["late"])
    def ask(state: dict[str, Any]) -> Any:
        return wait_for(state, "item", timeout=0.2, to="late")

    @step("skipped")
    def skipped(state: dict[str, Any]) -> Any:
        ran.append(("skipped", None))
        return advance(state)

    @step("late")
    def late(state: dict[str, Any], ctx: StepContext) -> Any:
        ran.append(("late", ctx.message))
        return done(state)

    loop = define([ask, skipped, late])
    cid = new_cid()
    result = loop.start({}, coordination_id=cid).result
    assert isinstance(result, WaitingForMessage) and result.deadline is not None
    wait_until(lambda: cid in sweep(), "the sweep to wake the run at its deadline")
    wf = Workflow.for_coordination(cid, using=alias)
    assert wf.current_result() == Completed({}, cid)
    assert ran == [("late", None)]
    assert_chained(wf, ["ask", "late"])
