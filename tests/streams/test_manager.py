"""The manager's supervisor on the database: status rows, operators' pause/resume and
restart requests (``StreamControl``), for an ordinary and a SINGLE_LEADER stream."""

import threading
import time

import pytest
from django.utils import timezone

from flowwarden_django.models import StreamControl, StreamWorker
from flowwarden_django.streams import register_stream, stream_registry
from flowwarden_django.streams.runtime import StreamState
from flowwarden_django.streams.runtime.manager import StreamManager
from flowwarden_django.streams.spec import CheckpointSpec
from flowwarden_django.streams.stores import lock_services
from flowwarden_django.testkit.fake_source import FakeChangeSource, FakeOplog
from tests.streams.managers import RUNNERS, new_manager

MEMORY = "flowwarden_django.streams.backends.memory."


@pytest.fixture
def fast_settings(settings):
    settings.FLOWWARDEN = {
        **settings.FLOWWARDEN,
        "CHECKPOINT_STORES": {"default": {"BACKEND": MEMORY + "InMemoryCheckpointStore"}},
        "LOCK_SERVICES": {"default": {"BACKEND": MEMORY + "InMemoryLockService"}},
        "STATUS_INTERVAL": "100ms",
        "LEADER_LEASE_TTL": "3s",
        "LEADER_RENEW_INTERVAL": "200ms",
        "STANDBY_POLL_INTERVAL": "200ms",
    }
    return settings


@pytest.fixture(params=RUNNERS)
def runner(request):
    return request.param


@pytest.fixture(params=["ALL_INSTANCES", "SINGLE_LEADER"])
def stream(request, fast_settings, runner):
    handled = []
    lock = threading.Lock()

    def on_insert(doc):
        with lock:
            handled.append(doc["_id"])

    register_stream(
        "managed",
        "orders",
        on_insert=on_insert,
        deployment_mode=request.param,
        checkpoint=CheckpointSpec(save_interval_seconds=0),
    )
    oplog = FakeOplog()
    oplog.handled = handled
    manager = new_manager(runner, oplog, instance_id="i1")
    yield manager, oplog
    manager.stop_all(timeout=10)
    stream_registry.unregister("managed")


def wait_until(condition, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def row():
    return StreamWorker.objects.filter(stream_name="managed", instance_id="i1").first()


def control(**fields):
    """What the admin console writes."""
    StreamControl.request("managed", by="op", **fields)


@pytest.mark.django_db(transaction=True)
def test_status_rows_pause_resume_and_restart(stream):
    manager, oplog = stream
    manager.start("managed")
    wait_until(lambda: (r := row()) is not None and r.state == "running", "a running row")
    oplog.insert({"_id": 1})
    wait_until(lambda: oplog.handled == [1], "event 1")
    wait_until(lambda: row().events == 1, "the event counted in the row")
    if manager.leadership("managed") is not None:
        assert row().role == "LEADER"

    control(paused=True)
    wait_until(lambda: row().state == "paused", "paused")
    # The row says paused once the consumer is asked to stop; it may still be
    # finishing its poll (an event that arrives then is handled), so wait for the stop.
    paused_consumer = manager.consumer("managed")
    wait_until(lambda: paused_consumer.state is StreamState.STOPPED, "the consumer stopped")
    oplog.insert({"_id": 2})
    # Three supervisor passes after the insert (each would relaunch a wanted consumer,
    # each publishes the row): had the pause not held, event 2 would be on its way.
    for _ in range(3):
        published = row().updated_at
        wait_until(lambda p=published: row().updated_at > p, "a status pass while paused")
    assert oplog.handled == [1]  # paused: nothing is handled
    if manager.leadership("managed") is not None:
        wait_until(lambda: lock_services["default"].owner_of("managed") is None, "lease released")

    control(paused=False)
    wait_until(lambda: oplog.handled == [1, 2], "event 2 after the pause")
    first = manager.consumer("managed")

    control(restart_requested_at=timezone.now())
    wait_until(lambda: manager.consumer("managed") is not first, "a restarted consumer")
    wait_until(lambda: row().state == "running", "running again")
    oplog.insert({"_id": 3})
    wait_until(lambda: oplog.handled == [1, 2, 3], "event 3 after the restart")

    manager.stop_all(timeout=10)
    assert row() is None  # a graceful stop leaves no instance behind


@pytest.mark.parametrize(("broken", "status"), [(False, "OK"), (True, "ERROR")])
def test_oplog_window_reported_per_client(fast_settings, broken, status):
    from flowwarden_django.streams import metrics

    class Source(FakeChangeSource):
        def oplog_window(self):
            if broken:
                raise ConnectionError("oplog unreadable")
            return super().oplog_window()

    register_stream("windowed", "orders", on_insert=lambda doc: None)
    oplog = FakeOplog()
    for n in range(3):
        oplog.insert({"_id": n})
    reports = []

    def receiver(sender, **kwargs):
        reports.append((sender, kwargs["status"], kwargs["hours"]))

    metrics.oplog_stats.connect(receiver, sender="default")
    manager = StreamManager(source_factory=lambda spec: Source(oplog), publish_status=False)
    try:
        manager.start("windowed")
        wait_until(lambda: reports, "an oplog report")
    finally:
        manager.stop_all(timeout=10)
        metrics.oplog_stats.disconnect(receiver, sender="default")
        stream_registry.unregister("windowed")
    sender, reported, hours = reports[0]
    assert (sender, reported) == ("default", status)
    # Positions are a second apart in the fake oplog, and idle polls add no-op entries.
    assert (hours is None) if broken else hours > 0


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_manager_used_with_with_stops_its_streams_when_the_script_raises(fast_settings, runner):
    """Stream threads are not daemons: a script that raises after starting them would
    never exit. ``with StreamManager()`` stops (and flushes) them on the way out."""
    register_stream("scripted", "orders", on_insert=lambda doc: None)
    oplog = FakeOplog()
    before = set(threading.enumerate())
    try:
        with (
            pytest.raises(RuntimeError, match="the script failed"),
            new_manager(runner, oplog, publish_status=False) as manager,
        ):
            manager.start_all(["scripted"])
            wait_until(lambda: manager.consumer("scripted") is not None, "the stream")
            raise RuntimeError("the script failed")
    finally:
        stream_registry.unregister("scripted")
    left = [t for t in set(threading.enumerate()) - before if t.is_alive() and not t.daemon]
    assert left == []
