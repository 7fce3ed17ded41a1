"""A step's activity handed back to Temporal when its worker's database falls silent
(``integrations.temporal.handback``): the heartbeat thread fails the attempt through
the worker's client once the run's claim has not been renewed for half its lease,
with a retry just after the lease runs out; a worker whose database is silent refuses
the steps offered to it and reserves no slot for more. (The partition itself, a
worker cut off from PostgreSQL alone: ``tests/faults/test_temporal_partitions.py``.)"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

pytest.importorskip("temporalio")

from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from flowwarden_django.integrations.temporal import activities, handback
from flowwarden_django.integrations.temporal.handback import (
    CLAIM_LAPSED,
    MARGIN,
    LapseWatch,
    StepSlots,
    refuse_while_silent,
)
from flowwarden_django.integrations.temporal.messages import VERSION_HANDBACK
from tests.support.polling import wait_until

LEASE = timedelta(seconds=10)


@dataclasses.dataclass
class Claim:
    """What the watch reads of a ``HeldClaim``."""

    using: str
    coordination_id: str
    silent: float
    lease: timedelta = LEASE

    def unrenewed_for(self) -> float:
        return self.silent


class Keeper:
    """A claim keeper whose claims have gone unrenewed for as long as the test says."""

    def __init__(self, *claims: Claim) -> None:
        self.claims = list(claims)

    def unrenewed_for(self, using: str, coordination_id: str) -> float:
        ages = [
            c.silent
            for c in self.claims
            if (c.using, c.coordination_id) == (using, coordination_id)
        ]
        return min(ages, default=0.0)

    def lapsing(self, fraction: float = 0.5) -> list[Claim]:
        return [c for c in self.claims if c.silent >= fraction * c.lease.total_seconds()]


class Client:
    """Records the attempts failed through it (``get_async_activity_handle(...).fail``)."""

    def __init__(self) -> None:
        self.failed: list[tuple[bytes, ApplicationError]] = []

    def get_async_activity_handle(self, *, task_token: bytes) -> Any:
        client = self

        class Handle:
            async def fail(self, error: Exception, *, rpc_timeout: Any = None) -> None:
                client.failed.append((task_token, error))

        return Handle()


@pytest.fixture
def client() -> Iterator[Client]:
    """The worker's client, installed with an event loop of its own thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    fake = Client()
    handback.completer.install(fake, loop)
    yield fake
    handback.completer.uninstall()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def keeper(monkeypatch: pytest.MonkeyPatch, *claims: Claim) -> Keeper:
    fake = Keeper(*claims)
    monkeypatch.setattr(handback, "claim_keeper", fake)
    return fake


def environment(attempt: int = 1, most: int = 5) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        ActivityEnvironment.default_info(),
        attempt=attempt,
        task_token=b"token-1",
        retry_policy=RetryPolicy(maximum_attempts=most),
    )
    return env


def watch_once() -> bool:
    return LapseWatch("default", "run-1", LEASE)()


def test_a_step_whose_claim_lapses_is_handed_back_to_be_retried_once_its_lease_is_out(
    monkeypatch: pytest.MonkeyPatch, client: Client
) -> None:
    keeper(monkeypatch, Claim("default", "run-1", silent=6.0))
    assert environment().run(watch_once) is True
    wait_until(lambda: client.failed, "the attempt failed through the client", timeout=10)
    [(token, error)] = client.failed
    assert token == b"token-1"
    assert error.type == CLAIM_LAPSED
    assert not error.non_retryable
    # The lease (10 s) runs out 4 s after now; the retry comes MARGIN after that.
    assert error.next_retry_delay == timedelta(seconds=4.0 + MARGIN)


def test_a_claim_renewed_within_half_its_lease_keeps_the_step(
    monkeypatch: pytest.MonkeyPatch, client: Client
) -> None:
    keeper(monkeypatch, Claim("default", "run-1", silent=4.9), Claim("other", "run-1", 9.0))
    assert environment().run(watch_once) is False
    assert client.failed == []


def test_a_step_on_its_last_attempt_is_not_handed_back(
    monkeypatch: pytest.MonkeyPatch, client: Client
) -> None:
    keeper(monkeypatch, Claim("default", "run-1", silent=8.0))
    assert environment(attempt=5, most=5).run(watch_once) is False
    assert client.failed == []


def test_without_a_client_the_step_only_stops_heartbeating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keeper(monkeypatch, Claim("default", "run-1", silent=6.0))
    assert environment().run(watch_once) is True


