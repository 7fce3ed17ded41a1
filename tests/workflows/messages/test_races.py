"""A send racing the run entering its wait, on PostgreSQL with threads: the wake-up is
never lost and the message is delivered once.

Both orders are made to happen, not hoped for: the message commits while the runner
still holds the run (the sender's wake finds it held; the runner's look at the
mailbox after persisting the wait finds the message), and the message commits after
the wait was persisted but before the runner looked (the sender's wake continues
it; the runner's look finds it moved). Then many runs race with no help.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections

from flowwarden_django.workflows import (
    Completed,
    RunStatus,
    StepContext,
    Workflow,
    WorkflowDefinition,
    done,
    step,
    wait_for,
)
from flowwarden_django.workflows.waiting.messages import waiting as waiting_module
from tests.support.lanes import lane_marks
from tests.support.messages import mailbox, new_cid, run_of

DB = "postgres"
pytestmark = lane_marks("postgres", databases=["default", DB])

Define = Callable[..., WorkflowDefinition]
#: How long a thread waits for the other before the test fails (a liveness bound).
WAIT = 30


@pytest.fixture
def alias() -> str:
    return DB


class Took:
    """Which thread ran the step after the wait, per run, and what it got."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.threads: dict[str, str] = {}

    def step(self) -> Any:
        @step("take")
        def take(state: dict[str, Any], ctx: StepContext) -> Any:
            assert ctx.message is not None
            with self.lock:
                self.calls[ctx.coordination_id] += 1
                self.threads[ctx.coordination_id] = threading.current_thread().name
            return done({**state, "got": ctx.message.payload})

        return take


def in_thread(
    name: str, target: Callable[[], Any], errors: list[BaseException]
) -> threading.Thread:
    def body() -> None:
        try:
            target()
        except BaseException as exc:  # reported by the test
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=body, name=name)
    thread.start()
    return thread


def test_a_message_committed_while_the_runner_holds_the_run_is_seen_after_the_wait(
    define: Define,
):
    took = Took()
    ready, sent = threading.Event(), threading.Event()

    @step("ask")
    def ask(state: dict[str, Any]) -> Any:
        ready.set()
        assert sent.wait(WAIT), "the sender never sent"
        return wait_for(state, "go")

    flow = define([ask, took.step()])
    cid = new_cid()
    errors: list[BaseException] = []
    results: list[Any] = []
    runner = in_thread(
        "runner", lambda: results.append(flow.start({}, coordination_id=cid)), errors
    )
    assert ready.wait(WAIT)
    # The run is running and claimed: this send's wake finds it held and does nothing.
    assert run_of(DB, cid).status == RunStatus.RUNNING
    Workflow.for_coordination(cid, using=DB).send("go", {"n": 1})
    assert run_of(DB, cid).status == RunStatus.RUNNING
    sent.set()
    runner.join(WAIT * 2)
    assert not runner.is_alive() and not errors
    assert results[0].result == Completed({"got": {"n": 1}}, cid)
    assert took.calls == {cid: 1} and took.threads[cid] == "runner"
    assert [row.delivered_to is not None for row in mailbox(DB, cid)] == [True]


def test_a_message_committed_after_the_wait_but_before_the_runner_looks_wakes_it(
    define: Define, monkeypatch: pytest.MonkeyPatch
):
    took = Took()
    persisted, sent = threading.Event(), threading.Event()
    looked: list[bool] = []
    original = waiting_module.wake_if_mail

    def late_look(coordination_id: str, using: str, workflow: Any = None) -> bool:
        if threading.current_thread().name == "runner":
            persisted.set()
            assert sent.wait(WAIT), "the sender never sent"
            looked.append(original(coordination_id, using, workflow))
            return looked[-1]
        return original(coordination_id, using, workflow)

    monkeypatch.setattr(waiting_module, "wake_if_mail", late_look)

    @step("ask")
    def ask(state: dict[str, Any]) -> Any:
        return wait_for(state, "go")

    flow = define([ask, took.step()])
    cid = new_cid()
    errors: list[BaseException] = []
    runner = in_thread("runner", lambda: flow.start({}, coordination_id=cid), errors)
    assert persisted.wait(WAIT)
    assert run_of(DB, cid).status == RunStatus.WAITING_MESSAGE
    # The wait is persisted: this send's wake continues the run, in this thread.
    Workflow.for_coordination(cid, using=DB).send("go", {"n": 2})
    assert run_of(DB, cid).status == RunStatus.COMPLETED
    sent.set()
    runner.join(WAIT * 2)
    assert not runner.is_alive() and not errors
    assert looked == [False]  # the runner's look found the run moved on
    assert took.calls == {cid: 1} and took.threads[cid] == threading.current_thread().name


RUNS = 16


def test_many_sends_racing_their_runs_waits_lose_no_wake_up(define: Define):
    took = Took()

    @step("ask")
    def ask(state: dict[str, Any]) -> Any:
        return wait_for(state, "go")

    flow = define([ask, took.step()])
    cids = [new_cid() for _ in range(RUNS)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(RUNS * 2)

    def start(cid: str) -> Callable[[], Any]:
        def go() -> None:
            barrier.wait(WAIT)
            flow.workflow(cid).run({})

        return go

    def send(cid: str) -> Callable[[], Any]:
        def go() -> None:
            barrier.wait(WAIT)
            # The run may not exist yet: try until it does (its first statement).
            while True:
                try:
                    Workflow.for_coordination(cid, using=DB).send("go", {"cid": cid})
                    return
                except LookupError:
                    time.sleep(0.001)

        return go

    threads = []
    for cid in cids:
        threads.append(in_thread(f"run-{cid}", start(cid), errors))
        threads.append(in_thread(f"send-{cid}", send(cid), errors))
    for thread in threads:
        thread.join(WAIT * 4)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    for cid in cids:
        assert run_of(DB, cid).status == RunStatus.COMPLETED, cid
        assert Workflow.for_coordination(cid, using=DB).current_result() == Completed(
            {"got": {"cid": cid}}, cid
        )
        assert [row.delivered_to is not None for row in mailbox(DB, cid)] == [True]
    assert took.calls == dict.fromkeys(cids, 1)
    by = Counter(name.split("-")[0] for name in took.threads.values())
    print(
        f"\n[races] of {RUNS} runs, {by['run']} took their message in their runner's "
        f"thread, {by['send']} in their sender's",
        file=sys.stderr,
    )
