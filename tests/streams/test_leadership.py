"""SINGLE_LEADER in one process: two managers, one lease, the fake change source.

The kill test with real processes is ``tests/streams/test_leader_kill.py``.
"""

import threading
import time
from datetime import timedelta

import pytest

from flowwarden_django.streams import LeaseLostError, register_stream, stream_registry
from flowwarden_django.streams.backends.memory import InMemoryCheckpointStore, InMemoryLockService
from flowwarden_django.streams.runtime.leadership import Leadership
from flowwarden_django.streams.runtime.observed_store import ObservedCheckpointStore
from flowwarden_django.streams.spec import CheckpointSpec
from flowwarden_django.streams.stores import lock_services
from flowwarden_django.testkit.checkpoint_store import now_ms
from flowwarden_django.testkit.fake_source import FakeOplog
from tests.streams.managers import RUNNERS, new_manager

STREAM = "leader-orders"


@pytest.fixture
def leader_settings(settings):
    settings.FLOWWARDEN = {
        **settings.FLOWWARDEN,
        "CHECKPOINT_STORES": {
            "default": {
                "BACKEND": "flowwarden_django.streams.backends.memory.InMemoryCheckpointStore"
            }
        },
        "LOCK_SERVICES": {
            "default": {"BACKEND": "flowwarden_django.streams.backends.memory.InMemoryLockService"}
        },
        "LEADER_LEASE_TTL": "2s",
        "LEADER_RENEW_INTERVAL": "100ms",
        "STANDBY_POLL_INTERVAL": "100ms",
    }
    yield settings


@pytest.fixture
def oplog(leader_settings):
    handled = []
    lock = threading.Lock()

    def on_insert(doc, ctx):
        with lock:
            handled.append((doc["_id"], threading.current_thread().name))

    register_stream(
        STREAM,
        "orders",
        on_insert=on_insert,
        deployment_mode="SINGLE_LEADER",
        checkpoint=CheckpointSpec(save_interval_seconds=0),
    )
    log = FakeOplog()
    log.handled = handled
    yield log
    stream_registry.unregister(STREAM)


def manager(oplog, instance_id, runner="threads"):
    return new_manager(runner, oplog, instance_id=instance_id, publish_status=False)


def wait_until(condition, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.mark.parametrize(
    ("runner_a", "runner_b"),
    [("threads", "threads"), ("asyncio", "asyncio"), ("asyncio", "threads")],
)
def test_one_leader_one_standby_and_a_graceful_handover(oplog, runner_a, runner_b):
    a, b = manager(oplog, "host-a:1", runner_a), manager(oplog, "host-b:1", runner_b)
    try:
        assert a.start(STREAM) is not None
        assert b.start(STREAM) is None  # standby
        assert b.any_running()  # it keeps waiting for the lease
        service = lock_services["default"]
        assert service.owner_of(STREAM).owner.startswith("host-a:1#")
        wait_until(lambda: a.consumer(STREAM).state.value == "running", "a running")
        oplog.insert({"_id": 1})
        wait_until(lambda: len(oplog.handled) == 1, "event 1 by the leader")
        first_token = service.owner_of(STREAM).token
        a.stop_all()  # graceful: flushes, then releases the lease at once
        wait_until(lambda: b.consumer(STREAM) is not None, "b takes over")
        assert service.owner_of(STREAM).owner.startswith("host-b:1#")
        assert service.owner_of(STREAM).token > first_token
        oplog.insert({"_id": 2})
        wait_until(lambda: len(oplog.handled) == 2, "event 2 by the new leader")
        assert [i for i, _ in oplog.handled] == [1, 2]  # resumed after the leader's anchor
    finally:
        a.stop_all(timeout=5)
        b.stop_all(timeout=5)


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_lost_lease_stops_the_consumer_before_its_next_event(oplog, runner):
    a = manager(oplog, "host-a:1", runner)
    try:
        consumer = a.start(STREAM)
        wait_until(lambda: consumer.state.value == "running", "running")
        oplog.insert({"_id": 1})
        wait_until(lambda: len(oplog.handled) == 1, "event 1")
        # Another owner takes the lease over (ours expired while this process stalled).
        lock_services["default"].clear()
        lock_services["default"].try_acquire(STREAM, "host-b:1", 60)
        a.leadership(STREAM).lose()
        oplog.insert({"_id": 2})
        wait_until(lambda: not a._threads[STREAM].is_alive(), "the consumer stops")
        assert [i for i, _ in oplog.handled] == [1]
        # A few standby polls: host-b holds the lease, so no restart.
        leadership, polls = a.leadership(STREAM), []
        try_lead = leadership.try_lead

        def counted_try_lead():
            polls.append(try_lead())
            return polls[-1]

        leadership.try_lead = counted_try_lead
        wait_until(lambda: len(polls) >= 3, "three standby polls")
        assert not a._threads[STREAM].is_alive()
    finally:
        a.stop_all(timeout=5)


def test_checkpoint_writes_with_a_stale_fencing_token_are_refused():
    clock = [now_ms()]
    service = InMemoryLockService(now=lambda: clock[0])
    leadership = Leadership(STREAM, service, "host-a:1", ttl=5, renew_interval=1, poll_interval=1)
    assert leadership.try_lead()
    store = InMemoryCheckpointStore()
    fenced = ObservedCheckpointStore(store, STREAM, fence=leadership.fence)
    fenced.save_processed(STREAM, {"_data": "01"}, now_ms())
    # The lease expires (the process stalled) and host-b takes it over.
    clock[0] += timedelta(seconds=10)
    assert service.try_acquire(STREAM, "host-b:1", 5).token == 2
    with pytest.raises(LeaseLostError), service.guard(leadership.lease):
        pass
    # Even while this process still believes it leads, the store's guard refuses:
    leadership._valid_until = float("inf")
    with pytest.raises(LeaseLostError):
        fenced.save_processed(STREAM, {"_data": "02"}, now_ms())
    assert leadership.lease is None and not leadership.is_valid()  # it knows it lost
    assert store.find(STREAM).last_processed_token == {"_data": "01"}
    assert not leadership.renew() and leadership.lease is None


def test_a_renew_that_raises_is_a_lost_lease():
    class Flaky(InMemoryLockService):
        def renew(self, lease, ttl):
            raise ConnectionError("lock store down")

    leadership = Leadership(STREAM, Flaky(), "host-a:1", ttl=5, renew_interval=1, poll_interval=1)
    assert leadership.try_lead() and leadership.is_valid()
    assert not leadership.renew()
    assert not leadership.is_valid() and leadership.role == "STANDBY"
