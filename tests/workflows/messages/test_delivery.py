"""Messages to runs on the in-process engine, on SQLite, PostgreSQL and MariaDB: a durable
mailbox per run and topic, delivered once per wait in the order sent, at most once per
idempotency key, sent in the caller's transaction and woken after its commit, with
timeouts woken by the recovery sweep."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from flowwarden_django.workflows import (
    Completed,
    Message,
    RunStatus,
    StepContext,
    WaitingForMessage,
    Workflow,
    WorkflowDefinition,
    advance,
    hibernate,
    step,
    wait_for,
)
from flowwarden_django.workflows.definition.metadata import LAST_STEP
from flowwarden_django.workflows.waiting.messages.waiting import WAIT_METADATA, wait_of
from tests.support.messages import EVERY_DATABASE, mailbox, new_cid, run_of
from tests.support.polling import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Define = Callable[..., WorkflowDefinition]


def waiting(name: str, topic: str = "payment", timeout: float | None = None) -> Any:
    @step(name)
    def run(state: dict[str, Any]) -> Any:
        return wait_for(state, topic, timeout=timeout)

    return run


def seen(message: Message | None) -> dict[str, Any] | None:
    if message is None:
        return None
    return {"topic": message.topic, "payload": message.payload, "sender": message.sender}


def taking(name: str, depths: list[int] | None = None) -> Any:
    """A step that appends what it got (``ctx.message``) to ``state["got"]``."""

    @step(name)
    def run(state: dict[str, Any], ctx: StepContext) -> Any:
        if depths is not None:
            depths.append(len(inspect.stack(0)))
        return advance({**state, "got": [*state.get("got", []), seen(ctx.message)]})

    return run


@step("prepare")
def prepare(state: dict[str, Any]) -> Any:
    return hibernate(state)


def snapshot_of(wf: Workflow, step_name: str) -> Any:
    [found] = [s for s in wf.history() if s.metadata.get(LAST_STEP) == step_name]
    return found


def paid(amount: int, sender: str = "") -> dict[str, Any]:
    return {"topic": "payment", "payload": {"amount": amount}, "sender": sender}


@EVERY_DATABASE
def test_a_run_waits_holding_nothing_and_a_send_wakes_it_at_once(alias: str, define: Define):
    orders = define([waiting("pay"), taking("ship")])
    cid = new_cid()
    result = orders.start({}, coordination_id=cid).result
    assert result == WaitingForMessage({}, cid, "pay", topic="payment", deadline=None)
    assert result.status == RunStatus.WAITING_MESSAGE
    run = run_of(alias, cid)
    assert (run.status, run.waiting_topic, run.runner, run.wake_at) == (
        "waiting_message",
        "payment",
        "",
        None,
    )
    wf = Workflow.for_coordination(cid, using=alias)
    assert wf.current_result() == result
    assert wait_of(snapshot_of(wf, "pay")) == ("payment", None)

    # Another topic is kept, and wakes nothing.
    other = wf.send("refund", {"amount": 1})
    assert run_of(alias, cid).status == RunStatus.WAITING_MESSAGE

    sent = wf.send("payment", {"amount": 12}, sender="psp")
    assert isinstance(sent, Message)
    assert (sent.topic, sent.payload, sent.sender) == ("payment", {"amount": 12}, "psp")
    assert sent.id > other.id and sent.sent_at <= timezone.now()
    # In-process, the run went on in this thread before send() returned.
    assert wf.current_result() == Completed({"got": [paid(12, "psp")]}, cid)
    rows = {row.pk: row for row in mailbox(alias, cid)}
    assert rows[sent.id].delivered_to == snapshot_of(wf, "pay").id
    assert rows[sent.id].delivered_at is not None
    assert rows[other.id].delivered_to is None  # still in the mailbox


@EVERY_DATABASE
def test_a_message_sent_before_the_wait_is_kept_and_delivered_when_it_waits(
    alias: str, define: Define
):
    orders = define([prepare, waiting("pay"), taking("ship")])
    cid = new_cid()
    assert orders.start({}, coordination_id=cid).result.status == RunStatus.HIBERNATED
    wf = Workflow.for_coordination(cid, using=alias)
    sent = wf.send("payment", {"amount": 5})
    assert run_of(alias, cid).status == RunStatus.HIBERNATED  # a send wakes only a wait
    assert wf.run() == Completed({"got": [paid(5)]}, cid)
    [row] = mailbox(alias, cid)
    assert (row.pk, row.delivered_to) == (sent.id, snapshot_of(wf, "pay").id)


@EVERY_DATABASE
def test_several_messages_are_delivered_one_per_wait_in_the_order_sent(alias: str, define: Define):
    steps = [prepare]
    for n in range(3):
        steps += [waiting(f"pay-{n}"), taking(f"take-{n}")]
    orders = define(steps)
    cid = new_cid()
    orders.start({}, coordination_id=cid)
    wf = Workflow.for_coordination(cid, using=alias)
    sent = [wf.send("payment", {"amount": n}) for n in (3, 1, 2)]
    assert wf.run() == Completed({"got": [paid(3), paid(1), paid(2)]}, cid)
    rows = mailbox(alias, cid)
    assert [row.pk for row in rows] == [message.id for message in sent]
    assert [row.delivered_to for row in rows] == [snapshot_of(wf, f"pay-{n}").id for n in range(3)]


@EVERY_DATABASE
def test_a_run_that_takes_many_waiting_messages_in_a_row_does_not_nest(alias: str, define: Define):
    """In-process, a wait whose message is there continues the run; the next one is
    queued behind it in this thread, not run inside it."""
    depths: list[int] = []
    steps = [prepare]
    for n in range(25):
        steps += [waiting(f"pay-{n}"), taking(f"take-{n}", depths)]
    orders = define(steps)
    cid = new_cid()
    orders.start({}, coordination_id=cid)
    wf = Workflow.for_coordination(cid, using=alias)
    for n in range(25):
        wf.send("payment", {"amount": n})
    assert wf.run() == Completed({"got": [paid(n) for n in range(25)]}, cid)
    assert len(depths) == 25
    assert max(depths[1:]) == min(depths[1:])  # the same depth for every wait after the first


@EVERY_DATABASE
def test_two_sends_with_one_idempotency_key_store_and_deliver_one_message(
    alias: str, define: Define
):
    orders = define([waiting("pay"), taking("ship"), waiting("pay-again"), taking("done")])
    cid = new_cid()
    orders.start({}, coordination_id=cid)
    wf = Workflow.for_coordination(cid, using=alias)
    first = wf.send("payment", {"amount": 1}, idempotency_key="psp-event-1")
    again = wf.send("payment", {"amount": 2}, idempotency_key="psp-event-1")
    assert again == first
    assert [row.pk for row in mailbox(alias, cid)] == [first.id]
    result = wf.current_result()
    assert isinstance(result, WaitingForMessage) and result.last_step_name == "pay-again"
    assert result.saved_state == {"got": [paid(1)]}
    # Another key is another message.
    wf.send("payment", {"amount": 3}, idempotency_key="psp-event-2")
    assert wf.current_result() == Completed({"got": [paid(1), paid(3)]}, cid)


class Rollback(Exception):
    pass


@EVERY_DATABASE
def test_a_send_commits_or_rolls_back_with_the_callers_transaction(alias: str, define: Define):
    orders = define([waiting("pay"), taking("ship")])
    cid = new_cid()
    orders.start({}, coordination_id=cid)
    wf = Workflow.for_coordination(cid, using=alias)
    with pytest.raises(Rollback), transaction.atomic(using=alias):
        wf.send("payment", {"amount": 1})
        raise Rollback
    assert mailbox(alias, cid) == []
    assert run_of(alias, cid).status == RunStatus.WAITING_MESSAGE

    with transaction.atomic(using=alias):
        sent = wf.send("payment", {"amount": 2})
        # Not woken before the commit.
        assert run_of(alias, cid).status == RunStatus.WAITING_MESSAGE
    assert wf.current_result() == Completed({"got": [paid(2)]}, cid)
    assert [row.pk for row in mailbox(alias, cid)] == [sent.id]


@EVERY_DATABASE
def test_a_timeout_wakes_the_run_by_the_sweep_with_no_message(
    alias: str, define: Define, sweep: Callable[[], list[str]]
):
    orders = define([waiting("pay", timeout=0.3), taking("ship"), waiting("later"), taking("end")])
    cid = new_cid()
    result = orders.start({}, coordination_id=cid).result
    assert isinstance(result, WaitingForMessage) and result.deadline is not None
    run = run_of(alias, cid)
    assert run.wake_at == result.deadline
    wf = Workflow.for_coordination(cid, using=alias)
    assert wait_of(snapshot_of(wf, "pay")) == ("payment", result.deadline)
    assert WAIT_METADATA in snapshot_of(wf, "pay").metadata

    wait_until(lambda: cid in sweep(), "the sweep to wake the run at its deadline")
    after = wf.current_result()
    assert isinstance(after, WaitingForMessage) and after.last_step_name == "later"
    assert after.saved_state == {"got": [None]}
    assert snapshot_of(wf, "ship").created_at >= result.deadline  # not woken early
    assert run_of(alias, cid).wake_at is None


@EVERY_DATABASE
def test_a_message_sent_after_the_deadline_is_left_for_the_next_wait(alias: str, define: Define):
    orders = define([waiting("pay", timeout=0.2), taking("ship"), waiting("later"), taking("end")])
    cid = new_cid()
    deadline = orders.start({}, coordination_id=cid).result.deadline
    wait_until(lambda: timezone.now() > deadline, "the deadline to pass")
    wf = Workflow.for_coordination(cid, using=alias)
    # The send wakes the run (before the sweep would): its wait timed out, so the step
    # after it gets None, and the message goes to the next wait on the topic.
    wf.send("payment", {"amount": 9})
    assert wf.current_result() == Completed({"got": [None, paid(9)]}, cid)


@EVERY_DATABASE
def test_a_retry_and_a_run_after_a_failure_see_the_same_message(alias: str, define: Define):
    attempts: list[tuple[int, int]] = []

    @step("ship", max_retries=1, retry_delay=0)
    def ship(state: dict[str, Any], ctx: StepContext) -> Any:
        assert ctx.message is not None
        attempts.append((ctx.attempt, ctx.message.id))
        if len(attempts) < 3:  # the first run's two attempts fail: the run fails
            raise RuntimeError("the carrier is down")
        return advance({**state, "shipped": ctx.message.payload})

    orders = define([waiting("pay"), ship])
    cid = new_cid()
    orders.start({}, coordination_id=cid)
    wf = Workflow.for_coordination(cid, using=alias)
    first = wf.send("payment", {"amount": 1})
    assert run_of(alias, cid).status == RunStatus.FAILED
    second = wf.send("payment", {"amount": 2})  # kept for a later wait
    assert wf.run() == Completed({"shipped": {"amount": 1}}, cid)
    assert attempts == [(1, first.id), (2, first.id), (1, first.id)]
    rows = {row.pk: row.delivered_to for row in mailbox(alias, cid)}
    assert rows == {first.id: snapshot_of(wf, "pay").id, second.id: None}


@EVERY_DATABASE
def test_resume_input_never_becomes_the_message(
    alias: str, define: Define, caplog: pytest.LogCaptureFixture
):
    @step("ship")
    def ship(state: dict[str, Any], ctx: StepContext) -> Any:
        return advance({**state, "message": seen(ctx.message), "input": ctx.input})

    orders = define([waiting("pay"), ship])
    cid = new_cid()
    orders.start({}, coordination_id=cid)
    wf = Workflow.for_coordination(cid, using=alias)
    forged = {"topic": "payment", "payload": {"amount": 1000}}
    with caplog.at_level("WARNING", logger="flowwarden_django.workflows"):
        result = wf.resume(input=forged)
    assert isinstance(result, WaitingForMessage)
    assert "the input given is not a message; ignored" in caplog.text
    assert run_of(alias, cid).resume_input is None
    wf.send("payment", {"amount": 10})
    assert wf.current_result() == Completed({"message": paid(10), "input": None}, cid)


@EVERY_DATABASE
def test_the_sweep_delivers_what_a_lost_wake_left(
    alias: str, define: Define, sweep: Callable[[], list[str]]
):
    """A send from a process that does not define the run's workflow (or whose wake
    was lost in a crash) leaves the run waiting; the sweep of one that does continues
    it."""
    orders = define([waiting("pay"), taking("ship")])
    cid = new_cid()
    orders.start({}, coordination_id=cid)
    from flowwarden_django.workflows import send_message, workflow_registry

    workflow_registry.unregister(orders.name)
    try:
        send_message(cid, "payment", {"amount": 4}, using=alias)
        assert run_of(alias, cid).status == RunStatus.WAITING_MESSAGE
    finally:
        workflow_registry.register(orders)
    assert sweep() == [cid]
    assert Workflow.for_coordination(cid, using=alias).current_result() == Completed(
        {"got": [paid(4)]}, cid
    )
    assert sweep() == []


@EVERY_DATABASE
def test_a_workflow_that_is_not_registered_is_woken_by_its_own_send(alias: str):
    from flowwarden_django.workflows.backends.orm import OrmSnapshotStore

    cid = new_cid()
    steps = [waiting("pay"), taking("ship")]
    wf = Workflow("unregistered-orders", cid, steps, OrmSnapshotStore(using=alias), using=alias)
    assert isinstance(wf.run({}), WaitingForMessage)
    wf.send("payment", {"amount": 3})
    assert wf.current_result() == Completed({"got": [paid(3)]}, cid)
