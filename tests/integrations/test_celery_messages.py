"""Messages to runs on Celery: a real worker (``tests/support/celery_workflows.py``'s
``LISTENING`` workflow, on the PostgreSQL test database and a Redis broker, as in
``test_celery_workflows.py``) runs the steps; this process sends.

A send wakes the waiting run once it commits by queueing its next step (no task is
held while it waits); a send rolled back with the caller's transaction delivers
nothing; two sends with one key deliver one message; several messages sent before the
wait are kept; a timeout is woken by the workers' sweep and the step after the wait
gets ``ctx.message is None``. A run that loops (``MESSAGE_LOOP``: ``listen`` →
``handle``, which jumps back) handles five messages once each, in the order sent,
whether they were sent before it first waits, one at a time while it waits, or with
repeated idempotency keys mixed in.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("celery", reason="the Celery tests need celery")
pytest.importorskip("redis", reason="the Celery workflow tests need redis-py")

from celery import Celery
from django.db import transaction
from django.test import override_settings

from flowwarden_django.integrations.celery.provider import CeleryExecutionProvider
from flowwarden_django.models import WorkflowMessage
from flowwarden_django.workflows import (
    Completed,
    RunStatus,
    Workflow,
    WorkflowDefinition,
    workflow_registry,
)
from flowwarden_django.workflows.execution.providers import reset_providers
from tests.support import celery_workflows as flows
from tests.support.celery_procs import CeleryWorker as Worker
from tests.support.celery_procs import wait_until
from tests.support.celery_workflow_settings import transport_options
from tests.support.lanes import lane_marks
from tests.support.messages import assert_handled_once_in_order, waits_with
from tests.support.step_log import assert_chained, executions

DB = "postgres"
#: Upper bound of the waits: a hang fails the test instead of blocking CI.
WAIT = 60.0
SOLO = ["--pool=solo"]

pytestmark = [*lane_marks("postgres", databases=["default", DB]), pytest.mark.lane("redis")]


@pytest.fixture(autouse=True)
def _fresh_providers() -> Iterator[None]:
    reset_providers()
    yield
    reset_providers()


@pytest.fixture
def provider(broker_url: str, queue: str) -> Iterator[CeleryExecutionProvider]:
    """The provider this process queues steps with (an app on the test's queue)."""
    app = Celery("fw-msg-producer", broker=broker_url, fixups=[], set_as_current=False)
    app.conf.task_default_queue = queue
    app.conf.broker_transport_options = transport_options(queue)
    with override_settings(FLOWWARDEN={"WORKFLOW_EXECUTION": CeleryExecutionProvider(app=app)}):
        yield
    app.close()


@pytest.fixture
def listening() -> Iterator[WorkflowDefinition]:
    defined = flows.define_workflows(DB)
    yield defined[flows.LISTENING]
    for name in defined:
        workflow_registry.unregister(name)


@pytest.fixture
def message_loop() -> Iterator[WorkflowDefinition]:
    defined = flows.define_workflows(DB)
    yield defined[flows.MESSAGE_LOOP]
    for name in defined:
        workflow_registry.unregister(name)


def new_state(tmp_path: Path, **more: Any) -> dict[str, Any]:
    return {"log": str(tmp_path / "steps.log"), "trail": [], **more}


def status_is(wf: Workflow, status: str, worker: Worker) -> None:
    wait_until(lambda: wf.status() == status, WAIT, f"run {wf.coordination_id} {status}", worker)


class Rollback(Exception):
    pass


@pytest.mark.usefixtures("provider")
def test_a_send_wakes_a_waiting_run_through_the_workers_once_it_commits(
    listening: WorkflowDefinition,
    start_worker: Callable[..., Worker],
    tmp_path: Path,
    redis_client: Any,
    queue: str,
):
    worker = start_worker(SOLO, execution="celery")
    state = new_state(tmp_path)
    cid = f"listen-{uuid.uuid4().hex[:12]}"
    wf = listening.workflow(cid)
    wf.run(state)
    status_is(wf, RunStatus.WAITING_MESSAGE, worker)
    assert wf.run_record().waiting_topic == "go"
    wait_until(lambda: redis_client.llen(queue) == 0, WAIT, "an empty queue", worker)

    with pytest.raises(Rollback), transaction.atomic(using=DB):
        wf.send("go", {"n": 0})
        raise Rollback
    assert not WorkflowMessage.objects.using(DB).filter(coordination_id=cid).exists()
    assert wf.status() == RunStatus.WAITING_MESSAGE

    with transaction.atomic(using=DB):
        first = wf.send("go", {"n": 1}, idempotency_key="k")
        again = wf.send("go", {"n": 2}, idempotency_key="k")
    assert again == first
    status_is(wf, RunStatus.COMPLETED, worker)
    final = {**state, "trail": ["one", "listen", "heard"], "heard": {"n": 1}}
    assert wf.current_result() == Completed(final, cid)
    assert [e["step"] for e in executions(state["log"])] == ["one", "listen", "heard"]
    assert_chained(wf, ["one", "listen", "heard"])
    rows = WorkflowMessage.objects.using(DB).filter(coordination_id=cid)
    assert [(row.pk, row.delivered_to is not None) for row in rows] == [(first.id, True)]


@pytest.mark.usefixtures("provider")
def test_messages_sent_before_the_wait_are_kept_for_it(
    listening: WorkflowDefinition, start_worker: Callable[..., Worker], tmp_path: Path
):
    state = new_state(tmp_path)
    cid = f"listen-{uuid.uuid4().hex[:12]}"
    wf = listening.workflow(cid)
    wf.run(state)  # queued: no worker yet, the run exists and has not waited
    first = wf.send("go", {"n": 1})
    wf.send("go", {"n": 2})
    worker = start_worker(SOLO, execution="celery")
    status_is(wf, RunStatus.COMPLETED, worker)
    assert wf.current_result().final_state["heard"] == {"n": 1}
    rows = list(WorkflowMessage.objects.using(DB).filter(coordination_id=cid).order_by("id"))
    assert [(row.pk == first.id, row.delivered_to is not None) for row in rows] == [
        (True, True),
        (False, False),  # kept for a later wait on "go"
    ]


@pytest.mark.usefixtures("provider")
def test_a_timeout_is_woken_by_the_workers_sweep_with_no_message(
    listening: WorkflowDefinition, start_worker: Callable[..., Worker], tmp_path: Path
):
    worker = start_worker(SOLO, execution="celery")  # which runs the workers' sweep
    state = new_state(tmp_path, timeout=2.0)
    cid = f"listen-{uuid.uuid4().hex[:12]}"
    wf = listening.workflow(cid)
    wf.run(state)
    status_is(wf, RunStatus.WAITING_MESSAGE, worker)
    deadline = wf.run_record().wake_at
    assert deadline is not None
    status_is(wf, RunStatus.COMPLETED, worker)
    assert wf.current_result().final_state["heard"] is None
    after = wf.history()[-1]
    late = (after.created_at - deadline).total_seconds()
    print(f"\n[celery] a 2 s message timeout woke {late:.2f} s after its deadline", file=sys.stderr)
    assert late >= 0  # not woken early; how late is a figure, not a pass/fail bound


@pytest.mark.usefixtures("provider")
def test_get_event_sees_the_events_the_workers_steps_set(
    listening: WorkflowDefinition, start_worker: Callable[..., Worker], tmp_path: Path
):
    worker = start_worker(SOLO, execution="celery")
    cid = f"listen-{uuid.uuid4().hex[:12]}"
    wf = listening.workflow(cid)
    wf.run(new_state(tmp_path))
    reader = Workflow.for_coordination(cid, using=DB)
    assert reader.get_event("listening", timeout=WAIT) == {"step": "listen"}
    assert reader.get_event("heard") is None  # not set yet, and no wait asked for
    sent = reader.send("go", {"n": 1})
    assert reader.get_event("heard", timeout=WAIT) == {"id": sent.id, "n": 1}
    status_is(wf, RunStatus.COMPLETED, worker)


# -- a run that handles messages in a loop ---------------------------------------------


def item(n: int) -> dict[str, Any]:
    return {"n": n}


PAYLOADS = [item(n) for n in range(1, flows.LOOP_TIMES + 1)]


def mailbox(cid: str) -> list[WorkflowMessage]:
    return list(WorkflowMessage.objects.using(DB).filter(coordination_id=cid).order_by("id"))


def assert_looped(wf: Workflow, state: dict[str, Any], steps: list[str]) -> None:
    """The run handled the five payloads once each, in order (see
    ``assert_handled_once_in_order``), each step task ran once, and each ``handle``
    got the next message of the mailbox."""
    rows = mailbox(wf.coordination_id)
    assert_handled_once_in_order(wf, rows, PAYLOADS, steps)
    ran = executions(state["log"])
    assert [e["step"] for e in ran] == steps
    assert [e["message"] for e in ran if e["step"] == "handle"] == [row.pk for row in rows]


def loop_steps(wait_in_handle: bool = False) -> list[str]:
    if wait_in_handle:
        return ["listen", *["handle"] * flows.LOOP_TIMES]
    return ["listen", "handle"] * flows.LOOP_TIMES


@pytest.mark.usefixtures("provider")
def test_a_loop_handles_five_messages_sent_before_it_first_waits_in_order(
    message_loop: WorkflowDefinition, start_worker: Callable[..., Worker], tmp_path: Path
):
    state = new_state(tmp_path)
    cid = f"loop-{uuid.uuid4().hex[:12]}"
    wf = message_loop.workflow(cid)
    wf.run(state)  # queued: no worker yet, the run exists and has not waited
    for payload in PAYLOADS:
        wf.send("item", payload)
    worker = start_worker(SOLO, execution="celery")
    status_is(wf, RunStatus.COMPLETED, worker)
    assert_looped(wf, state, loop_steps())


@pytest.mark.usefixtures("provider")
@pytest.mark.parametrize("wait_in_handle", [False, True], ids=["jump-then-wait", "wait-to"])
def test_a_loop_handles_five_messages_sent_one_at_a_time_while_it_waits_in_order(
    message_loop: WorkflowDefinition,
    start_worker: Callable[..., Worker],
    tmp_path: Path,
    wait_in_handle: bool,
):
    """``handle`` jumps back to ``listen``, which waits; or (``wait-to``) it waits
    itself with ``wait_for(..., to="handle")``."""
    worker = start_worker(SOLO, execution="celery")
    state = new_state(tmp_path, wait_in_handle=wait_in_handle)
    cid = f"loop-{uuid.uuid4().hex[:12]}"
    wf = message_loop.workflow(cid)
    wf.run(state)
    for n, payload in enumerate(PAYLOADS):
        wait_until(lambda n=n: waits_with(DB, cid, n), WAIT, f"run {cid} at wait {n + 1}", worker)
        wf.send("item", payload)
    status_is(wf, RunStatus.COMPLETED, worker)
    assert_looped(wf, state, loop_steps(wait_in_handle))


@pytest.mark.usefixtures("provider")
def test_a_loop_delivers_each_message_once_with_repeated_idempotency_keys_mixed_in(
    message_loop: WorkflowDefinition, start_worker: Callable[..., Worker], tmp_path: Path
):
    """Two messages (each sent twice) before the run first waits; the three others one
    at a time while it waits, each followed by a repeat of itself and of the one
    before (already handled). A repeat carries another payload: it stores nothing and
    no wait gets it."""
    state = new_state(tmp_path)
    cid = f"loop-{uuid.uuid4().hex[:12]}"
    wf = message_loop.workflow(cid)

    def send(n: int, repeat: bool = False) -> Any:
        return wf.send("item", item(-n if repeat else n), idempotency_key=f"item-{n}")

    wf.run(state)  # queued: no worker yet
    sent = {n: send(n) for n in (1, 2)}
    assert send(1, repeat=True) == sent[1] and send(2, repeat=True) == sent[2]
    worker = start_worker(SOLO, execution="celery")
    for n in (3, 4, 5):
        wait_until(lambda n=n: waits_with(DB, cid, n - 1), WAIT, f"run {cid} at wait {n}", worker)
        sent[n] = send(n)
        assert send(n, repeat=True) == sent[n]
        assert send(n - 1, repeat=True) == sent[n - 1]
    status_is(wf, RunStatus.COMPLETED, worker)
    assert [row.pk for row in mailbox(cid)] == [sent[n].id for n in range(1, 6)]
    assert_looped(wf, state, loop_steps())
