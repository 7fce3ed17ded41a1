"""A Celery worker whose database is silent stops taking tasks (``celery.silence``),
without a server: what counts as silent (a claim of the process unrenewed for half its
lease), the consumer gate that cancels and restores the task consumer's queues, its
bootstep, its installation, and the step task that hands itself back (before touching
the database) while its database is silent. The partitions themselves are
``tests/faults/test_celery_partitions.py``'s "postgres-alone" cases."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("celery", reason="the Celery tests need celery")

from celery import Celery
from django.test import override_settings

from flowwarden_django.integrations.celery import install_from_settings, silence
from flowwarden_django.integrations.celery import provider as provider_module
from flowwarden_django.integrations.celery.provider import (
    HANDOFF_HEADER,
    STEP_TASK,
    Origin,
    run_step,
)
from flowwarden_django.integrations.celery.silence import (
    MAX_SILENT_HANDBACKS,
    ConsumerGate,
    SilentDatabaseBootstep,
    silent_database,
    silent_databases,
)
from flowwarden_django.workflows import Workflow, advance, step, workflow_registry
from flowwarden_django.workflows.backends.memory import InMemorySnapshotStore
from flowwarden_django.workflows.execution import claim_keeper as keeper_module
from flowwarden_django.workflows.execution.claim_keeper import ClaimKeeper, HeldClaim

LEASE = timedelta(seconds=2)


def held(keeper: ClaimKeeper, using: str, unrenewed_for: float) -> HeldClaim:
    """A claim *keeper* holds (without its renewal thread), last renewed
    *unrenewed_for* seconds ago."""
    claim = HeldClaim(using, uuid.uuid4().hex, "runner", LEASE)
    claim.renewed_at = time.monotonic() - unrenewed_for
    keeper._claims[claim.key] = claim
    return claim


@pytest.fixture
def keeper(monkeypatch) -> ClaimKeeper:
    """The process's claim keeper, replaced by one whose claims the test sets."""
    fresh = ClaimKeeper()
    monkeypatch.setattr(keeper_module, "claim_keeper", fresh)
    return fresh


def test_a_claim_unrenewed_for_half_its_lease_makes_its_database_silent(keeper):
    held(keeper, "default", 0.2)
    assert silent_databases() == set()
    assert silent_database("default") is False
    held(keeper, "other", 1.5)  # 3/4 of the 2 s lease
    assert silent_databases() == {"other"}
    assert silent_database("other") and not silent_database("default")


class FakeTaskConsumer:
    """The parts of kombu's ``Consumer`` the gate uses."""

    def __init__(self, *names: str) -> None:
        self._queues = {name: SimpleNamespace(name=name) for name in names}
        self.active = set(names)
        self.consumes = 0

    @property
    def queues(self) -> list[Any]:
        return list(self._queues.values())

    def cancel_by_queue(self, name: str) -> None:
        self.active.discard(name)
        self._queues.pop(name, None)

    def consuming_from(self, name: str) -> bool:
        return name in self.active

    def add_queue(self, queue: Any) -> Any:
        self._queues[queue.name] = queue
        return queue

    def consume(self) -> None:
        self.active |= set(self._queues)
        self.consumes += 1


def test_the_gate_stops_consuming_while_a_database_is_silent_and_resumes_after(caplog):
    caplog.set_level(logging.INFO, logger="flowwarden_django.celery")
    silent: set[str] = set()
    tasks = FakeTaskConsumer("steps", "steps.wf.v2")
    gate = ConsumerGate(SimpleNamespace(task_consumer=tasks), silent=lambda: set(silent))
    gate.check()
    assert tasks.active == {"steps", "steps.wf.v2"} and gate.paused == []
    silent.add("default")
    gate.check()
    assert tasks.active == set() and [q.name for q in gate.paused] == ["steps", "steps.wf.v2"]
    gate.check()  # still silent: nothing more
    assert tasks.consumes == 0
    silent.clear()
    gate.check()
    assert tasks.active == {"steps", "steps.wf.v2"} and gate.paused == []
    assert tasks.consumes == 1
    said = [r.getMessage() for r in caplog.records]
    assert any("stops taking tasks from steps, steps.wf.v2" in line for line in said)
    assert any("takes tasks from steps, steps.wf.v2 again" in line for line in said)


def test_a_failing_look_is_logged_and_the_next_one_tries_again(caplog):
    def broken() -> set[str]:
        raise RuntimeError("boom")

    gate = ConsumerGate(SimpleNamespace(task_consumer=FakeTaskConsumer("q")), silent=broken)
    gate.check()
    assert "pausing or resuming the task consumer failed" in caplog.text


def test_the_bootstep_looks_on_the_consumer_s_timer_until_stopped():
    entries: list[Any] = []

    class Timer:
        def call_repeatedly(self, secs: float, fun: Any) -> Any:
            entry = SimpleNamespace(secs=secs, fun=fun, cancelled=False)
            entry.cancel = lambda: setattr(entry, "cancelled", True)
            entries.append(entry)
            return entry

    consumer = SimpleNamespace(timer=Timer(), task_consumer=FakeTaskConsumer("q"))
    step_ = SilentDatabaseBootstep(consumer)
    step_.start(consumer)
    ((entry,),) = [entries]
    assert entry.secs == silence.CHECK_INTERVAL and entry.fun == step_.gate.check
    step_.stop(consumer)
    assert entry.cancelled and step_.gate is None
    step_.shutdown(consumer)  # twice is harmless


