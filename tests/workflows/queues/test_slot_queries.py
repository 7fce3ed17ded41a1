"""The written-out queries of the queue slots (``slots.others_wait``, ``slots.release``,
``slots.take_first``) on every database: what the ORM's would answer."""

from __future__ import annotations

import pytest
from django.utils import timezone

from flowwarden_django.models import WorkflowQueueSlot, WorkflowRun
from flowwarden_django.workflows.queues import slots
from tests.support.lanes import lane_marks

DATABASES = [
    pytest.param("default", marks=[pytest.mark.django_db(transaction=True)]),
    pytest.param("postgres", marks=lane_marks("postgres", databases=["postgres"])),
    pytest.param("mariadb", marks=lane_marks("mariadb", databases=["mariadb"])),
]


def waiting(db: str, cid: str, queue: str = "carrier", partition: str = "") -> None:
    now = timezone.now()
    WorkflowRun.objects.using(db).create(
        coordination_id=cid,
        workflow_name="queued",
        status="waiting_slot",
        queue=queue,
        queue_partition=partition,
        queued_at=now,
        created_at=now,
        updated_at=now,
    )


@pytest.mark.parametrize("db", DATABASES)
def test_others_wait_sees_only_other_runs_waiting_in_that_partition(db: str) -> None:
    assert not slots.others_wait(db, "carrier", "", "me")
    waiting(db, "me")
    waiting(db, "elsewhere", queue="other")
    waiting(db, "keyed", partition="k")
    assert not slots.others_wait(db, "carrier", "", "me")
    assert slots.others_wait(db, "carrier", "", "")
    assert slots.others_wait(db, "carrier", "k", "me")
    waiting(db, "them")
    assert slots.others_wait(db, "carrier", "", "me")


@pytest.mark.parametrize("db", DATABASES)
def test_release_frees_a_slot_only_under_its_token(db: str) -> None:
    slots.forget_made()
    slots.ensure(db, "carrier", "", slots.CONCURRENCY, 2)
    rows, _ = slots.read(db, "carrier", "", {slots.CONCURRENCY: 2})
    taken = slots.take(db, rows, "me", slots.RUNNING, 60)
    assert taken is not None
    stale = slots.SlotRow(taken.pk, taken.kind, taken.number, "me", "run:old", None)
    assert not slots.release(db, stale)
    assert slots.release(db, taken)
    assert not slots.release(db, taken)
    row = WorkflowQueueSlot.objects.using(db).get(pk=taken.pk)
    assert (row.holder, row.token, row.held_until) == ("", "", None)
    slots.forget_made()


@pytest.mark.parametrize("db", DATABASES)
def test_take_first_takes_in_one_statement_on_postgresql_only(db: str) -> None:
    slots.forget_made()
    slots.ensure(db, "carrier", "", slots.CONCURRENCY, 2)
    first = slots.take_first(db, "carrier", "", 2, "a", 60)
    if db != "postgres":
        assert first is None  # the caller reads the slots and takes one
        return
    second = slots.take_first(db, "carrier", "", 2, "b", 60)
    assert first is not None and second is not None and first.pk != second.pk
    assert slots.take_first(db, "carrier", "", 2, "c", 60) is None  # full
    again = slots.take_first(db, "carrier", "", 2, "a", 60)  # its own, kept
    assert again is not None and again.pk == first.pk and again.token != first.token
    # An execution of "b" nested in one that holds its slot takes none of it (here
    # none is free).
    assert slots.take_first(db, "carrier", "", 2, "b", 60, adopt_kept=False) is None
    assert slots.release(db, again)
    nested = slots.take_first(db, "carrier", "", 2, "b", 60, adopt_kept=False)
    assert nested is not None and nested.pk == first.pk
    held = WorkflowQueueSlot.objects.using(db).filter(holder="b").count()
    assert held == 2
    slots.forget_made()
