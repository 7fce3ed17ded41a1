"""Partitioned queues (the limits hold per ``partition_key``), ``scope: "runs"`` (a slot
held for a run's whole stay in ``running``), and waits that hold no slot: in-process
on PostgreSQL, measured from the steps' own start and end times."""

from __future__ import annotations

import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings

from flowwarden_django.models import WorkflowQueueSlot, WorkflowRun
from flowwarden_django.workflows import StepContext, Workflow, advance, sleep, workflow_registry
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.queues import slots
from tests.support import queue_workflows, step_log
from tests.support.lanes import lane_marks
from tests.support.polling import wait_until

DB = "postgres"
pytestmark = lane_marks("postgres", databases=[DB])


@pytest.fixture
def queued() -> Any:
    slots.forget_made()
    definition = queue_workflows.define(OrmSnapshotStore(using=DB), using=DB)
    yield definition
    workflow_registry.unregister(queue_workflows.NAME)
    slots.forget_made()


def start_all(definition: Any, starts: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[str]:
    """Start each (state, placing) from a thread of its own, all at once."""
    cids: list[str] = []
    lock = threading.Lock()

    def start(state: dict[str, Any], placing: dict[str, Any]) -> None:
        try:
            cid = definition.start(state, **placing).coordination_id
            with lock:
                cids.append(cid)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=start, args=item) for item in starts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return cids


def completed(cids: list[str]) -> bool:
    return WorkflowRun.objects.using(DB).filter(pk__in=cids, status="completed").count() == len(
        cids
    )


def test_a_partitioned_queue_limits_each_key_and_not_the_keys_together(
    queued: Any, tmp_path: Path
) -> None:
    log = str(tmp_path / "steps.log")
    queues = {"per-customer": {"concurrency": 1, "partitioned": True}}
    with override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": queues}):
        starts = [
            ({"log": log, "ms": 150, "key": key}, {"queue": "per-customer", "partition_key": key})
            for key in ("ann", "bob", "cid")
            for _ in range(4)
        ]
        cids = start_all(queued, starts)
        wait_until(lambda: completed(cids), "every run completed", timeout=60)
    executions = step_log.executions(log)
    assert len(executions) == 36
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    key_of = {}
    for run in WorkflowRun.objects.using(DB).filter(pk__in=cids):
        key_of[run.pk] = run.queue_partition
    for execution in executions:
        by_key[key_of[execution["cid"]]].append(execution)
    assert {key: queue_workflows.most_at_once(e) for key, e in by_key.items()} == {
        "ann": 1, "bob": 1, "cid": 1,
    }  # fmt: skip
    assert queue_workflows.most_at_once(executions) > 1


def test_scope_runs_bounds_the_runs_in_flight(queued: Any, tmp_path: Path) -> None:
    log = str(tmp_path / "steps.log")
    queues = {"flights": {"concurrency": 2, "scope": "runs"}}
    with override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": queues}):
        starts = [({"log": log, "ms": 100, "n": n}, {"queue": "flights"}) for n in range(6)]
        cids = start_all(queued, starts)
        wait_until(lambda: completed(cids), "every run completed", timeout=60)
    executions = step_log.executions(log)
    assert len(executions) == 18
    # A run is in flight from its first step's start to its last step's end.
    runs: dict[str, dict[str, float]] = {}
    for e in executions:
        span = runs.setdefault(e["cid"], {"start": e["start"], "end": e["end"]})
        span["start"], span["end"] = min(span["start"], e["start"]), max(span["end"], e["end"])
    assert queue_workflows.most_at_once(runs.values()) == 2


def nap(state: dict[str, Any], ctx: StepContext) -> Any:
    step_log.append(state, ctx)
    return sleep(state, 3600)


def wake(state: dict[str, Any], ctx: StepContext) -> Any:
    return advance(state)


@pytest.mark.parametrize("scope", ["steps", "runs"])
def test_a_sleeping_run_holds_no_slot(queued: Any, tmp_path: Path, scope: str) -> None:
    log = str(tmp_path / "steps.log")
    Workflow.define("napper", [nap, wake], OrmSnapshotStore(using=DB), using=DB, queue="one")
    try:
        queues = {"one": {"concurrency": 1, "scope": scope}}
        with override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": queues}):
            sleeper = Workflow.start("napper", {"log": log}).coordination_id
            assert WorkflowRun.objects.using(DB).get(pk=sleeper).status == "sleeping"
            held = WorkflowQueueSlot.objects.using(DB).filter(queue="one").exclude(token="")
            assert not held.exists()
            other = queued.start({"log": log, "ms": 0}, queue="one").coordination_id
            assert completed([other])
    finally:
        workflow_registry.unregister("napper")


def test_worker_concurrency_bounds_the_steps_of_this_process(queued: Any, tmp_path: Path) -> None:
    log = str(tmp_path / "steps.log")
    with override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": {"local": {"worker_concurrency": 2}}}):
        starts = [({"log": log, "ms": 100, "n": n}, {"queue": "local"}) for n in range(8)]
        cids = start_all(queued, starts)
        wait_until(lambda: completed(cids), "every run completed", timeout=60)
    executions = step_log.executions(log)
    assert len(executions) == 24
    assert queue_workflows.most_at_once(executions) == 2
