"""A stream with ``execution="celery"``: this process reads the change stream and
keeps the window; a real ``celery worker`` (prefork, 4 children, Redis broker and
result backend) handles each event, on both runtimes (``tests/support/celery_parallel_streams.py``).

The worker's children are all killed with SIGKILL, twice, while they handle events: the killed
events are delivered again (``acks_late``, ``reject_on_worker_lost``) and every key's
events are still handled in stream order, none lost, with the anchor at the end. The
same when the whole worker is killed and another one takes its messages back; and a
key whose event the worker retries shows parked in the reading process.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from flowwarden_django.streams.backends.memory import InMemoryCheckpointStore
from flowwarden_django.streams.spec import CheckpointSpec, RestartPolicySpec, StreamSpec
from flowwarden_django.testkit.fake_source import FakeChangeSource
from tests.integrations.conftest import DB
from tests.streams.managers import consumer_class
from tests.support import celery_parallel_mode as declared
from tests.support.celery_procs import default_producer, wait_until
from tests.support.lanes import lane_marks
from tests.testapp.models import Effect

EVENTS = 240
WAIT = 90.0
PREFORK = ["--pool=prefork", "--concurrency=4"]

pytestmark = [*lane_marks("postgres", databases=["default", DB]), pytest.mark.lane("redis")]


@pytest.fixture
def current_producer(broker_url: str, queue: str) -> Iterator[Celery]:
    """The app this process sends events with and reads answers from, made the
    default app (what a project's Celery app is in its processes)."""
    with default_producer("fw-stream-producer", broker_url, queue) as app:
        yield app


def stream_spec() -> StreamSpec:
    """The stream as this process declares it (the handler runs in the worker only)."""
    return StreamSpec(
        name=declared.STREAM_NAME,
        collection="orders",
        database="app",
        handlers={"insert": lambda doc: None},
        parallelism=8,
        key=declared.order_key,
        execution="celery",
        checkpoint=CheckpointSpec(save_every_n=10, save_interval_seconds=0),
        restart_policy=RestartPolicySpec(max_attempts=1, initial_delay="1ms"),
    )


def pool_children(pid: int) -> list[int]:
    """The PIDs of *pid*'s child processes (the prefork pool)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(entry.name))
    return children


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_events_run_on_celery_in_key_order_through_killed_pool_children(
    runner, start_worker, current_producer, tmp_path
):
    worker = start_worker(PREFORK)
    worker.wait_ready()
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    Consumer = consumer_class(runner)
    Consumer(stream_spec(), store, lambda s: source).run(burst=True)  # bootstrap
    events = [source.oplog.insert({"_id": n, "seq": n}) for n in range(1, EVENTS + 1)]
    consumer = Consumer(stream_spec(), store, lambda s: source)
    rows = Effect.objects.using(DB)

    thread = threading.Thread(target=consumer.run, kwargs={"burst": True})
    began = time.monotonic()
    thread.start()
    killed = []
    try:
        for target in (60, 140):
            wait_until(lambda t=target: rows.count() >= t, WAIT, f"{target} rows", worker)
            # Every child at once: with 8 events in flight for 4 children, some are
            # always in the middle of an event (one child alone may be idle).
            for child in pool_children(worker.proc.pid):
                os.kill(child, signal.SIGKILL)
                killed.append(child)
        thread.join(WAIT)
        assert not thread.is_alive(), worker.log_tail()
    finally:
        consumer.stop()
        thread.join(10)
    took = time.monotonic() - began

    written = list(rows.order_by("id").values_list("order_id", "stream"))
    orders = [order for order, _ in written]
    assert set(orders) == set(range(1, EVENTS + 1)), "an event was lost"
    # Each key's rows, in the order they were written, are its orders in stream order;
    # a killed event may have written its row before dying: it appears twice in a row.
    for key in range(declared.KEYS):
        mine = [order for order, label in written if label.startswith(f"key-{key}:")]
        deduplicated = [o for i, o in enumerate(mine) if i == 0 or mine[i - 1] != o]
        assert deduplicated == list(range(key or declared.KEYS, EVENTS + 1, declared.KEYS))
    handled_by = {label.split(":")[1] for _, label in written}
    assert len(handled_by) > 1, "one process handled everything: no pool at work"
    assert "WorkerLostError" in worker.log() or "exited with 'signal 9" in worker.log()
    assert store.find(declared.STREAM_NAME).last_processed_token == events[-1]["_id"]
    assert consumer.events_handled == EVENTS
    print(
        f"\n[{runner}] {EVENTS} events on Celery in {took:.1f} s; "
        f"pool children killed: {len(killed)}; "
        f"rows {len(written)} ({len(written) - EVENTS} re-deliveries left a row)"
    )


@pytest.mark.slow
def test_a_key_whose_event_the_worker_retries_shows_parked(start_worker, current_producer):
    from flowwarden_django.models import DeadLetter

    worker = start_worker(["--pool=threads", "--concurrency=4"])
    worker.wait_ready()
    spec = StreamSpec(
        name=declared.POISON_STREAM,
        collection="orders",
        database="app",
        handlers={"insert": lambda doc: None},
        parallelism=4,
        key=declared.poison_key,
        execution="celery",
        checkpoint=CheckpointSpec(save_every_n=1, save_interval_seconds=0),
        restart_policy=RestartPolicySpec(max_attempts=1, initial_delay="1ms"),
    )
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    Consumer = consumer_class("threads")
    Consumer(spec, store, lambda s: source).run(burst=True)  # bootstrap
    events = [source.oplog.insert({"_id": n, "seq": n}) for n in range(1, 13)]
    consumer = Consumer(spec, store, lambda s: source)
    parked: list[list] = []

    def watch() -> None:
        while thread.is_alive():
            window = consumer.window
            if window is not None:
                parked.append(window.window.parked_keys())
            time.sleep(0.05)

    thread = threading.Thread(target=consumer.run, kwargs={"burst": True})
    thread.start()
    watcher = threading.Thread(target=watch)
    watcher.start()
    thread.join(WAIT)
    watcher.join(5)
    assert not thread.is_alive(), worker.log_tail()

    # The worker retried order 3 (key 1) for about 1.4 s: its key showed parked meanwhile.
    assert [1] in parked, sorted({tuple(keys) for keys in parked})
    rows = Effect.objects.using(DB).filter(stream=declared.POISON_STREAM)
    assert sorted(rows.values_list("order_id", flat=True)) == [
        n for n in range(1, 13) if n != declared.POISON_SEQ
    ]
    letters = DeadLetter.objects.using(DB).filter(stream_name=declared.POISON_STREAM)
    assert [letter.attempts for letter in letters] == [declared.POISON_ATTEMPTS]
    assert store.find(declared.POISON_STREAM).last_processed_token == events[-1]["_id"]


@pytest.mark.slow
def test_a_whole_worker_killed_mid_stream_leaves_its_events_to_the_next_one(
    start_worker, current_producer, settings
):
    """The worker's whole process group is SIGKILLed while events are in flight; a new
    worker gets their unacknowledged messages back after the 3 s visibility timeout,
    and the waiting slots get the answers: every key's events in order, none lost.

    kombu's Redis transport records a message as unacknowledged only after it took it
    off the queue, a round trip later: a worker killed in between loses it. A slot
    whose event it was gives up after ``STREAM_EVENT_TIMEOUT`` (10 min; 15 s here) and
    the stream restarts, sending the event again."""
    settings.FLOWWARDEN = {**getattr(settings, "FLOWWARDEN", {}), "STREAM_EVENT_TIMEOUT": "15s"}
    first = start_worker(PREFORK, visibility_timeout=3.0)
    first.wait_ready()
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    Consumer = consumer_class("threads")
    Consumer(stream_spec(), store, lambda s: source).run(burst=True)  # bootstrap
    events = [source.oplog.insert({"_id": n, "seq": n}) for n in range(1, 121)]
    consumer = Consumer(stream_spec(), store, lambda s: source)
    rows = Effect.objects.using(DB)
    thread = threading.Thread(target=consumer.run, kwargs={"burst": True})
    thread.start()
    try:
        wait_until(lambda: rows.count() >= 40, WAIT, "40 rows", first)
        first_children = {str(pid) for pid in pool_children(first.proc.pid)}
        first.kill()
        assert first.proc.returncode == -signal.SIGKILL
        second = start_worker(PREFORK, visibility_timeout=3.0)
        thread.join(WAIT)
        assert not thread.is_alive(), second.log_tail()
    finally:
        consumer.stop()
        thread.join(10)

    written = list(rows.order_by("id").values_list("order_id", "stream"))
    assert {order for order, _ in written} == set(range(1, 121)), "an event was lost"
    for key in range(declared.KEYS):
        mine = [order for order, label in written if label.startswith(f"key-{key}:")]
        # Each handling is the key's next order, the same one again (a redelivery), or
        # an earlier one a restart replays from the anchor: never one out of order.
        for before, after in itertools.pairwise(mine):
            assert after == before + declared.KEYS or after <= before, (key, mine)
        assert mine[0] == (key or declared.KEYS) and mine[-1] > 120 - declared.KEYS
    pids = {label.split(":")[1] for _, label in written}
    assert pids - first_children, "no event was handled by the second worker"
    assert store.find(declared.STREAM_NAME).last_processed_token == events[-1]["_id"]
    assert consumer.events_handled >= 120  # more when a restart sent some again