@pytest.mark.parametrize(
    ("setting", "installed"),
    [({"WORKFLOW_EXECUTION": "celery"}, True), ({}, False)],
    ids=["celery", "in-process"],
)
def test_the_workers_of_a_celery_project_get_the_gate(setting, installed):
    app = Celery("fw-silence", broker="memory://", fixups=[], set_as_current=False)
    with override_settings(FLOWWARDEN=setting):
        install_from_settings(SimpleNamespace(app=app))
    assert (SilentDatabaseBootstep in app.steps["consumer"]) is installed
    app.close()


# -- the step task hands itself back ----------------------------------------------------


@step("a")
def step_a(state: str) -> Any:
    return advance(state + ":a")


@pytest.fixture
def silent_flow() -> Iterator[Any]:
    definition = Workflow.define("fw-silent", [step_a], InMemorySnapshotStore())
    yield definition
    workflow_registry.unregister("fw-silent")


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("fw-silent-steps", broker="memory://", fixups=[], set_as_current=False)
    app.sent = []  # type: ignore[attr-defined]
    app.send_task = lambda name, **options: app.sent.append((name, options))  # type: ignore[method-assign,attr-defined]
    yield app
    app.close()


def task_of(app: Celery, **request: Any) -> Any:
    fields = {"delivery_info": {"routing_key": "steps"}, "timelimit": (90, None), "retries": 0}
    return SimpleNamespace(app=app, request=SimpleNamespace(id="t1", **{**fields, **request}))


def test_a_step_task_on_a_worker_whose_database_is_silent_hands_itself_back(
    keeper, silent_flow, app
):
    """Before touching the database (no ``django_db`` mark here: a query would fail
    the test), the same message goes back to its queue."""
    held(keeper, "default", 1.5)
    outcome = run_step(
        task_of(app), "cid", workflow="fw-silent", version=1, head="h1", origin=Origin.NEXT
    )
    assert outcome == {
        "coordination_id": "cid",
        "workflow": "fw-silent",
        "status": "handed back",
        "queue": "steps",
    }
    ((name, options),) = app.sent
    assert (name, options["queue"], options["time_limit"]) == (STEP_TASK, "steps", 90)
    assert options["kwargs"] == {
        "coordination_id": "cid",
        "workflow": "fw-silent",
        "version": 1,
        "head": "h1",
        "origin": Origin.NEXT,
        "input": None,
        "handbacks": 1,
    }


def test_a_step_handed_back_keeps_its_hand_off(app):
    handoff = {"token": "tok", "head": None}
    task = task_of(app, **{HANDOFF_HEADER: handoff})
    provider_module._send_on(task, {"coordination_id": "cid", "handbacks": 3}, "steps")
    ((_, options),) = app.sent
    assert options["headers"] == {HANDOFF_HEADER: handoff}
    assert options["kwargs"]["handbacks"] == 4


@pytest.mark.django_db(transaction=True)
def test_a_step_handed_back_often_enough_runs_where_it_is(keeper, silent_flow, app):
    cid = uuid.uuid4().hex
    wf = silent_flow.workflow(cid)
    wf.seed("s")
    head = wf.run_record().head_snapshot_id
    held(keeper, "default", 1.5)
    outcome = run_step(
        task_of(app),
        cid,
        workflow="fw-silent",
        version=1,
        head=head,
        origin=Origin.RUN,
        handbacks=MAX_SILENT_HANDBACKS,
    )
    assert outcome["status"] != "handed back"
    assert wf.history()[-1].state == "s:a"


def test_the_gate_pauses_and_resumes_a_real_kombu_consumer():
    """On kombu's in-memory transport: no message is delivered while paused, and the
    one published meanwhile is delivered once the gate resumes."""
    from kombu import Connection, Exchange, Queue

    silent: set[str] = set()
    got: list[Any] = []
    queue = Queue("fw-gate", Exchange("fw-gate"), routing_key="fw-gate")
    with Connection("memory://") as connection:
        consumer = connection.Consumer([queue], callbacks=[lambda body, m: got.append(body)])
        consumer.consume()
        gate = ConsumerGate(SimpleNamespace(task_consumer=consumer), silent=lambda: set(silent))
        producer = connection.Producer()
        silent.add("default")
        gate.check()
        assert not consumer.consuming_from("fw-gate")
        producer.publish("held", exchange=queue.exchange, routing_key="fw-gate", declare=[queue])
        with pytest.raises(TimeoutError):
            connection.drain_events(timeout=0.2)
        assert got == []
        silent.clear()
        gate.check()
        assert consumer.consuming_from("fw-gate")
        connection.drain_events(timeout=5)
        assert got == ["held"]


@pytest.mark.parametrize("redelivered", [False, True], ids=["first-delivery", "redelivery"])
def test_a_handed_back_step_carries_the_hand_off_this_delivery_would_have_run_from(
    keeper, silent_flow, app, redelivered
):
    """A first delivery's copy may run from the hold (its head); a redelivery's copy
    carries the hold without its head, so it claims the run and reads the head, as the
    redelivery would have."""
    from flowwarden_django.workflows.execution.handoff import Handoff

    carried = {"id": "h1", "seq": 2, "state": "[]", "metadata": "{}"}
    handoff = Handoff("cid", "handoff:abc", 1, time.time(), head=carried)
    held(keeper, "default", 1.5)
    task = task_of(
        app,
        delivery_info={"routing_key": "steps", "redelivered": redelivered},
        **{HANDOFF_HEADER: handoff.as_dict()},
    )
    outcome = run_step(task, "cid", workflow="fw-silent", version=1, head="h1", origin="next")
    assert outcome["status"] == "handed back"
    ((_, options),) = app.sent
    copy = Handoff.from_dict(options["headers"][HANDOFF_HEADER], "cid")
    assert copy == (handoff.without_head() if redelivered else handoff)
