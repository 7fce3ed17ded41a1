"""``ObservedCheckpointStore``: the conditional ``save_initial_sync`` is forwarded, fenced,
and reported like the other writes (nothing is reported when its condition fails)."""

from contextlib import contextmanager
from datetime import timedelta

import pytest

from flowwarden_django.streams import LeaseLostError, metrics
from flowwarden_django.streams.backends.memory import InMemoryCheckpointStore, InMemoryLockService
from flowwarden_django.streams.runtime.leadership import Leadership
from flowwarden_django.streams.runtime.observed_store import ObservedCheckpointStore
from flowwarden_django.testkit.checkpoint_store import now_ms, sync_progress

STREAM = "observed-orders"


@pytest.fixture
def signals():
    received = []

    def saved(sender, anchor, token, **kwargs):
        received.append(("saved", sender, anchor, token))

    def failed(sender, anchor, error, **kwargs):
        received.append(("failed", sender, anchor, type(error).__name__))

    metrics.checkpoint_saved.connect(saved, sender=STREAM, weak=False)
    metrics.checkpoint_failed.connect(failed, sender=STREAM, weak=False)
    yield received
    metrics.checkpoint_saved.disconnect(saved, sender=STREAM)
    metrics.checkpoint_failed.disconnect(failed, sender=STREAM)


def test_save_initial_sync_is_forwarded_and_reported(signals):
    store = InMemoryCheckpointStore()
    observed = ObservedCheckpointStore(store, STREAM)

    assert observed.save_initial_sync(STREAM, sync_progress(0), expected_batch=None) is True
    assert observed.save_initial_sync(STREAM, sync_progress(1), expected_batch=0) is True
    assert observed.save_initial_sync(STREAM, sync_progress(9), expected_batch=0) is False
    assert observed.save_initial_sync(STREAM, None, expected_batch=1) is True

    assert store.find(STREAM).initial_sync is None
    assert signals == [
        ("saved", STREAM, "initial_sync", None),
        ("saved", STREAM, "initial_sync", None),
        ("saved", STREAM, "initial_sync", None),
    ], "a refused condition wrote nothing: no signal"


def test_a_failing_save_initial_sync_is_reported_and_raised(signals):
    class Down(InMemoryCheckpointStore):
        def save_initial_sync(self, stream_name, progress, *, expected_batch):
            raise ConnectionError("store down")

    observed = ObservedCheckpointStore(Down(), STREAM)
    with pytest.raises(ConnectionError):
        observed.save_initial_sync(STREAM, sync_progress(0), expected_batch=None)
    assert signals == [("failed", STREAM, "initial_sync", "ConnectionError")]


def test_save_initial_sync_runs_inside_the_fence():
    events = []
    store = InMemoryCheckpointStore()

    class Recording(InMemoryCheckpointStore):
        def save_initial_sync(self, stream_name, progress, *, expected_batch):
            events.append("write")
            return store.save_initial_sync(stream_name, progress, expected_batch=expected_batch)

    @contextmanager
    def fence():
        events.append("enter")
        yield
        events.append("exit")

    observed = ObservedCheckpointStore(Recording(), STREAM, fence=fence)
    assert observed.save_initial_sync(STREAM, sync_progress(0), expected_batch=None)
    assert events == ["enter", "write", "exit"]


def test_save_initial_sync_with_a_stale_fencing_token_is_refused(signals):
    clock = [now_ms()]
    service = InMemoryLockService(now=lambda: clock[0])
    leadership = Leadership(STREAM, service, "host-a:1", ttl=5, renew_interval=1, poll_interval=1)
    assert leadership.try_lead()
    store = InMemoryCheckpointStore()
    fenced = ObservedCheckpointStore(store, STREAM, fence=leadership.fence)
    assert fenced.save_initial_sync(STREAM, sync_progress(0), expected_batch=None)
    # The lease expires (the process stalled) and host-b takes it over.
    clock[0] += timedelta(seconds=10)
    assert service.try_acquire(STREAM, "host-b:1", 5).token == 2
    leadership._valid_until = float("inf")  # this process still believes it leads
    with pytest.raises(LeaseLostError):
        fenced.save_initial_sync(STREAM, sync_progress(1), expected_batch=0)
    assert store.find(STREAM).initial_sync == sync_progress(0)
    assert signals[-1] == ("failed", STREAM, "initial_sync", "LeaseLostError")


