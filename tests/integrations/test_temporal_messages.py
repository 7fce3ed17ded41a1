"""Messages to runs on Temporal: a real dev server and ``flowwarden_temporal_worker``
subprocesses (the fixtures of ``test_temporal.py``); this process sends.

A run waiting for a message is paused inside its Temporal workflow (no activity is
held), on a durable timer when the wait has a timeout. A send wakes it once it
commits with a ``wake`` signal that carries no input, and the step after the wait
reads the message from its row: a forged wake that claims to be a message changes
nothing. A message sent before the wait is found by the step activity that makes the
run wait, and the workflow goes on without a signal; a wake lost after the commit is
made up for by the worker's recovery sweep.

A run that loops (``MESSAGE_LOOP``: ``listen`` → ``handle``, which jumps back to
``listen``, or waits itself with ``wait_for(..., to="handle")``) handles five
messages once each, in the order sent, whether they were sent before it first
waits, one at a time while it waits, or with repeated idempotency keys mixed in.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("temporalio", reason="the Temporal tests need temporalio")

from django.db import transaction

from flowwarden_django.integrations.temporal.messages import (
    EXPIRE_ACTIVITY,
    INPUT_REFUSED,
    STEP_ACTIVITY,
)
from flowwarden_django.models import WorkflowMessage, WorkflowRun
from flowwarden_django.workflows import Workflow
from flowwarden_django.workflows.definition.metadata import LAST_STEP
from flowwarden_django.workflows.waiting.messages.mailbox import store_message
from tests.integrations import test_temporal as on_server
from tests.integrations.test_temporal import (
    DB,
    history_event_types,
    on_temporal,
    raw_wake,
    steps_of,
    wait_for_status,
)
from tests.support import temporal_workflows as flows
from tests.support.messages import assert_handled_once_in_order, waits_with
from tests.support.step_log import assert_chained, executions
from tests.support.temporal_procs import (
    WAIT,
    DevServer,
    TemporalWorker,
    history,
    history_activities,
    wait_until,
)

# The fixtures of test_temporal.py (the dev server, its worker, the test workflows on
# this process's side), found by pytest under the same names here.
server = on_server.server
queue = on_server.queue
worker_env = on_server.worker_env
worker = on_server.worker
temporal = on_server.temporal
log = on_server.log


def new_cid() -> str:
    return f"listen-{uuid.uuid4().hex[:12]}"


def signals(server: DevServer, cid: str) -> list[dict[str, Any]]:
    """The ``wake`` signals run *cid*'s Temporal workflows got, oldest first: each
    one's name and its argument as sent (JSON)."""
    found = []
    for event in history(server, cid):
        if event.HasField("workflow_execution_signaled_event_attributes"):
            attributes = event.workflow_execution_signaled_event_attributes
            payloads = attributes.input.payloads
            wake = json.loads(payloads[0].data) if payloads else None
            found.append({"signal": attributes.signal_name, "wake": wake})
    return found


COMPLETED = "activity_task_completed_event_attributes"
FAILED = "activity_task_failed_event_attributes"


def events_of(server: DevServer, cid: str, kind: str) -> list[Any]:
    """The events of run *cid*'s Temporal history that have attributes *kind*."""
    return [e for e in history(server, cid) if e.HasField(kind)]


def wait_parked(server: DevServer, cid: str, worker: TemporalWorker) -> None:
    """Wait until the activities of ``LISTENING`` run *cid* that made it wait ("one",
    "listen") completed: the last looks at the mailbox once more before it ends (a
    message sent meanwhile is taken at once)."""
    wait_until(
        lambda: len(events_of(server, cid, COMPLETED)) == 2,
        WAIT,
        "the activity that made the run wait",
        [worker, server],
    )


def heard(cid: str) -> list[Any]:
    """What the steps after the run's waits got: ``{"id", "payload"}`` or ``None``."""
    final = Workflow.for_coordination(cid, using=DB).current_result()
    assert final is not None and final.status == "completed", final
    return final.final_state["heard"]


def got(message: Any) -> dict[str, Any]:
    return {"id": message.id, "payload": message.payload}


def mailbox(cid: str) -> list[WorkflowMessage]:
    return list(WorkflowMessage.objects.using(DB).filter(coordination_id=cid).order_by("id"))


def snapshot_after(cid: str, step: str) -> str:
    """The id of the snapshot step *step* of run *cid* saved (a wait's)."""
    history = Workflow.for_coordination(cid, using=DB).history()
    return next(s.id for s in history if s.metadata.get(LAST_STEP) == step)


