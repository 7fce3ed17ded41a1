"""Streams in an outage (issue 51).

* A restart's attempts report ``restarting`` (not ``starting``) until the stream runs
  again: the outage shows in the status for as long as it lasts.
* A generation ending on an outage reports it at once (``failing``), before its
  cleanup (closing the window, flushing the anchor) waits on the same server.
* A transactional stream whose event failed for good and that has no dead-letter
  queue restarts without opening another transaction: the decision writes nothing,
  and a database gone silent would make the stream wait a connect timeout more
  before it reports the outage. With a queue, the dead letter and the anchor still
  share one transaction."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.db import transaction
from pymongo.errors import AutoReconnect

from flowwarden_django.streams.backends.memory import InMemoryCheckpointStore
from flowwarden_django.streams.context import ChangeContext
from flowwarden_django.streams.core import effects
from flowwarden_django.streams.core.events import UnhandledEventError
from flowwarden_django.streams.core.lifecycle import failing
from flowwarden_django.streams.locks import LeaseLostError
from flowwarden_django.streams.runtime import StreamConsumer, StreamState
from flowwarden_django.streams.spec import DeadLetterQueueSpec, RestartPolicySpec, StreamSpec
from flowwarden_django.testkit.fake_source import FakeChangeSource, fake_token

EVENT = {
    "_id": fake_token(1),
    "operationType": "insert",
    "ns": {"db": "app", "coll": "orders"},
    "documentKey": {"_id": 1},
    "fullDocument": {"_id": 1},
}


class Opened(Exception):
    """``transaction.atomic`` was called."""


def _park(monkeypatch: pytest.MonkeyPatch, **options: object) -> None:
    spec = StreamSpec(
        name="orders",
        collection="orders",
        handlers={"insert": lambda doc: None},
        transactional=True,
        **options,
    )
    consumer = StreamConsumer(spec, InMemoryCheckpointStore(), lambda s: FakeChangeSource())

    def atomic(*args: object, **kwargs: object) -> None:
        raise Opened

    monkeypatch.setattr(transaction, "atomic", atomic)
    ctx = ChangeContext(EVENT, stream_name="orders", event_id=None, **consumer.actions)
    consumer._dead_letter(effects.ParkFailedEvent(RuntimeError("database gone"), ctx, False))


def test_without_a_queue_the_restart_opens_no_transaction(monkeypatch):
    with pytest.raises(UnhandledEventError):
        _park(monkeypatch)


def test_with_a_queue_the_dead_letter_shares_the_anchor_s_transaction(monkeypatch):
    with pytest.raises(Opened):
        _park(monkeypatch, dead_letter_queue=DeadLetterQueueSpec())


def test_a_restart_s_attempts_report_restarting_until_the_stream_runs():
    states: list[StreamState] = []
    source = FakeChangeSource()

    def factory(spec: StreamSpec) -> FakeChangeSource:
        states.append(consumer.state)
        if len(states) < 3:
            raise AutoReconnect("the server went silent")
        return source

    spec = StreamSpec(
        name="orders",
        collection="orders",
        handlers={"insert": lambda doc: None},
        restart_policy=RestartPolicySpec(initial_delay="1ms", max_delay="5ms"),
    )
    consumer = StreamConsumer(spec, InMemoryCheckpointStore(), factory)
    consumer.run(burst=True)
    assert states == [StreamState.STARTING, StreamState.RESTARTING, StreamState.RESTARTING]
    assert consumer.restarting_since is None
    assert consumer.state == StreamState.STOPPED


def test_a_generation_ending_on_an_outage_reports_it_at_once():
    consumer = SimpleNamespace(state=StreamState.RUNNING, last_error=None, restarting_since=None)
    failing(consumer, RuntimeError("a bug in a handler"))
    failing(consumer, LeaseLostError("another process leads"))
    assert (consumer.state, consumer.last_error) == (StreamState.RUNNING, None)
    error = UnhandledEventError("the event failed")
    error.__cause__ = AutoReconnect("the server went silent")
    failing(consumer, error)
    assert consumer.state == StreamState.RESTARTING
    assert consumer.last_error is error
    assert consumer.restarting_since is not None
