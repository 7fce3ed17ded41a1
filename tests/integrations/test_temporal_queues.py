"""Queue limits on Temporal: a real dev server, ``flowwarden_temporal_worker``
subprocesses that can run 8 steps at once, the real database (the fixtures of
``test_temporal.py``); this process starts the runs.

A step that finds no free slot parks its run (``waiting_slot``): its activity ends
at once, and the run's Temporal workflow waits for a ``wake`` signal holding no
activity. A step that gives its slot back hands it to the first waiting run and
signals that run's workflow (a ``dispatch`` wake), whose next step activity finds
the slot given to it. The worker's recovery sweep hands slots out too, to runs that
wait with nobody left to wake them.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

pytest.importorskip("temporalio", reason="the Temporal tests need temporalio")

from django.db import connections
from django.test import override_settings
from django.utils import timezone

from flowwarden_django.integrations.temporal.config import TemporalConfig
from flowwarden_django.integrations.temporal.messages import (
    STEP_ACTIVITY,
    RunStart,
    StepPolicy,
    Wake,
)
from flowwarden_django.integrations.temporal.provider import TemporalExecutionProvider
from flowwarden_django.models import WorkflowQueueSlot, WorkflowRun
from flowwarden_django.workflows import Workflow, advance, step
from flowwarden_django.workflows.backends.memory import InMemorySnapshotStore
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.definition.registry import workflow_registry
from flowwarden_django.workflows.execution.providers import reset_providers
from flowwarden_django.workflows.queues import slots
from tests.integrations import test_temporal as on_server
from tests.integrations.test_temporal import DB, on_temporal, wait_for_status
from tests.support import queue_workflows, step_log
from tests.support.temporal_procs import (
    WAIT,
    DevServer,
    TemporalWorker,
    history,
    history_activities,
    wait_until,
)

# The fixtures of test_temporal.py (the dev server, the task queue, the workers'
# environment), found by pytest under the same names here.
server = on_server.server
queue = on_server.queue
worker_env = on_server.worker_env

#: The queues, in the workers and in this process.
QUEUES = {"carrier": {"concurrency": 4}, "swept": {"concurrency": 2}}
#: Activities each worker runs at once: more than the queue's concurrency, so the
#: limit observed is the queue's.
WORKER_STEPS = "8"


def queue_env(worker_env: dict[str, str]) -> dict[str, str]:
    return {**worker_env, "FLOWWARDEN_TEMPORAL_WORKFLOW_QUEUES": json.dumps(QUEUES)}


@pytest.fixture(scope="module")
def worker(
    worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TemporalWorker]:
    """A worker without the recovery sweep: what hands slots out here is a step that
    gives its slot back (or a run that parks)."""
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    process = TemporalWorker(
        queue_env(worker_env), log, ("--concurrency", WORKER_STEPS, "--no-recovery")
    )
    yield process
    process.kill()


@pytest.fixture
def queued(server: DevServer, queue: str) -> Iterator[Any]:
    """This process on Temporal with the queues; ``queued`` defined on ``postgres``."""
    setting = {
        "WORKFLOW_EXECUTION": "temporal",
        "TEMPORAL": {"TARGET": server.target, "TASK_QUEUE": queue, "HEARTBEAT_TIMEOUT": "2s"},
        "WORKFLOW_QUEUES": QUEUES,
    }
    reset_providers()
    with queue_workflows.quiet_queues():
        definition = queue_workflows.define(OrmSnapshotStore(using=DB), using=DB)
        with override_settings(FLOWWARDEN=setting):
            yield definition
        workflow_registry.unregister(queue_workflows.NAME)
    reset_providers()
    connections[DB].close()


def completed(cids: list[str]) -> bool:
    done = WorkflowRun.objects.using(DB).filter(pk__in=cids, status="completed").count()
    return done == len(cids)


def held(name: str) -> list[str]:
    """The tokens of the slots of queue *name* still held."""
    rows = WorkflowQueueSlot.objects.using(DB).filter(queue=name).exclude(token="")
    return list(rows.values_list("token", flat=True))


def wakes(server: DevServer, cid: str) -> list[tuple[str, int]]:
    """The ``wake`` signals run *cid*'s Temporal workflows got: each one's origin, and
    how many activities of the workflow were open (scheduled, not ended) then."""
    found, open_ = [], 0
    for event in history(server, cid):
        if event.HasField("activity_task_scheduled_event_attributes"):
            open_ += 1
        elif any(event.HasField(f"activity_task_{end}_event_attributes") for end in ENDS):
            open_ -= 1
        elif event.HasField("workflow_execution_signaled_event_attributes"):
            payloads = event.workflow_execution_signaled_event_attributes.input.payloads
            found.append((json.loads(payloads[0].data)["origin"] if payloads else "", open_))
    return found


#: How an activity ends, in the names of the history's event attributes.
ENDS = ("completed", "failed", "timed_out", "canceled")


@on_temporal
@pytest.mark.quiet  # "at once" is measured from the steps' own clocks
def test_40_runs_on_a_queue_of_4_run_4_steps_at_once_on_an_8_step_worker(
    queued: Any, worker: TemporalWorker, server: DevServer, tmp_path: Path
) -> None:
    log = str(tmp_path / "steps.log")
    # Steps long beside the hand-over from one run to the next (a workflow task, a
    # dispatch, an activity: up to a few hundred ms on a loaded machine), so that the
    # four slots' steps overlap at some moment.
    cids = [
        queued.start({"log": log, "ms": 500, "n": n}, queue="carrier").coordination_id
        for n in range(40)
    ]
    wait_until(lambda: completed(cids), 2 * WAIT, "every run completed", [worker, server])
    executions = step_log.executions(log)
    assert Counter(e["step"] for e in executions) == {"one": 40, "two": 40, "three": 40}
    assert queue_workflows.most_at_once(executions) == 4
    # Every slot is given back (the last one just after its run completed).
    wait_until(lambda: not held("carrier"), WAIT, "every slot given back", [worker, server])
    # Runs waited: each wait is one short step activity that parked the run, then a
    # "dispatch" wake from the step that handed it a slot, which its next step
    # activity found: at most one wait per step.
    activities = {cid: history_activities(server, cid).count(STEP_ACTIVITY) for cid in cids}
    assert max(activities.values()) <= 6, activities
    parked = [cid for cid in cids if activities[cid] > 3]
    assert parked, "no run waited for a slot"
    dispatched = [
        opened for cid in parked for origin, opened in wakes(server, cid) if origin == "dispatch"
    ]
    assert dispatched and len(dispatched) >= len(parked)
    # A waiting run holds no activity: its wake finds none open (unless its own last
    # step activity was still ending as the slot was handed to it).
    assert 0 in dispatched


@on_temporal
def test_without_a_queue_the_same_worker_runs_more_than_4_steps_at_once(
    queued: Any, worker: TemporalWorker, server: DevServer, tmp_path: Path
) -> None:
    """The control of the test above: its limit is the queue's, not the worker's.
    (Steps of 1 s: started together, they overlap however slowly the machine is.)"""
    log = str(tmp_path / "steps.log")
    cids = [queued.start({"log": log, "ms": 1000}).coordination_id for _ in range(16)]
    wait_until(lambda: completed(cids), 2 * WAIT, "every run completed", [worker, server])
    assert queue_workflows.most_at_once(step_log.executions(log)) > 4


@on_temporal
def test_the_workers_recovery_sweep_hands_a_slot_to_a_run_nobody_wakes(
    queued: Any,
    worker: TemporalWorker,
    server: DevServer,
    worker_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """Both slots are held by a holder that is gone (for an hour), so the run parks;
    freed in the database behind everybody's back, nothing hands them out but a
    worker's recovery sweep (``recover_stalled_runs`` → ``dispatch_waiting``)."""
    slots.ensure(DB, "swept", "", slots.CONCURRENCY, 2)
    gone = {"holder": "gone", "held_until": timezone.now() + timedelta(hours=1)}
    for row in WorkflowQueueSlot.objects.using(DB).filter(queue="swept"):
        WorkflowQueueSlot.objects.using(DB).filter(pk=row.pk).update(
            **gone, token=f"run:{uuid.uuid4().hex}"
        )
    log = str(tmp_path / "steps.log")
    cid = queued.start({"log": log, "ms": 0}, queue="swept").coordination_id
    wait_for_status(cid, ("waiting_slot",), [worker, server])
    WorkflowQueueSlot.objects.using(DB).filter(queue="swept").update(
        holder="", token="", held_until=None
    )
    # Nothing hands them out: no step of the queue ends, and the worker's timer is
    # set for the gone holder's lease end, an hour away.
    assert WorkflowRun.objects.using(DB).get(pk=cid).status == "waiting_slot"
    sweeper = TemporalWorker(
        queue_env(worker_env),
        tmp_path / "sweeper.log",
        ("--concurrency", WORKER_STEPS, "--recover-every", "0.5"),
        name="the sweeping worker",
    )
    try:
        wait_for_status(cid, ("completed",), [worker, sweeper, server])
    finally:
        sweeper.kill()
    assert [e["step"] for e in step_log.executions(log)] == ["one", "two", "three"]
    assert [origin for origin, _ in wakes(server, cid)] == ["run", "dispatch"]


