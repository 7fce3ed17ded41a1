"""Queue limits (issue 48) with the Celery provider: real ``celery worker`` processes
(``--pool threads``) on RabbitMQ and PostgreSQL, the ``queued`` workflow of
``tests.support.queue_workflows`` (each step logs its own start and end).

The workers run with ``tests.support.celery_queue_settings``: the queues of the test
(``FLOWWARDEN_TEST_WORKFLOW_QUEUES``), steps on Celery (so the recovery sweep runs in
each worker) and the default 10 s lease. Each test prints one ``queues [celery ...]``
line with what it measured.

1. 40 runs x 3 steps of 200 ms, ``concurrency`` 4, two workers of 4 threads: the most
   steps running at once is exactly 4, every step ran once, and a step that finds no
   slot ends its task at once (the run waits in ``waiting_slot``; ``dispatch`` queues
   its step again when a slot frees): at most two tasks per step.
2. A worker SIGKILLed while its two long steps hold two slots: both slots are free
   again within 15 s, no more than 4 steps ever ran at once (the killed steps counted
   as running until the kill, and even until their slots' leases ended), and every
   run completes.
3. Runs waiting for a slot whose dispatch timer died with the killed worker: a new
   worker's recovery sweep (``recover_stalled_runs`` -> ``dispatch_waiting``) hands
   them the slots once the dead leases end.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("celery", reason="the Celery tests need celery")

from celery import Celery
from django.test import override_settings
from django.utils import timezone

from flowwarden_django.integrations.celery.provider import (
    STEP_TASK,
    CeleryExecutionProvider,
    version_queue,
)
from flowwarden_django.models import WorkflowQueueSlot, WorkflowRun
from flowwarden_django.workflows import RunStatus, workflow_registry
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.execution.providers import reset_providers
from flowwarden_django.workflows.queues import slots
from tests.support import queue_workflows, step_log
from tests.support.celery_procs import CeleryWorker as Worker
from tests.support.lanes import lane_marks
from tests.support.services import SERVICES

DB = "postgres"
QUEUE = "carrier"
THREADS = ["--pool=threads", "--concurrency=4"]
#: Upper bound of the waits: a hang fails the test instead of blocking CI.
WAIT = 60.0
#: The issue's bound on a dead holder's slots being free again (the lease is 10 s).
FREE_WITHIN = 15.0

pytestmark = [
    *lane_marks("postgres", databases=["default", DB]),
    pytest.mark.lane("rabbitmq"),
]

#: A step task's last log line: "Task <name>[<id>] succeeded in <s>s: {'coordination_id':
#: <cid>, ... 'status': <status>}".
SUCCEEDED = re.compile(
    rf"Task {re.escape(STEP_TASK)}\[[^\]]+\] succeeded in ([0-9.e-]+)s: "
    r"\{'coordination_id': '(\w+)'.*'status': '(\w+)'"
)


# -- the broker, the workers, the producer ---------------------------------------------- #


@pytest.fixture
def broker_url() -> str:
    """The shared RabbitMQ (overrides the Redis one of ``conftest.py``)."""
    server = SERVICES["rabbitmq"]
    return f"amqp://guest:guest@{server.host}:{server.port}//"


@pytest.fixture
def queue(broker_url: str) -> Iterator[str]:
    """A Celery queue of this test alone; afterwards deleted, with the version queue its
    workers declared and their exchanges."""
    name = f"fw-queues-tests-{uuid.uuid4().hex[:12]}"
    yield name
    from kombu import Connection

    with Connection(broker_url) as connection:
        for declared in (name, version_queue(name, queue_workflows.NAME, 1)):
            channel = connection.channel()
            try:
                channel.queue_delete(declared)
                channel.exchange_delete(declared)
            except Exception:  # never declared: nothing to delete
                pass
            with contextlib.suppress(Exception):
                channel.close()


@pytest.fixture
def producer(broker_url: str, queue: str) -> Iterator[Celery]:
    """The app this process publishes the first steps with; not made the current app."""
    app = Celery("fw-queues-producer", broker=broker_url, fixups=[], set_as_current=False)
    app.conf.task_default_queue = queue
    yield app
    app.close()


@pytest.fixture
def queued() -> Iterator[Any]:
    """Workflow ``queued``, registered in this process on the ``postgres`` alias."""
    reset_providers()
    with queue_workflows.quiet_queues():
        definition = queue_workflows.define(OrmSnapshotStore(using=DB), using=DB)
        yield definition
        workflow_registry.unregister(queue_workflows.NAME)
    reset_providers()


def workers_of(
    start_worker: Callable[..., Worker], queues: dict[str, Any]
) -> Callable[..., Worker]:
    """``start(pool)``: a worker of this test's queue, with *queues* as its
    ``WORKFLOW_QUEUES``, steps on Celery and the default 10 s lease."""

    def start(pool: list[str]) -> Worker:
        env = {
            "DJANGO_SETTINGS_MODULE": "tests.support.celery_queue_settings",
            "FLOWWARDEN_TEST_WORKFLOW_QUEUES": json.dumps(queues),
        }
        return start_worker(pool, lease="10s", execution="celery", env=env)

    return start


def starting(producer: Celery, queues: dict[str, Any]) -> Any:
    """Settings under which this process starts runs: the queues, steps on Celery."""
    provider = CeleryExecutionProvider(app=producer)
    return override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": queues, "WORKFLOW_EXECUTION": provider})


# -- what is measured ------------------------------------------------------------------- #


def wait_for(
    condition: Callable[[], Any], what: str, workers: list[Worker], timeout: float = WAIT
) -> Any:
    """Poll *condition* to *timeout*; fail when it does not hold, or a worker died."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        for worker in workers:
            worker.assert_alive()
        if time.monotonic() > deadline:
            tails = "\n---\n".join(worker.log_tail(30) for worker in workers)
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}:\n{tails}")
        time.sleep(0.05)