class Rollback(Exception):
    pass


@on_temporal
def test_a_message_sent_before_the_wait_is_delivered_without_a_signal(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    """Sent in the transaction that starts the run: the step activity that makes the
    run wait finds it, and the workflow runs the next step with no signal but the
    start's."""
    cid = new_cid()
    with transaction.atomic(using=DB):
        temporal[flows.LISTENING].start({"log": log}, coordination_id=cid)
        sent = Workflow.for_coordination(cid, using=DB).send("go", {"n": 1}, sender="psp")
    wait_for_status(cid, ("completed",), [worker, server])
    assert heard(cid) == [got(sent)]
    assert steps_of(log, cid) == ["one", "listen", "heard"]
    assert_chained(Workflow.for_coordination(cid, using=DB), ["one", "listen", "heard"])
    assert [row.delivered_to for row in mailbox(cid)] == [snapshot_after(cid, "listen")]
    assert [s["wake"]["origin"] for s in signals(server, cid)] == ["run"]  # the start's
    assert Counter(history_activities(server, cid)) == {STEP_ACTIVITY: 3}


@on_temporal
def test_a_send_signals_a_wake_without_the_message_and_one_key_delivers_once(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    cid = temporal[flows.LISTENING].start({"log": log}).coordination_id
    record = wait_for_status(cid, ("waiting_message",), [worker, server])
    assert (record.waiting_topic, record.wake_at, record.runner) == ("go", None, "")
    wf = Workflow.for_coordination(cid, using=DB)
    with transaction.atomic(using=DB):
        first = wf.send("go", {"n": 1}, idempotency_key="k")
        again = wf.send("go", {"n": 2}, idempotency_key="k")
    assert again == first
    wait_for_status(cid, ("completed",), [worker, server])
    assert heard(cid) == [got(first)]
    assert [row.pk for row in mailbox(cid)] == [first.id]
    assert wf.send("go", {"n": 3}, idempotency_key="k") == first  # a repeat, even now
    assert steps_of(log, cid) == ["one", "listen", "heard"]
    # The send's wake names nothing of the message: the step read it from its row.
    _start, wake = signals(server, cid)
    assert wake["signal"] == "wake"
    assert (wake["wake"]["origin"], wake["wake"]["input"]) == ("run", None)
    assert set(wake["wake"]) <= {"origin", "input", "policy", "version"}


@on_temporal
def test_a_send_in_a_rolled_back_transaction_delivers_nothing(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    cid = temporal[flows.LISTENING].start({"log": log}).coordination_id
    wait_for_status(cid, ("waiting_message",), [worker, server])
    wf = Workflow.for_coordination(cid, using=DB)
    with pytest.raises(Rollback), transaction.atomic(using=DB):
        wf.send("go", {"n": 1})
        raise Rollback
    assert mailbox(cid) == []
    assert WorkflowRun.objects.using(DB).get(pk=cid).status == "waiting_message"
    assert len(signals(server, cid)) == 1  # the start's: nothing woke the run
    sent = wf.send("go", {"n": 2})
    wait_for_status(cid, ("completed",), [worker, server])
    assert heard(cid) == [got(sent)]
    assert [row.pk for row in mailbox(cid)] == [sent.id]


@on_temporal
def test_forged_and_hostile_wakes_never_deliver_a_message(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    """A wake sent by hand whose input claims to be a message runs the step activity,
    which finds no message and leaves the run waiting (the input dropped); one whose
    input the engine refuses is refused once, not retried, and dropped (issue 45).
    The send that follows is what the step gets."""
    cid = temporal[flows.LISTENING].start({"log": log}).coordination_id
    wait_for_status(cid, ("waiting_message",), [worker, server])
    # The waiting run's activities ("one", "listen") are in the history: the next is the
    # forged wake's.
    wait_parked(server, cid, worker)
    completed = 2
    raw_wake(server, cid, {"topic": "go", "payload": {"n": 666}, "id": 1})
    wait_until(
        lambda: len(events_of(server, cid, COMPLETED)) > completed,
        WAIT,
        "the forged wake's step activity",
        [worker, server],
    )
    raw_wake(server, cid, "a\x00b")
    wait_until(
        lambda: events_of(server, cid, FAILED),
        WAIT,
        "the refusal of the hostile wake",
        [worker, server],
    )
    record = WorkflowRun.objects.using(DB).get(pk=cid)
    assert (record.status, record.resume_input) == ("waiting_message", None)
    assert mailbox(cid) == []
    assert steps_of(log, cid) == ["one", "listen"]

    sent = Workflow.for_coordination(cid, using=DB).send("go", {"n": 1})
    wait_for_status(cid, ("completed",), [worker, server])
    assert heard(cid) == [got(sent)]
    failed = events_of(server, cid, FAILED)
    assert [
        e.activity_task_failed_event_attributes.failure.application_failure_info.type
        for e in failed
    ] == [INPUT_REFUSED]


@on_temporal
def test_a_timeout_wakes_the_run_by_a_durable_timer_with_no_message(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    cid = temporal[flows.LISTENING].start({"log": log, "timeout": 2.0}).coordination_id
    record = wait_for_status(cid, ("waiting_message",), [worker, server])
    deadline = record.wake_at
    assert deadline is not None
    # Nothing here or in the worker (--no-recovery) runs the sweep: the timer wakes it.
    # A liveness deadline (WAIT), not the wake latency.
    wait_for_status(cid, ("completed",), [worker, server])
    assert heard(cid) == [None]
    after = [e for e in executions(log) if e["cid"] == cid and e["step"] == "heard"]
    late = after[0]["at"] - deadline.timestamp()
    print(f"\n[temporal] a 2 s message timeout woke {late:.2f} s after it", file=sys.stderr)
    assert late >= 0  # not woken early; how late is a figure, not a pass/fail bound
    assert "TIMER_STARTED" in history_event_types(server, cid)
    assert EXPIRE_ACTIVITY in history_activities(server, cid)
    assert len(signals(server, cid)) == 1  # the start's
    # A message sent after the deadline is left for a later wait on its topic.
    assert steps_of(log, cid) == ["one", "listen", "heard"]


@on_temporal
def test_get_event_sees_the_events_a_step_sets(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    cid = temporal[flows.LISTENING].start({"log": log}).coordination_id
    wf = Workflow.for_coordination(cid, using=DB)
    assert wf.get_event("listening", timeout=WAIT) == {"step": "listen"}
    assert wf.get_event("heard") is None  # not set yet, and no wait asked for
    sent = wf.send("go", {"n": 1})
    assert wf.get_event("heard", timeout=WAIT) == got(sent)
    wait_for_status(cid, ("completed",), [worker, server])


@on_temporal
def test_several_messages_are_delivered_one_per_wait_in_order(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    """The first is sent before the run starts, the two others together while it waits
    at its second wait: each wait gets one, in the order sent."""
    cid = new_cid()
    with transaction.atomic(using=DB):
        temporal[flows.LISTENING_THRICE].start({"log": log}, coordination_id=cid)
        wf = Workflow.for_coordination(cid, using=DB)
        first = wf.send("go", {"n": 1})
    wait_until(
        lambda: wf.status() == "waiting_message" and wf.run_record().last_step == "listen2",
        WAIT,
        f"run {cid} at its second wait",
        [worker, server],
    )
    with transaction.atomic(using=DB):
        second = wf.send("go", {"n": 2})
        third = wf.send("go", {"n": 3})
    wait_for_status(cid, ("completed",), [worker, server])
    assert heard(cid) == [got(first), got(second), got(third)]
    waits = [snapshot_after(cid, name) for name in ("listen1", "listen2", "listen3")]
    assert [row.delivered_to for row in mailbox(cid)] == waits
    assert steps_of(log, cid) == ["one", "listen1", "listen2", "listen3", "heard"]


@on_temporal
def test_a_wake_lost_after_the_send_is_made_up_for_by_the_workers_sweep(
    temporal: Any,
    worker: TemporalWorker,
    server: DevServer,
    worker_env: dict[str, str],
    log: str,
    tmp_path: Path,
) -> None:
    """The message committed, and its wake was lost (a crash just after the commit):
    the recovery sweep of a worker finds the waiting run whose mailbox holds one and
    wakes it."""
    cid = temporal[flows.LISTENING].start({"log": log}).coordination_id
    wait_for_status(cid, ("waiting_message",), [worker, server])
    wait_parked(server, cid, worker)  # the insert comes after its last look
    # The send's insert alone, without the wake it makes once committed.
    row, created = store_message(cid, "go", {"n": 1}, idempotency_key=None, sender="", using=DB)
    assert created
    assert WorkflowRun.objects.using(DB).get(pk=cid).status == "waiting_message"
    sweeper = TemporalWorker(
        worker_env, tmp_path / "sweeper.log", ("--recover-every", "0.5"), name="the sweeper"
    )
    try:
        wait_for_status(cid, ("completed",), [worker, sweeper, server])
    finally:
        sweeper.kill()
    assert heard(cid) == [{"id": row.pk, "payload": {"n": 1}}]
    assert [s["wake"]["origin"] for s in signals(server, cid)] == ["run", "recover"]


# -- a run that handles messages in a loop ---------------------------------------------


def item(n: int) -> dict[str, Any]:
    return {"n": n}


PAYLOADS = [item(n) for n in range(1, flows.LOOP_TIMES + 1)]


def loop_steps(wait_in_handle: bool = False) -> list[str]:
    if wait_in_handle:
        return ["listen", *["handle"] * flows.LOOP_TIMES]
    return ["listen", "handle"] * flows.LOOP_TIMES


def assert_looped(cid: str, log: str, steps: list[str]) -> None:
    """The run handled the five payloads once each, in order (see
    ``assert_handled_once_in_order``), each step ran once, and each ``handle`` got
    the next message of the mailbox."""
    rows = mailbox(cid)
    assert_handled_once_in_order(Workflow.for_coordination(cid, using=DB), rows, PAYLOADS, steps)
    ran = [e for e in executions(log) if e["cid"] == cid]
    assert [e["step"] for e in ran] == steps
    assert [e["message"] for e in ran if e["step"] == "handle"] == [row.pk for row in rows]


@on_temporal
def test_a_loop_handles_five_messages_sent_before_it_first_waits_in_order(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    """Sent in the transaction that starts the run: each wait's step activity finds
    the next one in the mailbox."""
    cid = new_cid()
    with transaction.atomic(using=DB):
        temporal[flows.MESSAGE_LOOP].start({"log": log}, coordination_id=cid)
        wf = Workflow.for_coordination(cid, using=DB)
        for payload in PAYLOADS:
            wf.send("item", payload)
    wait_for_status(cid, ("completed",), [worker, server])
    assert_looped(cid, log, loop_steps())


@on_temporal
@pytest.mark.parametrize("wait_in_handle", [False, True], ids=["jump-then-wait", "wait-to"])
def test_a_loop_handles_five_messages_sent_one_at_a_time_while_it_waits_in_order(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str, wait_in_handle: bool
) -> None:
    state = {"log": log, "wait_in_handle": wait_in_handle}
    cid = temporal[flows.MESSAGE_LOOP].start(state).coordination_id
    wf = Workflow.for_coordination(cid, using=DB)
    for n, payload in enumerate(PAYLOADS):
        wait_until(
            lambda n=n: waits_with(DB, cid, n), WAIT, f"run {cid} at wait {n + 1}", [worker, server]
        )
        wf.send("item", payload)
    wait_for_status(cid, ("completed",), [worker, server])
    assert_looped(cid, log, loop_steps(wait_in_handle))


@on_temporal
def test_a_loop_delivers_each_message_once_with_repeated_idempotency_keys_mixed_in(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    """Two messages (each sent twice) in the transaction that starts the run; the
    three others one at a time while it waits, each followed by a repeat of itself
    and of the one before (already handled). A repeat carries another payload: it
    stores nothing, and no wait gets it."""
    cid = new_cid()

    def send(n: int, repeat: bool = False) -> Any:
        wf = Workflow.for_coordination(cid, using=DB)
        return wf.send("item", item(-n if repeat else n), idempotency_key=f"item-{n}")

    with transaction.atomic(using=DB):
        temporal[flows.MESSAGE_LOOP].start({"log": log}, coordination_id=cid)
        sent = {n: send(n) for n in (1, 2)}
        assert send(1, repeat=True) == sent[1] and send(2, repeat=True) == sent[2]
    for n in (3, 4, 5):
        wait_until(
            lambda n=n: waits_with(DB, cid, n - 1), WAIT, f"run {cid} at wait {n}", [worker, server]
        )
        sent[n] = send(n)
        assert send(n, repeat=True) == sent[n]
        assert send(n - 1, repeat=True) == sent[n - 1]
    wait_for_status(cid, ("completed",), [worker, server])
    assert [row.pk for row in mailbox(cid)] == [sent[n].id for n in range(1, 6)]
    assert_looped(cid, log, loop_steps())