# -- without a server ----------------------------------------------------------------


class FakeRun:
    """What ``continue_running`` reads of a workflow: its run record."""

    def __init__(self, status: str) -> None:
        self.coordination_id = "dispatched-1"
        self.record = SimpleNamespace(
            coordination_id="dispatched-1",
            status=status,
            workflow_name="fw-temporal-dispatched",
            workflow_version=1,
            last_step="",
        )

    def run_record(self) -> Any:
        return self.record

    def seed(self, initial_state: Any = None) -> Any:
        raise AssertionError("continuing a dispatched run claimed it (seed)")


@pytest.mark.parametrize("status", ["running", "waiting_slot", "cancelled"])
def test_continuing_a_dispatched_run_sends_a_dispatch_wake_and_claims_nothing(
    status: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``dispatch`` wake (only for a run still ``running``), with how to schedule
    its next step; no claim of the run (``seed``), which its own step activity may be
    claiming at this moment."""

    @step("only")
    def only(state: Any) -> Any:
        return advance(state)

    Workflow.define("fw-temporal-dispatched", [only], InMemorySnapshotStore())
    provider = TemporalExecutionProvider(TemporalConfig(task_queue="q", step_timeout=7))
    sent: list[tuple[RunStart, Wake]] = []
    monkeypatch.setattr(provider, "wake", lambda start, wake: sent.append((start, wake)))
    try:
        provider.continue_running(cast(Any, FakeRun(status)))
    finally:
        workflow_registry.unregister("fw-temporal-dispatched")
    if status != "running":
        assert sent == []
        return
    ((start, wake),) = sent
    assert (start.coordination_id, start.workflow, start.step_timeout) == (
        "dispatched-1",
        "fw-temporal-dispatched",
        7,
    )
    assert wake == Wake("dispatch", policy=StepPolicy(0, 0.1, None), version=1)