# -- the async API: the base class's defaults run the fenced, signalled sync writes -----


def test_async_writes_are_fenced_and_reported(signals):
    from asgiref.sync import async_to_sync

    events = []

    @contextmanager
    def fence():
        events.append("enter")
        yield
        events.append("exit")

    store = InMemoryCheckpointStore()
    observed = ObservedCheckpointStore(store, STREAM, fence=fence)
    token = {"_data": "82"}

    async def scenario():
        await observed.asave_processed(STREAM, token, now_ms())
        written = await observed.asave_initial_sync(STREAM, sync_progress(0), expected_batch=None)
        refused = await observed.asave_initial_sync(STREAM, sync_progress(5), expected_batch=3)
        return written, refused, await observed.afind(STREAM)

    written, refused, found = async_to_sync(scenario)()
    assert (written, refused) == (True, False)
    assert found.last_processed_token == token
    assert events == ["enter", "exit"] * 3, "every write, the refused one too, is fenced"
    assert signals == [
        ("saved", STREAM, "processed", token),
        ("saved", STREAM, "initial_sync", None),
    ]


def test_async_write_with_a_stale_fencing_token_is_refused(signals):
    from asgiref.sync import async_to_sync

    clock = [now_ms()]
    service = InMemoryLockService(now=lambda: clock[0])
    leadership = Leadership(STREAM, service, "host-a:1", ttl=5, renew_interval=1, poll_interval=1)
    assert leadership.try_lead()
    store = InMemoryCheckpointStore()
    fenced = ObservedCheckpointStore(store, STREAM, fence=leadership.fence)
    clock[0] += timedelta(seconds=10)
    assert service.try_acquire(STREAM, "host-b:1", 5).token == 2
    leadership._valid_until = float("inf")  # this process still believes it leads
    with pytest.raises(LeaseLostError):
        async_to_sync(fenced.asave_heartbeat)(STREAM, clock[0])
    assert store.find(STREAM) is None
    assert signals[-1] == ("failed", STREAM, "heartbeat", "LeaseLostError")


def test_async_thread_sensitive_follows_the_store_unless_fenced():
    from contextlib import nullcontext

    from flowwarden_django.streams.backends.orm import OrmCheckpointStore

    memory = InMemoryCheckpointStore()
    assert ObservedCheckpointStore(memory, STREAM).async_thread_sensitive is False
    assert ObservedCheckpointStore(OrmCheckpointStore(), STREAM).async_thread_sensitive is True
    # A fence may be the ORM lease guard: it runs on the caller's Django connection.
    fenced = ObservedCheckpointStore(memory, STREAM, fence=lambda: nullcontext())
    assert fenced.async_thread_sensitive is True


def test_an_in_memory_store_is_called_on_the_loop_and_still_reported(signals, monkeypatch):
    import asyncio

    from flowwarden_django.streams.checkpoint import CheckpointStore

    async def no_hop(*args, **kwargs):
        raise AssertionError("an in-memory write hopped to a thread")

    monkeypatch.setattr(CheckpointStore, "_run_sync", no_hop)
    store = InMemoryCheckpointStore()
    observed = ObservedCheckpointStore(store, STREAM)
    assert observed.inline
    token = {"_data": "8201"}

    async def main():
        await observed.asave_processed(STREAM, token, now_ms())
        found = await observed.afind(STREAM)
        listed = await observed.alist_checkpoints()
        await observed.adelete(STREAM)
        return found, listed, await observed.afind(STREAM)

    found, listed, gone = asyncio.run(main())
    assert found.last_processed_token == token and [c.stream_name for c in listed] == [STREAM]
    assert gone is None
    assert signals == [("saved", STREAM, "processed", token)]


def test_a_fenced_in_memory_store_writes_on_the_stream_s_thread():
    @contextmanager
    def fence():
        yield

    assert not ObservedCheckpointStore(InMemoryCheckpointStore(), STREAM, fence).inline
