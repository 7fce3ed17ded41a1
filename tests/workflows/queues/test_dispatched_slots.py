"""A run handed a slot by ``dispatch`` that lands where there is no room for its step
(a Celery task on a full worker: ``worker_concurrency``) gives the slot back as it waits
again, instead of leaving it held, unused, until its lease ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from flowwarden_django.models import WorkflowQueueSlot, WorkflowRun
from flowwarden_django.workflows import RunStatus, workflow_registry
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.queues import local, slots
from flowwarden_django.workflows.queues.dispatch import dispatch
from flowwarden_django.workflows.queues.settings import queue_config
from tests.support import queue_workflows
from tests.support.lanes import lane_marks
from tests.support.polling import wait_until

DB = "postgres"
QUEUE = "room-test"
pytestmark = lane_marks("postgres", databases=[DB])


@pytest.fixture
def queued() -> Any:
    slots.forget_made()
    definition = queue_workflows.define(OrmSnapshotStore(using=DB), using=DB)
    yield definition
    workflow_registry.unregister(queue_workflows.NAME)
    slots.forget_made()


def given_to(cid: str) -> list[str]:
    """The tokens of the slots *cid* holds on a lease not yet over."""
    rows = WorkflowQueueSlot.objects.using(DB).filter(
        queue=QUEUE, holder=cid, held_until__gt=timezone.now()
    )
    return list(rows.values_list("token", flat=True))


def test_a_dispatched_run_without_room_gives_its_slots_back(queued: Any, tmp_path: Path) -> None:
    queues = {QUEUE: {"concurrency": 2, "worker_concurrency": 1, "rate": "100/s"}}
    with override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": queues}):
        config = queue_config(QUEUE)
        assert local.enter(QUEUE, 1)  # this process is full
        try:
            state = {"log": str(tmp_path / "steps.log"), "ms": 0}
            cid = queued.start(state, queue=QUEUE).coordination_id
            runs = WorkflowRun.objects.using(DB).filter(pk=cid)
            assert runs.get().status == RunStatus.WAITING_SLOT
            # What dispatch does for it: a concurrency slot, a rate slot, running.
            limits = {slots.CONCURRENCY: 2, slots.RATE: 100}
            rows, _ = slots.read(DB, QUEUE, "", limits)
            conc = [row for row in rows if row.kind == slots.CONCURRENCY]
            rate = [row for row in rows if row.kind == slots.RATE]
            assert slots.take(DB, conc, cid, slots.DISPATCHED, 10.0) is not None
            assert slots.take(DB, rate, cid, slots.PAID, 1.05) is not None
            runs.update(status=RunStatus.RUNNING)
            assert len(given_to(cid)) == 2

            queued.workflow(cid).run()  # no room here: it waits again
            assert runs.get().status == RunStatus.WAITING_SLOT
            assert given_to(cid) == []
        finally:
            local.leave(QUEUE)
        dispatch(config, "", DB)  # room again: it gets a slot and completes
        wait_until(lambda: runs.get().status == RunStatus.COMPLETED, "the run completed")