def statuses(cids: list[str]) -> Counter[str]:
    rows = WorkflowRun.objects.using(DB).filter(pk__in=cids).values_list("status", flat=True)
    return Counter(rows)


def all_completed(cids: list[str]) -> bool:
    return statuses(cids)[RunStatus.COMPLETED] == len(cids)


def step_tasks(workers: list[Worker]) -> list[tuple[float, str, str]]:
    """(seconds, run, status) of every step task the workers ended."""
    found = []
    for worker in workers:
        for line in worker.log().splitlines():
            match = SUCCEEDED.search(line)
            if match is not None:
                found.append((float(match.group(1)), match.group(2), match.group(3)))
    return found


def held(cids: list[str]) -> list[WorkflowQueueSlot]:
    """The concurrency slots held (on a lease not yet over) by runs *cids*."""
    rows = WorkflowQueueSlot.objects.using(DB).filter(
        queue=QUEUE, kind=slots.CONCURRENCY, holder__in=cids, held_until__gt=timezone.now()
    )
    return list(rows)


def start_runs(definition: Any, states: list[dict[str, Any]]) -> list[str]:
    return [definition.start(state, queue=QUEUE).coordination_id for state in states]


# -- 1. the limit holds across two workers, and waiting is not a busy loop --------------- #


@pytest.mark.quiet  # "reached" is measured from the steps' own clocks
def test_concurrency_4_holds_over_two_thread_workers_and_is_reached(
    queued, start_worker, producer, tmp_path
):
    queues = {QUEUE: {"concurrency": 4}}
    start = workers_of(start_worker, queues)
    workers = [start(THREADS), start(THREADS)]
    for worker in workers:
        worker.wait_ready()
    log = str(tmp_path / "steps.log")
    began = time.monotonic()
    with starting(producer, queues):
        cids = start_runs(queued, [{"log": log, "ms": 200, "n": n} for n in range(40)])
    wait_for(lambda: all_completed(cids), "every run completed", workers)
    took = time.monotonic() - began

    executions = step_log.executions(log)
    most = queue_workflows.most_at_once(executions)
    tasks = step_tasks(workers)
    by_status = Counter(status for _, _, status in tasks)
    parked = sorted(seconds for seconds, _, status in tasks if status == RunStatus.WAITING_SLOT)
    parks = Counter(cid for _, cid, status in tasks if status == RunStatus.WAITING_SLOT)
    print(
        f"\nqueues [celery, 2 workers x 4 threads, rabbitmq]: 40 runs x 3 steps of 200 ms, "
        f"concurrency 4: most at once {most}, {len(executions)} step executions, "
        f"{len(tasks)} step tasks {dict(by_status)}, parked tasks took "
        f"median {statistics.median(parked or [0]) * 1000:.0f} ms, "
        f"max {max(parked or [0]) * 1000:.0f} ms, at most {max(parks.values(), default=0)} "
        f"per run; pids {len({e['pid'] for e in executions})}; "
        f"{took:.1f} s in all"
    )
    assert most == 4, f"{most} steps ran at once"
    assert len(executions) == 120
    assert Counter((e["cid"], e["step"]) for e in executions) == {
        (cid, step): 1 for cid in cids for step in ("one", "two", "three")
    }
    assert len({e["pid"] for e in executions}) == 2, "both workers ran steps"
    # Each step: a task that found no slot and parked the run (it holds nothing while
    # it waits), and the one dispatch queued when a slot was free for it, which ran
    # it. A waiting step never loops through tasks: a run parks about once per step.
    assert max(parks.values(), default=0) <= 4, parks.most_common(3)
    assert len(tasks) <= 2 * 120 + 12, dict(by_status)
    assert not WorkflowQueueSlot.objects.using(DB).filter(token__startswith="run:").exists()


