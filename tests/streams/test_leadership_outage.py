"""SINGLE_LEADER when the lock service stops answering (issue 51): the leader stops
before its lease can pass, stands by again (retrying with backoff, its status saying
why) and leads again later. In one process, with a lock service that can be cut off
for one manager only; the real partition is ``tests/faults/test_leader_partitions.py``.
"""

import itertools
import threading
import time

import pytest

from flowwarden_django.streams import register_stream, stream_registry
from flowwarden_django.streams.backends.memory import InMemoryLockService
from flowwarden_django.streams.locks import note_unavailable, unavailable_error
from flowwarden_django.streams.runtime import leadership as leadership_module
from flowwarden_django.streams.runtime.leadership import Leadership
from flowwarden_django.streams.spec import CheckpointSpec
from flowwarden_django.streams.stores import lock_services
from flowwarden_django.testkit.fake_source import FakeOplog
from tests.streams.managers import RUNNERS, new_manager
from tests.streams.test_leadership import leader_settings  # noqa: F401  (fixture)
from tests.support.polling import wait_until

STREAM = "leader-outage-orders"


class CutOff:
    """A view of a lock service that can be cut off: while ``down``, acquire and renew
    answer ``None`` and note the error (as the built-in backends do), the guard raises."""

    def __init__(self, inner):
        self.inner = inner
        self.down = False
        self.calls = 0

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            if not self.down:
                return attr(*args, **kwargs)
            self.calls += 1
            error = ConnectionError("Timeout reading from 10.0.0.1:6379")
            if name in ("try_acquire", "renew"):
                note_unavailable(error)
                return None
            raise error

        return call


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_standing_by_while_the_lock_service_fails_backs_off_up_to_the_poll_interval(
    monkeypatch,
):
    monkeypatch.setattr(leadership_module.random, "uniform", lambda low, high: 1.0)
    clock, service = Clock(), CutOff(InMemoryLockService())
    leadership = Leadership(
        STREAM, service, "host-a:1", ttl=10, renew_interval=1, poll_interval=5, monotonic=clock
    )
    assert leadership.try_lead()
    service.down = True
    assert not leadership.renew()  # lost: it stands by at once
    assert leadership.role == "STANDBY" and leadership.lease is None
    assert isinstance(leadership.outage, ConnectionError)
    delays = [leadership.next_attempt - clock.now]
    for _ in range(5):
        clock.now = leadership.next_attempt
        assert leadership.due() and not leadership.try_lead()
        delays.append(leadership.next_attempt - clock.now)
    assert delays == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    service.down = False
    clock.now = leadership.next_attempt
    # Healed, but the lease is someone else's now: a plain standby poll, no outage.
    service.inner.clear()
    service.inner.try_acquire(STREAM, "host-b:1", 60)
    assert not leadership.try_lead()
    assert leadership.outage is None and leadership.next_attempt - clock.now == 5.0
    service.inner.clear()
    clock.now = leadership.next_attempt
    assert leadership.try_lead() and leadership.role == "LEADER"


def test_a_backend_error_noted_then_taken_once():
    unavailable_error()  # what an earlier test on this thread may have left
    assert unavailable_error() is None
    error = ConnectionError("down")
    note_unavailable(error)
    assert unavailable_error() is error
    assert unavailable_error() is None


def test_the_redis_lock_service_notes_that_it_does_not_answer():
    pytest.importorskip("redis")
    from flowwarden_django.streams.backends.redis import RedisLockService

    service = RedisLockService(url="redis://127.0.0.1:1/0")
    unavailable_error()
    try:
        assert service.try_acquire(STREAM, "host-a:1", 5) is None
    finally:
        service.close()
    assert unavailable_error() is not None


