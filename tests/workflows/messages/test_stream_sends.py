"""Messages sent from a transactional stream's handler (issue 47, item 5), in process,
on the fake change source, on both runtimes (threads, asyncio), one event at a time
and in parallel, on SQLite and PostgreSQL.

A handler of a ``transactional=True`` stream runs in one transaction with its
processed-anchor write (or its settled mark, in parallel). A send there commits with
the anchor, and wakes the run only once that transaction committed: what the crash
test (``tests/streams/test_message_crash.py``) relies on. A send whose attempt rolls
back (the handler failed, or a savepoint of its own rolled back) stores nothing and
its wake is dropped (Django discards the ``on_commit`` callbacks of a rolled-back
savepoint). A send to runs on another database than the stream's checkpoint is not
exactly once, and says so in the log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections, transaction

from flowwarden_django.models import WorkflowMessage
from flowwarden_django.streams.backends.orm import OrmCheckpointStore
from flowwarden_django.streams.spec import CheckpointSpec, RestartPolicySpec, StreamSpec
from flowwarden_django.testkit.fake_source import FakeChangeSource
from flowwarden_django.workflows import (
    RunStatus,
    StepContext,
    Workflow,
    WorkflowDefinition,
    done,
    step,
    wait_for,
)
from flowwarden_django.workflows.definition.metadata import LAST_STEP
from flowwarden_django.workflows.waiting.messages import sending
from tests.streams.managers import RUNNERS, consumer_class
from tests.support.messages import ALIASES, POSTGRES, mailbox, new_cid, run_of

pytestmark = pytest.mark.django_db(transaction=True)

Define = Callable[..., WorkflowDefinition]
#: The runtimes: a stream one event at a time, or four at once (ordered per run).
SHAPES = pytest.mark.parametrize("parallelism", [1, 4], ids=["serial", "parallel"])


@step("wait")
def wait(state: dict[str, Any]) -> Any:
    return wait_for(state, "paid")


@step("took")
def took(state: dict[str, Any], ctx: StepContext) -> Any:
    message = ctx.message
    assert message is not None
    return done({**state, "message": message.id, "amount": message.payload["amount"]})


class Rollback(Exception):
    pass


def stream(handler: Any, alias: str, parallelism: int = 1, **options: Any) -> StreamSpec:
    windowed = {"key": lambda event: event["fullDocument"]["cid"]} if parallelism > 1 else {}
    return StreamSpec(
        name="payments",
        collection="payments",
        handlers={"insert": handler},
        transactional=True,
        transaction_using=alias,
        parallelism=parallelism,
        checkpoint=CheckpointSpec(save_every_n=1 if parallelism == 1 else 5),
        restart_policy=RestartPolicySpec(initial_delay="1ms", max_delay="5ms"),
        **windowed,
        **options,
    )


@pytest.fixture
def wakes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Each wake after a send, as it was called: the run, whether a transaction of its
    database was still open, and the stream's processed anchor it could read then."""
    seen: list[dict[str, Any]] = []
    wake = sending.wake_after_send

    def spy(coordination_id: str, using: str, *args: Any) -> None:
        saved = OrmCheckpointStore(using=using).find("payments")
        seen.append(
            {
                "cid": coordination_id,
                "in_transaction": connections[using].in_atomic_block,
                "anchor": saved.last_processed_token if saved else None,
                "status": run_of(using, coordination_id).status,
            }
        )
        wake(coordination_id, using, *args)

    monkeypatch.setattr(sending, "wake_after_send", spy)
    yield seen


def waiting_runs(define: Define, count: int) -> tuple[WorkflowDefinition, list[str]]:
    definition = define([wait, took])
    cids = [new_cid() for _ in range(count)]
    for cid in cids:
        definition.start({"order": cid}, coordination_id=cid)
    return definition, cids


def consume(spec: StreamSpec, store: OrmCheckpointStore, source: FakeChangeSource, runner: str):
    consumer = consumer_class(runner)(spec, store, lambda s: source)
    consumer.run(burst=True)
    return consumer


def bootstrap(alias: str, runner: str) -> tuple[OrmCheckpointStore, FakeChangeSource]:
    """The stream's first start, on an empty log: it persists its position."""
    store, source = OrmCheckpointStore(using=alias), FakeChangeSource()
    consume(stream(lambda doc: None, alias), store, source, runner)
    return store, source


def send_payment(alias: str) -> Callable[[dict[str, Any]], None]:
    def handler(doc: dict[str, Any]) -> None:
        workflow = Workflow.for_coordination(doc["cid"], using=alias)
        workflow.send("paid", {"amount": doc["amount"]}, sender="payments")

    return handler