def test_the_heartbeat_thread_stops_heartbeating_once_the_step_is_handed_back() -> None:
    env = environment()
    beats: list[Any] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    looks = []

    def watch() -> bool:
        looks.append(len(beats))
        return len(beats) >= 2  # handed back after two heartbeats

    def step() -> None:
        with activities._Heartbeats(0.01, watch):
            wait_until(lambda: len(looks) > 2 and looks[-1] >= 2, "the hand-back", timeout=10)
            stopped = len(beats)
            # The thread has returned: no heartbeat after the hand-back.
            wait_until(lambda: not heartbeat_thread_alive(), "the thread's end", timeout=10)
            assert len(beats) == stopped

    env.run(step)
    assert len(beats) == 2


def heartbeat_thread_alive() -> bool:
    return any(t.name == "flowwarden-heartbeat" for t in threading.enumerate())


def test_a_worker_whose_database_is_silent_hands_a_first_attempt_to_another_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keeper(monkeypatch, Claim("default", "another-run", silent=6.0))
    with pytest.raises(ApplicationError) as raised:
        environment().run(refuse_while_silent, "default", "run-1")
    # As a worker without the run's version: the workflow offers it again, as a fresh
    # activity that may take the run from the token it was handed.
    assert raised.value.type == VERSION_HANDBACK
    assert raised.value.non_retryable


def test_a_retry_on_a_silent_worker_is_not_refused_but_handed_back_by_its_watch(
    monkeypatch: pytest.MonkeyPatch, client: Client
) -> None:
    # Its own run's earlier attempt is stuck here, its claim lapsed past the lease.
    keeper(monkeypatch, Claim("default", "run-1", silent=12.0))
    env = environment(attempt=2)
    env.run(refuse_while_silent, "default", "run-1")  # it may take the run over...
    assert env.run(watch_once) is True  # ...but with the database silent, back it goes
    wait_until(lambda: client.failed, "the attempt failed through the client", timeout=10)
    assert client.failed[0][1].next_retry_delay == timedelta(seconds=MARGIN)


def test_a_step_without_a_claim_is_handed_back_when_another_claim_in_its_database_lapses(
    monkeypatch: pytest.MonkeyPatch, client: Client
) -> None:
    keeper(monkeypatch, Claim("default", "another-run", silent=7.0))
    assert environment(attempt=3).run(watch_once) is True
    wait_until(lambda: client.failed, "the attempt failed through the client", timeout=10)
    assert client.failed[0][1].next_retry_delay == timedelta(seconds=MARGIN)


def test_a_worker_refuses_nothing_while_its_database_answers_or_on_a_last_attempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keeper(monkeypatch, Claim("default", "run-1", silent=2.0), Claim("other", "x", 9.0))
    environment().run(refuse_while_silent, "default", "run-1")
    keeper(monkeypatch, Claim("default", "run-1", silent=6.0))
    environment(attempt=5, most=5).run(refuse_while_silent, "default", "run-1")


def test_no_step_slot_is_reserved_while_the_database_is_silent() -> None:
    silent = threading.Event()
    slots = StepSlots(2, silent=silent.is_set)

    async def scenario() -> None:
        first = await slots.reserve_slot(None)
        assert slots.try_reserve_slot(None) is not None
        assert slots.try_reserve_slot(None) is None  # both taken
        waiting = asyncio.ensure_future(slots.reserve_slot(None))
        await settle()
        assert not waiting.done()
        silent.set()
        # Released from another thread, as the SDK does: still none while silent.
        await asyncio.to_thread(slots.release_slot, first)
        await settle()
        assert not waiting.done()
        assert slots.try_reserve_slot(None) is None  # nor eagerly
        silent.clear()
        assert await asyncio.wait_for(waiting, 10) is not None

    asyncio.run(scenario())


async def settle() -> None:
    """Let every callback and task that is ready run (the release's wake-up)."""
    for _ in range(10):
        await asyncio.sleep(0)


def test_the_sdks_cancellation_of_a_handed_back_attempt_does_not_interrupt_the_step(
    monkeypatch: pytest.MonkeyPatch, client: Client
) -> None:
    keeper(monkeypatch, Claim("default", "run-1", silent=6.0))
    env = environment()
    outcome: list[str] = []

    def step() -> None:
        assert watch_once() is True
        try:
            # The SDK cancels the attempt once the server says it is gone.
            env.cancel()
            wait_until(lambda: activity_cancelled(), "the cancellation", timeout=10)
            for _ in range(1000):  # the thread runs on, bytecode after bytecode
                pass
        except BaseException as exc:
            outcome.append(f"interrupted: {exc!r}")
            raise
        outcome.append("ran on")

    # In a thread of its own: the shield stays up after the activity (until its
    # thread is gone), as in a worker.
    thread = threading.Thread(target=env.run, args=(step,))
    thread.start()
    thread.join(30)
    assert outcome == ["ran on"]
    wait_until(lambda: client.failed, "the attempt failed through the client", timeout=10)
    handback._SHIELDS.clear()


def activity_cancelled() -> bool:
    from temporalio import activity

    return activity.is_cancelled()