# -- 2. a worker killed while it holds two slots ------------------------------------------ #


def killed_steps(began_log: str, pid: int, end: float) -> list[dict[str, Any]]:
    """The steps process *pid* began (``slow`` lines) and never ended, as running until *end*."""
    return [
        {"start": e["start"], "end": end} for e in step_log.executions(began_log) if e["pid"] == pid
    ]


def test_a_sigkilled_holder_gives_its_two_slots_back_within_the_lease(
    queued, start_worker, producer, tmp_path
):
    queues = {QUEUE: {"concurrency": 4}}
    start = workers_of(start_worker, queues)
    # Two threads: it takes the two long steps and nothing else.
    victim = start(["--pool=threads", "--concurrency=2"])
    victim.wait_ready()
    log, began_log = str(tmp_path / "steps.log"), str(tmp_path / "began.log")
    slow = {"step": "one", "ms": 30_000, "began": began_log}
    with starting(producer, queues):
        long_cids = start_runs(queued, [{"log": log, "ms": 200, "slow": slow} for _ in range(2)])
        wait_for(lambda: len(held(long_cids)) == 2, "the long steps holding two slots", [victim])
        survivor = start(THREADS)
        survivor.wait_ready()
        short_cids = start_runs(queued, [{"log": log, "ms": 200, "n": n} for n in range(24)])
    wait_for(
        lambda: len(step_log.executions(log)) >= 6, "the survivor running steps", [victim, survivor]
    )
    assert {e["pid"] for e in step_log.executions(log)} == {survivor.proc.pid}

    os.kill(victim.proc.pid, signal.SIGKILL)
    killed_at = time.time()
    victim.proc.wait(timeout=10)
    dead = held(long_cids)  # nobody renews them now: their leases end at held_until
    assert len(dead) == 2
    lease_ends = {row.pk: row.held_until.timestamp() for row in dead}
    dead_tokens = {row.pk: row.token for row in dead}

    def both_free() -> bool:
        """Each dead hold is over: its lease ended, or another taker replaced it."""
        rows = WorkflowQueueSlot.objects.using(DB).filter(pk__in=dead_tokens)
        now = timezone.now()
        return all(
            row.token != dead_tokens[row.pk] or row.held_until is None or row.held_until <= now
            for row in rows
        )

    wait_for(both_free, "the dead worker's two slots free again", [survivor], timeout=30)
    freed_after = time.time() - killed_at
    cids = long_cids + short_cids
    wait_for(lambda: all_completed(cids), "every run completed", [survivor])

    executions = step_log.executions(log)
    until_kill = queue_workflows.most_at_once(
        executions + killed_steps(began_log, victim.proc.pid, killed_at)
    )
    until_lease_end = queue_workflows.most_at_once(
        executions + killed_steps(began_log, victim.proc.pid, max(lease_ends.values()))
    )
    before_free = queue_workflows.most_at_once(
        [e for e in executions if e["start"] < min(lease_ends.values())]
    )
    print(
        f"\nqueues [celery, SIGKILL of a worker holding 2 slots, concurrency 4]: slots free "
        f"{freed_after:.1f} s after the kill (leases ended "
        f"{max(lease_ends.values()) - killed_at:.1f} s after it); most at once {until_kill} "
        f"(killed steps running until the kill), {until_lease_end} (until their leases "
        f"ended); the survivor alone while they were held: {before_free}"
    )
    assert freed_after <= FREE_WITHIN
    assert until_kill <= 4
    assert until_lease_end <= 4
    # The killed steps ran again, on the survivor; every other step once.
    counts = Counter((e["cid"], e["step"]) for e in executions)
    assert counts == {(cid, step): 1 for cid in cids for step in ("one", "two", "three")}
    assert {e["pid"] for e in executions} == {survivor.proc.pid}
    assert len(step_log.executions(began_log)) == 4  # each long step began twice