@ALIASES
@SHAPES
@pytest.mark.parametrize("runner", RUNNERS)
def test_a_send_commits_with_the_anchor_and_the_run_wakes_after_the_commit(
    alias: str, runner: str, parallelism: int, define: Define, wakes: list[dict[str, Any]]
):
    _, cids = waiting_runs(define, 6)
    store, source = bootstrap(alias, runner)
    events = [
        source.oplog.insert({"_id": n, "cid": cid, "amount": n}) for n, cid in enumerate(cids)
    ]
    inside: list[tuple[bool, str]] = []
    send = send_payment(alias)

    def handler(doc: dict[str, Any]) -> None:
        send(doc)
        # The message is stored, in the attempt's transaction; the run still waits.
        inside.append((connections[alias].in_atomic_block, run_of(alias, doc["cid"]).status))

    consume(stream(handler, alias, parallelism), store, source, runner)

    assert inside == [(True, RunStatus.WAITING_MESSAGE)] * len(cids)
    # Each wake came once the transaction was over: the run was still waiting, and
    # (one event at a time) the anchor of its event had committed with the message.
    assert sorted(w["cid"] for w in wakes) == sorted(cids)
    assert not any(w["in_transaction"] for w in wakes)
    assert all(w["status"] == RunStatus.WAITING_MESSAGE for w in wakes)
    if parallelism == 1:
        assert [w["anchor"] for w in wakes] == [event["_id"] for event in events]
    for n, cid in enumerate(cids):
        [message] = mailbox(alias, cid)
        workflow = Workflow.for_coordination(cid, using=alias)
        assert workflow.status() == RunStatus.COMPLETED
        state = workflow.current_result().final_state
        assert (state["message"], state["amount"], message.sender) == (message.pk, n, "payments")
        [waited] = [s for s in workflow.history() if s.metadata.get(LAST_STEP) == "wait"]
        assert message.delivered_to == waited.id
    assert store.find("payments").last_processed_token == events[-1]["_id"]


@ALIASES
@SHAPES
@pytest.mark.parametrize("runner", RUNNERS)
def test_a_failed_attempt_sends_nothing_and_its_wake_is_dropped(
    alias: str, runner: str, parallelism: int, define: Define, wakes: list[dict[str, Any]]
):
    """The handler sends, then fails: the attempt rolls back, message and wake with it;
    the retry sends once. Each run gets one message and is woken once."""
    _, cids = waiting_runs(define, 4)
    store, source = bootstrap(alias, runner)
    for n, cid in enumerate(cids):
        source.oplog.insert({"_id": n, "cid": cid, "amount": n})
    send, failed = send_payment(alias), set()

    def handler(doc: dict[str, Any]) -> None:
        send(doc)
        if doc["_id"] % 2 == 0 and doc["_id"] not in failed:
            failed.add(doc["_id"])
            raise ConnectionError("after the send")

    consume(stream(handler, alias, parallelism), store, source, runner)

    assert failed == {0, 2}
    assert sorted(w["cid"] for w in wakes) == sorted(cids), "a rolled-back send woke a run"
    for cid in cids:
        assert len(mailbox(alias, cid)) == 1
        assert run_of(alias, cid).status == RunStatus.COMPLETED


@ALIASES
@pytest.mark.parametrize("runner", RUNNERS)
def test_a_send_in_a_savepoint_that_rolls_back_is_dropped_with_its_wake(
    alias: str, runner: str, define: Define, wakes: list[dict[str, Any]]
):
    """The handler sends inside an ``atomic()`` of its own that rolls back, and handles
    the error: the event settles, the message and its ``on_commit`` wake are gone (the
    attempt's transaction commits without them), and the run still waits for one."""
    _, [cid] = waiting_runs(define, 1)
    store, source = bootstrap(alias, runner)
    event = source.oplog.insert({"_id": 1, "cid": cid, "amount": 5})
    send = send_payment(alias)

    def handler(doc: dict[str, Any]) -> None:
        try:
            with transaction.atomic(using=alias):
                send(doc)
                raise Rollback
        except Rollback:
            pass

    consume(stream(handler, alias), store, source, runner)

    assert wakes == [] and mailbox(alias, cid) == []
    assert run_of(alias, cid).status == RunStatus.WAITING_MESSAGE
    assert store.find("payments").last_processed_token == event["_id"]


@pytest.mark.parametrize("alias", [POSTGRES])
@pytest.mark.parametrize("key", [None, "event"], ids=["no-key", "event-key"])
def test_a_send_to_runs_on_another_database_is_not_exactly_once_and_says_so(
    alias: str, key: str | None, define: Define, caplog: pytest.LogCaptureFixture
):
    """The stream's checkpoint commits on ``default`` (SQLite), the runs are on
    PostgreSQL: each message commits on its own. Without an idempotency key that is
    logged once per stream and database; with the event's id as the key a delivery
    again sends nothing, and nothing is logged."""
    sending._warned_apart.clear()
    _, cids = waiting_runs(define, 2)
    store, source = bootstrap("default", "threads")
    for n, cid in enumerate(cids):
        source.oplog.insert({"_id": n, "cid": cid, "amount": n})

    def handler(doc: dict[str, Any]) -> None:
        idempotency_key = None if key is None else f"payment:{doc['_id']}"
        workflow = Workflow.for_coordination(doc["cid"], using=alias)
        workflow.send("paid", {"amount": doc["amount"]}, idempotency_key=idempotency_key)

    with caplog.at_level(logging.WARNING, logger="flowwarden_django.workflows"):
        consume(stream(handler, "default"), store, source, "threads")
    warnings = [r.getMessage() for r in caplog.records if "not exactly once" in r.getMessage()]
    if key is None:
        assert len(warnings) == 1, warnings
        assert "'payments' commits its checkpoint on database 'default'" in warnings[0]
        assert "idempotency_key" in warnings[0]
    else:
        assert warnings == []
    for cid in cids:
        assert len(mailbox(alias, cid)) == 1
        assert run_of(alias, cid).status == RunStatus.COMPLETED
    assert WorkflowMessage.objects.using("default").count() == 0
