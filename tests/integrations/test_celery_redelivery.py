"""A stream's event held by a Celery worker that dies comes back within seconds, and
one a living worker holds for long does not (issue 51, item 4).

Two real ``celery worker`` processes (prefork, Redis broker and result backend) handle
the events of ``tests/support/celery_parallel_streams.py``'s held stream, read in this
process. kombu's Redis transport records a message taken but not acknowledged, and puts
it back once ``visibility_timeout`` passed since it was recorded; each worker renews that
time for the messages it holds (``integrations/celery/visibility.py``), with the
package's 10 s by default (``CELERY_VISIBILITY_TIMEOUT``).

* The worker holding order 1 is SIGKILLed (its whole process group) mid-event, once
  the other key's events are done: the other worker gets the message back about 10 s
  later, the waiting slot gets its answer (the same task), and the stream ends with
  nothing lost and no restart, long before ``STREAM_EVENT_TIMEOUT`` (10 min).
* A living worker holds order 1 for 3.3 times a 3 s visibility timeout: it is
  delivered once.
"""

from __future__ import annotations

import sys
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
from tests.support.celery_procs import CeleryWorker, default_producer, wait_until
from tests.support.lanes import lane_marks
from tests.testapp.models import Effect

EVENTS = 12
WAIT = 90.0
PREFORK = ["--pool=prefork", "--concurrency=2"]
HELD = declared.HELD_SEQ

pytestmark = [
    *lane_marks("postgres", databases=["default", DB]),
    pytest.mark.lane("redis"),
    pytest.mark.slow,
]


@pytest.fixture
def current_producer(broker_url: str, queue: str) -> Iterator[Celery]:
    """The app this process sends events with and reads answers from (the default)."""
    with default_producer("fw-redelivery-producer", broker_url, queue) as app:
        yield app


def stream_spec() -> StreamSpec:
    return StreamSpec(
        name=declared.HELD_STREAM,
        collection="orders",
        database="app",
        handlers={"insert": lambda doc: None},
        parallelism=4,
        key=declared.held_key,
        execution="celery",
        checkpoint=CheckpointSpec(save_every_n=1, save_interval_seconds=0),
        restart_policy=RestartPolicySpec(max_attempts=1, initial_delay="1ms"),
    )


def rows(kind: str, seq: int | None = None) -> list[tuple[int, int]]:
    """``(order, pid)`` of the ``began`` or ``done`` rows, in the order written."""
    found = Effect.objects.using(DB).filter(stream__startswith=f"{declared.HELD_STREAM}:{kind}:")
    if seq is not None:
        found = found.filter(order_id=seq)
    return [
        (order, int(label.rsplit(":", 1)[1]))
        for order, label in found.order_by("id").values_list("order_id", "stream")
    ]


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def run_stream() -> tuple[object, threading.Thread, InMemoryCheckpointStore, list]:
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    Consumer = consumer_class("threads")
    Consumer(stream_spec(), store, lambda s: source).run(burst=True)  # bootstrap
    events = [source.oplog.insert({"_id": n, "seq": n}) for n in range(1, EVENTS + 1)]
    consumer = Consumer(stream_spec(), store, lambda s: source)
    thread = threading.Thread(target=consumer.run, kwargs={"burst": True})
    thread.start()
    return consumer, thread, store, events


def assert_all_handled_once_in_key_order(consumer, store, events) -> None:
    done = rows("done")
    assert sorted(order for order, _ in done) == list(range(1, EVENTS + 1)), "lost or twice"
    for key in range(declared.HELD_KEYS):
        mine = [order for order, _ in done if order % declared.HELD_KEYS == key]
        assert mine == sorted(mine), (key, mine)
    assert store.find(declared.HELD_STREAM).last_processed_token == events[-1]["_id"]
    # No restart sent an event again: the slot got the held event's answer.
    assert consumer.events_handled == EVENTS


def test_an_event_a_killed_worker_held_is_handled_by_another_within_seconds(
    start_worker, current_producer
):
    held_env = {"FLOWWARDEN_TEST_HELD_SECONDS": "600"}
    workers = [start_worker(PREFORK, env=held_env) for _ in range(2)]
    for worker in workers:
        worker.wait_ready()
    consumer, thread, store, events = run_stream()
    try:
        wait_until(lambda: bool(rows("began", HELD)), WAIT, "order 1 to begin", workers[0])
        # The other key's events all done first: the holder then takes nothing else
        # when it is killed (a message killed between BRPOP and its record in the
        # unacked set is lost outright, and comes back only by STREAM_EVENT_TIMEOUT).
        others = EVENTS // declared.HELD_KEYS
        wait_until(lambda: len(rows("done")) == others, WAIT, "the other key", workers[0])
        ((_, child),) = rows("began", HELD)
        holder = next(w for w in workers if w.proc.pid == parent_of(child))
        other: CeleryWorker = next(w for w in workers if w is not holder)
        holder.kill()
        killed_at = time.monotonic()
        wait_until(lambda: len(rows("began", HELD)) == 2, WAIT, "order 1 again", other)
        redelivered = time.monotonic() - killed_at
        wait_until(lambda: not thread.is_alive(), WAIT, "the stream to end", other)
        settled = time.monotonic() - killed_at
    finally:
        consumer.stop()
        thread.join(10)

    (_, _first), (_, second) = rows("began", HELD)
    assert parent_of(second) == other.proc.pid, "not the other worker"
    assert rows("done", HELD) == [(HELD, second)]
    assert_all_handled_once_in_key_order(consumer, store, events)
    print(
        f"\nkilled worker's event (visibility 10 s, renewed): delivered again "
        f"{redelivered:.1f} s after the SIGKILL, the stream ended {settled:.1f} s after it",
        file=sys.stderr,
    )


def test_a_living_worker_keeps_an_event_longer_than_the_visibility_timeout(
    start_worker, current_producer
):
    held_env = {"FLOWWARDEN_TEST_HELD_SECONDS": "10"}
    workers = [start_worker(PREFORK, visibility_timeout=3.0, env=held_env) for _ in range(2)]
    for worker in workers:
        worker.wait_ready()
    began = time.monotonic()
    consumer, thread, store, events = run_stream()
    try:
        wait_until(lambda: not thread.is_alive(), WAIT, "the stream to end", workers[0])
    finally:
        consumer.stop()
        thread.join(10)
    took = time.monotonic() - began

    assert len(rows("began", HELD)) == 1, "delivered again while a living worker held it"
    assert_all_handled_once_in_key_order(consumer, store, events)
    for worker in workers:
        assert "Restoring" not in worker.log(), worker.log_tail()
    print(
        f"\nevent held 10 s under a 3 s visibility timeout: delivered once; "
        f"stream of {EVENTS} events in {took:.1f} s",
        file=sys.stderr,
    )