# -- 3. the sweep dispatches runs whose timer died with their worker ---------------------- #


def test_a_new_workers_sweep_dispatches_the_runs_a_dead_worker_left_waiting(
    queued, start_worker, producer, tmp_path
):
    queues = {QUEUE: {"concurrency": 2}}
    start = workers_of(start_worker, queues)
    victim = start(THREADS)
    victim.wait_ready()
    log, began_log = str(tmp_path / "steps.log"), str(tmp_path / "began.log")
    slow = {"step": "one", "ms": 30_000, "began": began_log}
    with starting(producer, queues):
        long_cids = start_runs(queued, [{"log": log, "ms": 200, "slow": slow} for _ in range(2)])
        wait_for(lambda: len(held(long_cids)) == 2, "the long steps holding both slots", [victim])
        waiting = start_runs(queued, [{"log": log, "ms": 200, "n": n} for n in range(3)])
        wait_for(
            lambda: statuses(waiting)[RunStatus.WAITING_SLOT] == 3,
            "three runs waiting for a slot",
            [victim],
        )
    os.kill(victim.proc.pid, signal.SIGKILL)
    killed_at = time.time()
    victim.proc.wait(timeout=10)
    # The long runs go away: nothing of theirs parks again (which would dispatch the
    # others); only a sweep hands the slots to the waiting runs once the leases end.
    for cid in long_cids:
        assert queued.workflow(cid).cancel("the test").cancelled
    survivor = start(THREADS)
    survivor.wait_ready()
    wait_for(lambda: all_completed(waiting), "the waiting runs completed", [survivor])
    done_after = time.time() - killed_at
    executions = step_log.executions(log)
    print(
        f"\nqueues [celery, the sweep dispatches what a dead worker left waiting]: "
        f"3 waiting runs completed {done_after:.1f} s after the kill"
    )
    assert {e["pid"] for e in executions} == {survivor.proc.pid}
    assert len(executions) == 9
    assert queue_workflows.most_at_once(executions) <= 2


# -- 4. worker_concurrency: a bound per worker process ------------------------------------ #


def test_worker_concurrency_2_holds_in_each_of_two_thread_workers(
    queued, start_worker, producer, tmp_path
):
    """Global slots to spare (8), room for 2 in each worker of 4 threads: a step task
    that lands on a full worker parks its run and gives back the slot dispatch gave it,
    and runs are not sent round and round while the workers are full."""
    queues = {QUEUE: {"concurrency": 8, "worker_concurrency": 2}}
    start = workers_of(start_worker, queues)
    workers = [start(THREADS), start(THREADS)]
    for worker in workers:
        worker.wait_ready()
    log = str(tmp_path / "steps.log")
    began = time.monotonic()
    with starting(producer, queues):
        cids = start_runs(queued, [{"log": log, "ms": 1000, "n": n} for n in range(12)])
    wait_for(lambda: all_completed(cids), "every run completed", workers)
    took = time.monotonic() - began
    executions = step_log.executions(log)
    per_worker = {
        pid: queue_workflows.most_at_once(e for e in executions if e["pid"] == pid)
        for pid in {e["pid"] for e in executions}
    }
    tasks = step_tasks(workers)
    by_status = Counter(status for _, _, status in tasks)
    parks = Counter(cid for _, cid, status in tasks if status == RunStatus.WAITING_SLOT)
    print(
        f"\nqueues [celery, 2 workers x 4 threads, worker_concurrency 2, concurrency 8]: "
        f"12 runs x 3 steps of 1 s: most at once per worker {sorted(per_worker.values())}, "
        f"in all {queue_workflows.most_at_once(executions)}; {len(tasks)} step tasks "
        f"{dict(by_status)}, at most {max(parks.values(), default=0)} parks per run; "
        f"{took:.1f} s in all"
    )
    assert len(executions) == 36
    assert sorted(per_worker.values()) == [2, 2]
    # No slot dispatch gave a run is left held after the runs ended.
    given = WorkflowQueueSlot.objects.using(DB).filter(
        token__startswith=slots.DISPATCHED, held_until__gt=timezone.now()
    )
    assert not given.exists()
    # A few tasks per step (measured: about 3), not a loop while the workers are full.
    assert by_status[RunStatus.WAITING_SLOT] <= 4 * 36, dict(by_status)
