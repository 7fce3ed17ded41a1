"""What a queue's admission costs on PostgreSQL (``bench/queues.py`` measures it): a
queued start is the one statement an unqueued start is; between two steps a run
holding its slot reads no slot row; takers that read the same free slots at once do
not all try the same ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.db.models.functions import Now
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from flowwarden_django.models import WorkflowQueueSlot, WorkflowRun
from flowwarden_django.workflows import Completed, workflow_registry
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.engine import starting
from flowwarden_django.workflows.queues import slots
from tests.support import queue_workflows
from tests.support.lanes import lane_marks
from tests.support.polling import wait_until

DB = "postgres"
pytestmark = lane_marks("postgres", databases=[DB])
QUEUES = {"carrier": {"concurrency": 50}}


@pytest.fixture
def queued() -> Any:
    slots.forget_made()
    definition = queue_workflows.define(OrmSnapshotStore(using=DB), using=DB)
    yield definition
    workflow_registry.unregister(queue_workflows.NAME)
    slots.forget_made()


def all_completed(cids: list[str]) -> bool:
    done = WorkflowRun.objects.using(DB).filter(pk__in=cids, status="completed").count()
    return done == len(cids)


def statements(run: Any) -> list[str]:
    with CaptureQueriesContext(connections[DB]) as captured:
        run()
    return [query["sql"] for query in captured.captured_queries]


def test_a_queued_start_writes_the_run_and_its_queue_in_the_unqueued_start_statements(
    queued: Any, tmp_path: Path
) -> None:
    state = {"log": str(tmp_path / "steps.log")}
    with override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": QUEUES}):
        queued.start(state, queue="carrier")  # makes the queue's slot rows
        plain = statements(lambda: queued.start(state))
        on_queue: list[Any] = []
        queued_sql = statements(lambda: on_queue.append(queued.start(state, queue="carrier")))
    assert isinstance(on_queue[0].result, Completed)
    run = WorkflowRun.objects.using(DB).get(pk=on_queue[0].coordination_id)
    assert (run.queue, run.queue_partition, run.queue_priority) == ("carrier", "", 0)
    others = [
        sql for sql in queued_sql if "workflowqueueslot" not in sql and "waiting_slot" not in sql
    ]
    assert len(others) == len(plain), "\n".join(others)


def test_between_steps_a_run_holding_its_slot_reads_no_slot_row(
    queued: Any, tmp_path: Path
) -> None:
    state = {"log": str(tmp_path / "steps.log")}
    with override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": QUEUES}):
        queued.start(state, queue="carrier")
        sql = statements(lambda: queued.start(state, queue="carrier"))
    on_slots = [text.split(None, 1)[0] for text in sql if "workflowqueueslot" in text]
    # Three steps: one statement takes the slot, one gives it back.
    assert on_slots == ["UPDATE", "UPDATE"]
    assert (
        not WorkflowQueueSlot.objects.using(DB).filter(queue="carrier").exclude(token="").exists()
    )


def test_a_taker_with_a_stale_read_takes_a_free_slot_others_did_not(queued: Any) -> None:
    # 500 slots: the chance that three random tries all hit the three taken is 2e-8.
    with override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": {"carrier": {"concurrency": 500}}}):
        slots.ensure(DB, "carrier", "", slots.CONCURRENCY, 500)
        limits = {slots.CONCURRENCY: 500}
        rows, _ = slots.read(DB, "carrier", "", limits)
        # Others took the three lowest slots since this taker read them all free.
        for row in sorted(rows, key=lambda row: row.number)[:3]:
            assert slots.claim(DB, row, slots.Hold("other", slots.RUNNING, 60), must_be_free=True)
        taken = slots.take(DB, rows, "mine", slots.RUNNING, 60)
    assert taken is not None and taken.number >= 3
    held = WorkflowQueueSlot.objects.using(DB).filter(queue="carrier", holder="mine")
    assert list(held.values_list("number", flat=True)) == [taken.number]


def test_the_one_statement_take_leaves_free_slots_to_waiting_runs_but_takes_its_own(
    queued: Any, tmp_path: Path
) -> None:
    with override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": QUEUES}):
        slots.ensure(DB, "carrier", "", slots.CONCURRENCY, 50)
        queued.start({"log": str(tmp_path / "steps.log")}, coordination_id="waiter")
        WorkflowRun.objects.using(DB).filter(pk="waiter").update(
            status="waiting_slot", queue="carrier"
        )
        assert slots.take_first(DB, "carrier", "", 50, "late", 60) is None
        rows, _ = slots.read(DB, "carrier", "", {slots.CONCURRENCY: 50})
        given = slots.claim(
            DB, rows[7], slots.Hold("dispatched", slots.DISPATCHED, 60), must_be_free=True
        )
        assert given is not None
        taken = slots.take_first(DB, "carrier", "", 50, "dispatched", 60)
        assert taken is not None and taken.pk == given.pk
        assert slots.take_first(DB, "carrier", "", 50, "waiter", 60) is not None
    held = WorkflowQueueSlot.objects.using(DB).filter(queue="carrier").exclude(token="")
    assert sorted(held.values_list("holder", "token")) == [
        ("dispatched", taken.token),
        ("waiter", held.get(holder="waiter").token),
    ]


def test_a_run_left_running_keeps_its_slot_for_its_next_step_unless_a_run_waits(
    queued: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One step per execution, as a Celery task or a Temporal activity runs it."""
    log = str(tmp_path / "steps.log")
    slots_of = WorkflowQueueSlot.objects.using(DB).filter(queue="carrier").exclude(token="")
    with override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": QUEUES}):
        queued.start({"log": log}, queue="carrier")  # makes the queue's slot rows
        with monkeypatch.context() as patched:  # started, not run: its steps one by one
            patched.setattr(starting, "run_started", lambda workflow: None)
            queued.start({"log": log}, coordination_id="stepwise", queue="carrier")
        queued.workflow("stepwise").run_local(max_steps=1)
        kept = slots_of.get()
        assert (kept.holder, kept.token[:4]) == ("stepwise", "run:")
        second = statements(lambda: queued.workflow("stepwise").run_local(max_steps=1))
        again = slots_of.get()
        assert (again.pk, again.holder, again.token) == (kept.pk, "stepwise", kept.token)
        # Kept, in this process without a statement (another process takes it again:
        # one UPDATE, see test_slot_queries); its close asks whether a run waits, and
        # gives nothing back.
        assert not [sql for sql in second if "workflowqueueslot" in sql]
        assert len([sql for sql in second if "waiting_slot" in sql]) == 1
        # Another run, whose step ends while a run waits: it gives its slot back.
        with monkeypatch.context() as patched:
            patched.setattr(starting, "run_started", lambda workflow: None)
            queued.start({"log": log}, coordination_id="second", queue="carrier")
        queued.workflow("second").run_local(max_steps=1)
        its = slots_of.get(holder="second")
        queued.start({"log": log}, coordination_id="waiter")
        WorkflowRun.objects.using(DB).filter(pk="waiter").update(
            status="waiting_slot", queue="carrier", queued_at=timezone.now()
        )
        result = queued.workflow("second").run_local(max_steps=1)
        # The step ran on the kept slot; the slot went back and to the waiting run
        # (the dispatch continues it); this run's next step takes a slot anew.
        assert result.status == "running"
        assert not slots_of.filter(token=its.token).exists()
        wait_until(lambda: all_completed(["waiter"]), "the waiting run completed")
        for cid in ("stepwise", "second"):
            assert queued.workflow(cid).run_local().status == "completed"
    # (The waiter had no step left: the slot dispatch gave it runs out with its lease.)
    held = slots_of.filter(holder__in=["stepwise", "second"], held_until__gt=Now())
    assert not held.exists()