@pytest.fixture
def handled(leader_settings):  # noqa: F811
    runs = []
    lock = threading.Lock()

    def on_insert(doc, ctx):
        started = time.monotonic()
        time.sleep(0.002)
        with lock:
            runs.append((threading.current_thread().name, doc["_id"], started, time.monotonic()))

    register_stream(
        STREAM,
        "orders",
        on_insert=on_insert,
        deployment_mode="SINGLE_LEADER",
        checkpoint=CheckpointSpec(save_interval_seconds=0),
    )
    yield runs
    stream_registry.unregister(STREAM)


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_leader_cut_off_from_the_lock_service_stands_by_and_leads_again(handled, runner):
    oplog = FakeOplog()
    a = new_manager(runner, oplog, instance_id="host-a:1", publish_status=False)
    b = new_manager(runner, oplog, instance_id="host-b:1", publish_status=False)
    try:
        assert a.start(STREAM) is not None
        cut = CutOff(lock_services["default"])
        a.leadership(STREAM).service = cut
        assert b.start(STREAM) is None  # standby
        wait_until(lambda: a.consumer(STREAM).state.value == "running", "a running")
        oplog.insert({"_id": 1})
        wait_until(lambda: 1 in ids(handled), "event 1 by a")
        cut.down = True
        wait_until(lambda: b.consumer(STREAM) is not None, "b to lead", timeout=10)
        assert not a._threads[STREAM].is_alive()
        assert a.state_of(STREAM) == ("standby", "STANDBY")
        assert "the lock service does not answer" in a.status()[0]["last_error"]
        oplog.insert({"_id": 2})
        wait_until(lambda: 2 in ids(handled), "event 2 by b")
        calls = cut.calls
        wait_until(lambda: cut.calls >= calls + 2, "a to keep retrying")
        cut.down = False
        wait_until(lambda: a.leadership(STREAM).outage is None, "a to reach the service")
        assert a.state_of(STREAM) == ("standby", "STANDBY")
        assert "does not answer" not in a.status()[0]["last_error"]
        b.stop_all()
        wait_until(lambda: a.state_of(STREAM) == ("running", "LEADER"), "a to lead again")
        oplog.insert({"_id": 3})
        wait_until(lambda: 3 in ids(handled), "event 3 by a")
    finally:
        a.stop_all(timeout=5)
        b.stop_all(timeout=5)
    # At least once: the new leader may handle again an event whose anchor the cut-off
    # leader had not written yet (event 1), never one after it.
    assert sorted(set(ids(handled))) == [1, 2, 3]
    assert ids(handled).count(2) == ids(handled).count(3) == 1
    runs = sorted(handled, key=lambda run: run[2])
    for before, after in itertools.pairwise(runs):
        assert before[3] <= after[2]  # one handler at a time, across both instances


def ids(handled):
    """The events handled, in order (``_id`` of each handler run)."""
    return [event for _, event, _, _ in handled]


class Silent(CutOff):
    """A lock service that, while ``down``, does not answer at all: each call waits
    until it is healed (a partition with no socket timeout), then goes through."""

    def __init__(self, inner):
        super().__init__(inner)
        self.healed = threading.Event()

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            if self.down:
                self.calls += 1
                self.healed.wait(30)
            return attr(*args, **kwargs)

        return call

    def heal(self):
        self.down = False
        self.healed.set()


def test_a_renewal_that_does_not_answer_holds_nobody_and_expires_the_lease():
    clock, service = Clock(), Silent(InMemoryLockService())
    leadership = Leadership(
        STREAM, service, "host-a:1", ttl=10, renew_interval=0.2, poll_interval=0.2, monotonic=clock
    )
    try:
        assert leadership.try_lead()
        token = leadership.lease.token
        service.down = True
        started = time.monotonic()
        assert leadership.renew()  # pending, but the lease is still trusted
        assert time.monotonic() - started < 2  # waited call_timeout, not for the answer
        assert leadership.due() and leadership.renew()  # still pending
        clock.now += 10 - leadership.margin  # the lease is no longer trusted
        assert not leadership.renew() and leadership.lease is None
        assert not leadership.try_lead()  # the renewal still hangs: nothing new is sent
        assert service.calls == 1
        service.heal()
        wait_until(leadership.try_lead, "the lease taken again once healed", timeout=5)
        assert leadership.lease.token == token  # (the in-memory lease had not expired)
    finally:
        service.heal()


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_silent_lock_service_does_not_hold_the_supervisor(handled, runner):
    oplog = FakeOplog()
    a = new_manager(runner, oplog, instance_id="host-a:1", publish_status=False)
    b = new_manager(runner, oplog, instance_id="host-b:1", publish_status=False)
    silent = Silent(lock_services["default"])
    try:
        assert a.start(STREAM) is not None
        a.leadership(STREAM).service = silent
        assert b.start(STREAM) is None
        wait_until(lambda: a.consumer(STREAM).state.value == "running", "a running")
        silent.down = True
        # The lease (2 s) expires while a's renewal hangs: a stops, b leads.
        wait_until(lambda: b.consumer(STREAM) is not None, "b to lead", timeout=10)
        wait_until(lambda: not a._threads[STREAM].is_alive(), "a's consumer to stop")
        passes = []
        supervise_once = a.supervise_once
        a.supervise_once = lambda: (passes.append(1), supervise_once())
        wait_until(lambda: len(passes) >= 3, "a's supervisor to carry on")
        assert a.state_of(STREAM) == ("standby", "STANDBY")
        oplog.insert({"_id": 1})
        wait_until(lambda: len(handled) == 1, "event 1 by b")
        silent.heal()
        b.stop_all()
        wait_until(lambda: a.state_of(STREAM) == ("running", "LEADER"), "a to lead again")
        oplog.insert({"_id": 2})
        wait_until(lambda: len(handled) == 2, "event 2 by a")
    finally:
        silent.heal()
        a.stop_all(timeout=5)
        b.stop_all(timeout=5)
