"""Queue limits with the in-process provider on PostgreSQL, from many threads: the
steps' own start and end times say how many ran at once and how fast they started."""

from __future__ import annotations

import threading
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
