"""The slot rows on SQLite, PostgreSQL and MariaDB: a slot is taken by one of many
racing threads, a dead holder's slot is free once its lease ends, a slot is given
back only under its own token; and a queue's concurrency holds for in-process runs
on each database."""

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

DATABASES = [
    pytest.param("default", marks=pytest.mark.django_db(transaction=True, databases=["default"])),
    pytest.param("postgres", marks=lane_marks("postgres", databases=["postgres"])),
    pytest.param("mariadb", marks=lane_marks("mariadb", databases=["mariadb"])),
]


@pytest.fixture(autouse=True)
def fresh_rows() -> Any:
    slots.forget_made()
    yield
    slots.forget_made()


def read(db: str, queue: str, limit: int) -> list[slots.SlotRow]:
    slots.ensure(db, queue, "", slots.CONCURRENCY, limit)
    rows, _ = slots.read(db, queue, "", {slots.CONCURRENCY: limit})
    return rows


@pytest.mark.parametrize("db", DATABASES)
def test_of_20_racing_threads_exactly_the_limit_take_a_slot(db: str) -> None:
    read(db, "race", 3)
    barrier = threading.Barrier(20)
    taken: list[slots.SlotRow] = []
    lock = threading.Lock()

    def take(n: int) -> None:
        try:
            rows = read(db, "race", 3)
            barrier.wait()
            slot = slots.take(db, rows, f"run-{n}", slots.RUNNING, 30, tries=3)
            if slot is not None:
                with lock:
                    taken.append(slot)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=take, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(taken) == 3
    assert len({slot.pk for slot in taken}) == 3
    holders = set(
        WorkflowQueueSlot.objects.using(db).filter(queue="race").values_list("holder", flat=True)
    )
    assert holders == {slot.holder for slot in taken}


@pytest.mark.parametrize("db", DATABASES)
def test_a_slot_whose_lease_ran_out_is_free_and_a_stale_token_gives_back_nothing(db: str) -> None:
    first = slots.take(db, read(db, "lease", 1), "dead", slots.RUNNING, 0.3)
    assert first is not None
    assert slots.take(db, read(db, "lease", 1), "alive", slots.RUNNING, 30) is None
    second = wait_until(
        lambda: slots.take(db, read(db, "lease", 1), "alive", slots.RUNNING, 30),
        "the dead holder's slot to be free",
        timeout=10,
    )
    assert not slots.release(db, first)  # the dead holder's token: not its slot any more
    assert not slots.renew(db, first, 30)
    assert slots.take(db, read(db, "lease", 1), "third", slots.RUNNING, 30) is None
    assert slots.release(db, second)
    assert slots.take(db, read(db, "lease", 1), "third", slots.RUNNING, 30) is not None


@pytest.mark.parametrize("db", DATABASES)
def test_in_process_runs_keep_to_the_concurrency_on_each_database(db: str, tmp_path: Path) -> None:
    log = str(tmp_path / "steps.log")
    definition = queue_workflows.define(OrmSnapshotStore(using=db), using=db)
    try:
        with override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": {"q": {"concurrency": 2}}}):
            cids: list[str] = []
            lock = threading.Lock()

            def start(n: int) -> None:
                try:
                    started = definition.start({"log": log, "ms": 100, "n": n}, queue="q")
                    with lock:
                        cids.append(started.coordination_id)
                finally:
                    connections.close_all()

            threads = [threading.Thread(target=start, args=(n,)) for n in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            done = WorkflowRun.objects.using(db).filter(pk__in=cids, status="completed")
            wait_until(lambda: done.count() == 8, "every run completed", timeout=60)
    finally:
        workflow_registry.unregister(queue_workflows.NAME)
    executions = step_log.executions(log)
    assert len(executions) == 24
    assert queue_workflows.most_at_once(executions) == 2


@pytest.mark.parametrize("db", DATABASES)
def test_a_rate_slot_paid_ahead_is_held_a_period_from_when_it_frees(db: str) -> None:
    slots.ensure(db, "ahead", "", slots.RATE, 1)
    rows, _ = slots.read(db, "ahead", "", {slots.RATE: 1})
    spent = slots.take(db, rows, "first", slots.USED, 0.5)
    assert spent is not None
    rows, _ = slots.read(db, "ahead", "", {slots.RATE: 1})
    frees = rows[0].held_until
    assert slots.take(db, rows, "late", slots.PAID, 10.0) is None  # not free yet
    paid = slots.take(db, rows, "early", slots.PAID, 10.0, ahead=5.0)
    assert paid is not None
    rows, _ = slots.read(db, "ahead", "", {slots.RATE: 1})
    begins = slots.paid_from(rows[0], 10.0)
    assert begins is not None and abs((begins - frees).total_seconds()) < 0.01
