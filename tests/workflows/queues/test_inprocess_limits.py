"""Queue limits with the in-process provider on PostgreSQL, from many threads: the
steps' own start and end times say how many ran at once and how fast they started."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings

from flowwarden_django.models import WorkflowQueueSlot, WorkflowRun
from flowwarden_django.workflows import workflow_registry
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.queues import slots
from tests.support import queue_workflows, step_log
from tests.support.lanes import lane_marks
from tests.support.polling import wait_until

DB = "postgres"
pytestmark = lane_marks("postgres", databases=[DB])


@pytest.fixture
def queued(tmp_path: Path) -> Any:
    slots.forget_made()
    definition = queue_workflows.define(OrmSnapshotStore(using=DB), using=DB)
    yield definition
    workflow_registry.unregister(queue_workflows.NAME)
    slots.forget_made()


def start_from_threads(
    definition: Any, states: list[dict[str, Any]], threads: int, **placing: Any
) -> list[str]:
    """Start a run of each state from *threads* threads, each taking the next."""
    cids: list[str] = []
    lock = threading.Lock()
    pending = list(states)

    def work() -> None:
        try:
            while True:
                with lock:
                    if not pending:
                        return
                    state = pending.pop(0)
                started = definition.start(state, **placing)
                with lock:
                    cids.append(started.coordination_id)
        finally:
            connections.close_all()

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return cids


def all_completed(cids: list[str]) -> bool:
    done = WorkflowRun.objects.using(DB).filter(pk__in=cids, status="completed").count()
    return done == len(cids)


@pytest.mark.quiet  # "reached" is measured from the steps' own clocks
def test_concurrency_4_holds_from_8_threads_and_is_reached(queued: Any, tmp_path: Path) -> None:
    log = str(tmp_path / "steps.log")
    queues = {"carrier": {"concurrency": 4}}
    with override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": queues}):
        states = [{"log": log, "ms": 200, "n": n} for n in range(40)]
        cids = start_from_threads(queued, states, 8, queue="carrier")
        wait_until(lambda: all_completed(cids), "every run completed", timeout=120)
    executions = step_log.executions(log)
    assert len(executions) == 120
    assert queue_workflows.most_at_once(executions) == 4
    held = WorkflowQueueSlot.objects.using(DB).filter(queue="carrier").exclude(token="")
    # A step's slot is given back once its run's record is saved: just after the last
    # run reads completed.
    wait_until(lambda: not held.filter(token__startswith="run:").exists(), "every slot given back")


@pytest.mark.quiet  # step starts are stamped in the steps: a loaded machine delays some
def test_rate_20_per_second_holds_in_every_window_and_is_reached(
    queued: Any, tmp_path: Path
) -> None:
    log = str(tmp_path / "steps.log")
    queues = {"api": {"rate": "20/s"}}
    with override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": queues}):
        # 100 runs of 3 steps: a backlog of 300 starts, more than 10 s of the rate.
        states = [{"log": log, "ms": 0, "n": n} for n in range(100)]
        cids = start_from_threads(queued, states, 4, queue="api")
        wait_until(lambda: all_completed(cids), "every run completed", timeout=120)
    executions = step_log.executions(log)
    assert len(executions) == 300
    first = min(e["start"] for e in executions)
    in_ten = [e for e in executions if e["start"] < first + 10.0]
    figures = (
        f"most in 1 s: {queue_workflows.most_starts_in(executions, 1.0)}, in 10 s: {len(in_ten)}"
    )
    print(f"\nqueues [in-process, rate 20/s]: {figures}")
    assert queue_workflows.most_starts_in(executions, 1.0) <= 20, figures
    assert 180 <= len(in_ten) <= 220, figures


def test_a_step_that_begins_late_holds_its_rate_slot_from_its_beginning(
    queued: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first step gets going 0.4 s after its admission (a loaded process), the
    next at once: the rate slot is held for the period from the first step's
    beginning, so the second begins at least a period after it (at 1/s)."""
    from flowwarden_django.workflows.queues.gate import StepGate

    log = str(tmp_path / "steps.log")
    admit = StepGate.before_step
    admitted = []

    def late_once(gate: StepGate, head: Any) -> Any:
        refused = admit(gate, head)
        if refused is None:
            admitted.append(gate.spent)
            if len(admitted) == 1:
                time.sleep(0.4)
        return refused

    monkeypatch.setattr(StepGate, "before_step", late_once)
    with override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": {"api": {"rate": "1/s"}}}):
        cid = queued.start({"log": log, "ms": 0, "n": 0}, queue="api").coordination_id
        wait_until(lambda: all_completed([cid]), "the run completed", timeout=60)
    starts = [e["start"] for e in step_log.executions(log)]
    assert len(starts) == 3 and all(spent is not None for spent in admitted), admitted
    assert starts[1] - starts[0] >= 1.0, starts
    assert starts[2] - starts[1] >= 1.0, starts


def test_every_waiting_priority_1_step_starts_before_any_waiting_priority_5_step(
    queued: Any, tmp_path: Path
) -> None:
    log = str(tmp_path / "steps.log")
    queues = {"carrier": {"concurrency": 1, "priority": True}}
    with override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": queues}):
        # A run holds the only slot for a while, so the others queue up behind it.
        blocker = threading.Thread(
            target=lambda: queued.start({"log": log, "ms": 1500, "n": "blocker"}, queue="carrier")
        )
        blocker.start()
        held = WorkflowQueueSlot.objects.using(DB).filter(queue="carrier", token__startswith="run:")
        wait_until(held.exists, "the blocker holds the slot")
        cids = {}
        for n in range(20):
            priority = 5 if n % 2 == 0 else 1
            started = queued.start(
                {"log": log, "ms": 0, "n": n}, queue="carrier", priority=priority
            )
            cids[started.coordination_id] = priority
        waiting = WorkflowRun.objects.using(DB).filter(pk__in=list(cids), status="waiting_slot")
        assert waiting.count() == 20  # the backlog: all of them wait
        blocker.join()
        wait_until(lambda: all_completed(list(cids)), "every run completed", timeout=60)
    executions = [e for e in step_log.executions(log) if e["cid"] in cids]
    assert len(executions) == 60
    first = [e["start"] for e in executions if cids[e["cid"]] == 1]
    later = [e["start"] for e in executions if cids[e["cid"]] == 5]
    assert max(first) < min(later)
