"""A run waiting for a message under the operations, on SQLite, PostgreSQL and MariaDB:
cancel ends the wait, a fork of the waiting snapshot waits again for a new message
(a fork elsewhere leaves the run hibernated), an upgrade keeps the wait and a
message delivered to it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from flowwarden_django.workflows import (
    Completed,
    Hibernated,
    RunCancelledError,
    RunStatus,
    StepContext,
    WaitingForMessage,
    Workflow,
    WorkflowDefinition,
    advance,
    done,
    step,
    wait_for,
)
from flowwarden_django.workflows.definition.metadata import LAST_STEP
from flowwarden_django.workflows.operations.upgrades import upgrade_registry, upgrade_run
from tests.support.messages import EVERY_DATABASE, mailbox, new_cid, run_of

pytestmark = pytest.mark.django_db(transaction=True)

Define = Callable[..., WorkflowDefinition]


@step("prepare")
def prepare(state: dict[str, Any]) -> Any:
    return advance({**state, "prepared": True})


@step("pay")
def pay(state: dict[str, Any]) -> Any:
    return wait_for(state, "payment", timeout=3600)


@step("ship")
def ship(state: dict[str, Any], ctx: StepContext) -> Any:
    assert ctx.message is not None
    return done({**state, "paid": ctx.message.payload["amount"]})


def snapshot_of(wf: Workflow, step_name: str) -> Any:
    return [s for s in wf.history() if s.metadata.get(LAST_STEP) == step_name][-1]


@EVERY_DATABASE
def test_cancel_ends_a_wait(alias: str, define: Define, sweep: Callable[[], list[str]]):
    orders = define([prepare, pay, ship])
    cid = new_cid()
    assert isinstance(orders.start({}, coordination_id=cid).result, WaitingForMessage)
    wf = Workflow.for_coordination(cid, using=alias)
    outcome = wf.cancel("the customer left", by="alice")
    assert (outcome.cancelled, outcome.status) == (True, RunStatus.CANCELLED)
    run = run_of(alias, cid)
    assert (run.status, run.wake_at, run.runner) == (RunStatus.CANCELLED, None, "")
    with pytest.raises(RunCancelledError):
        wf.send("payment", {"amount": 1})
    assert mailbox(alias, cid) == []
    assert sweep() == []
    assert wf.run().status == RunStatus.CANCELLED


@EVERY_DATABASE
def test_a_fork_of_the_waiting_snapshot_waits_for_a_new_message(alias: str, define: Define):
    orders = define([prepare, pay, ship])
    cid = new_cid()
    orders.start({}, coordination_id=cid)
    wf = Workflow.for_coordination(cid, using=alias)
    first = wf.send("payment", {"amount": 1})
    assert wf.current_result() == Completed({"prepared": True, "paid": 1}, cid)
    waited = snapshot_of(wf, "pay")

    forked = wf.fork(waited.id, {"prepared": True, "again": True})
    run = run_of(alias, cid)
    assert (run.status, run.head_snapshot_id, run.waiting_topic) == (
        RunStatus.WAITING_MESSAGE,
        forked.id,
        "payment",
    )
    assert run.wake_at is not None  # the source's deadline
    assert isinstance(wf.run(), WaitingForMessage)  # the first message stays the source's

    second = wf.send("payment", {"amount": 2})
    assert wf.current_result() == Completed({"prepared": True, "again": True, "paid": 2}, cid)
    delivered = {row.pk: row.delivered_to for row in mailbox(alias, cid)}
    assert delivered == {first.id: waited.id, second.id: forked.id}


@EVERY_DATABASE
def test_a_fork_of_a_waiting_message_run_from_another_snapshot_hibernates_it(
    alias: str, define: Define
):
    orders = define([prepare, pay, ship])
    cid = new_cid()
    orders.start({}, coordination_id=cid)
    wf = Workflow.for_coordination(cid, using=alias)
    forked = wf.fork(snapshot_of(wf, "prepare").id, {"prepared": "again"})
    run = run_of(alias, cid)
    assert (run.status, run.wake_at) == (RunStatus.HIBERNATED, None)
    assert wf.current_result() == Hibernated({"prepared": "again"}, cid, "prepare")
    # Run again, it waits at a new wait (after the fork).
    result = wf.run()
    assert isinstance(result, WaitingForMessage)
    assert snapshot_of(wf, "pay").parent_id == forked.id


@EVERY_DATABASE
def test_an_upgrade_keeps_the_wait_and_the_message_delivered_to_it(alias: str, define: Define):
    name = f"messages-upgrade-{new_cid()}"
    old = define([prepare, pay, ship], name=name, version=1)

    @step("ship_it")
    def ship_it(state: dict[str, Any], ctx: StepContext) -> Any:
        assert ctx.message is not None
        return done({**state, "shipped": ctx.message.payload["amount"]})

    define([prepare, pay, ship_it], name=name, version=2)
    Workflow.define_upgrade(name, from_version=1, to_version=2)
    try:
        cid = new_cid()
        old.start({}, coordination_id=cid)
        before = run_of(alias, cid)
        outcome = upgrade_run(cid, using=alias)
        assert outcome.upgraded, outcome
        after = run_of(alias, cid)
        assert (after.status, after.workflow_version, after.waiting_topic) == (
            RunStatus.WAITING_MESSAGE,
            2,
            "payment",
        )
        assert after.wake_at == before.wake_at
        wf = Workflow.for_coordination(cid, using=alias)
        assert wf.version == 2
        sent = wf.send("payment", {"amount": 5})
        assert wf.current_result() == Completed({"prepared": True, "shipped": 5}, cid)
        [row] = mailbox(alias, cid)
        assert (row.pk, row.delivered_to) == (sent.id, after.head_snapshot_id)
    finally:
        upgrade_registry.unregister(name, 1)
