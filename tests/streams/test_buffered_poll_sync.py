"""The threaded consumer's reading of the events pymongo's sync ``ChangeStream`` already
holds (``runtime.buffered``, as the asyncio consumer reads its ``AsyncChangeStream``):
each step leaves the same event, ``alive`` and ``resume_token`` as ``try_next()`` does
on a twin stream, batch ends, idle polls and an invalidate included; custom decoding and
a ``try_next`` of another class go through the public ``try_next()``; the consumer
reads the same through both paths.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pymongo
import pytest
from bson.codec_options import TypeRegistry
from pymongo.synchronous.change_stream import CollectionChangeStream

from flowwarden_django.streams.backends.memory import InMemoryCheckpointStore
from flowwarden_django.streams.clients import pymongo_source
from flowwarden_django.streams.core.effects import PollCursor, poll_cursor
from flowwarden_django.streams.runtime import StreamConsumer, buffered
from tests.streams.test_async_runtime import _scripted_rs, scripted, spec  # noqa: F401
from tests.streams.test_buffered_poll import _DecimalDecoder

DB, COLL = "app", "orders"


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the events ``buffered.take`` hands out (each without ``try_next()``)."""
    counted: list[int] = []
    original = buffered.take

    def counting(stream: Any) -> Any:
        change = original(stream)
        if change is not buffered.NOTHING_BUFFERED:
            counted.append(1)
        return change

    monkeypatch.setattr(buffered, "take", counting)
    return counted


@pytest.fixture
def twins(scripted: Any) -> Iterator[Any]:  # noqa: F811
    """Opens two streams from one start on one client: ``open(start, **options)``."""
    opened: list[Any] = []

    def open_twins(start: Any, **options: Any) -> tuple[Any, Any]:
        client: Any = pymongo.MongoClient(scripted.uri, serverSelectionTimeoutMS=5000, **options)
        coll = client[DB][COLL]
        fast = coll.watch(resume_after=start, max_await_time_ms=50)
        public = coll.watch(resume_after=start, max_await_time_ms=50)
        opened.extend([fast, public, client])
        return fast, public

    yield open_twins
    for resource in opened:
        resource.close()


def logged(scripted: Any, count: int) -> Any:  # noqa: F811
    """Log a sentinel insert, then *count* inserts; the sentinel's token (the start)."""
    start = scripted.insert(DB, COLL, {"_id": 0})["_id"]
    scripted.insert_many(DB, COLL, ({"_id": n} for n in range(1, count + 1)))
    return start


def read_in_step(fast: Any, public: Any) -> list[Any]:
    """Read *fast* through ``buffered_poll`` and its twin through ``try_next()`` until
    *fast* ends or idles, comparing every step; the events read."""
    poll = buffered.buffered_poll(fast)
    assert poll is not poll_cursor
    events: list[Any] = []
    while fast.alive:
        event = poll(PollCursor(fast))
        assert event == public.try_next()
        assert fast.alive == public.alive
        if event is None:
            # Each idle getMore answers a fresh no-op position: both are past the last.
            assert fast.resume_token["_data"] > events[-1]["_id"]["_data"]
            assert public.resume_token["_data"] > events[-1]["_id"]["_data"]
            return events
        assert fast.resume_token == public.resume_token
        events.append(event)
    return events


def test_buffered_events_come_with_try_next_s_tokens_across_batches(
    scripted: Any,  # noqa: F811
    twins: Any,
    taken: list[int],
) -> None:
    start = logged(scripted, 250)
    events = read_in_step(*twins(start))
    assert [e["documentKey"]["_id"] for e in events] == list(range(1, 251))
    # Every batch's first event needs a getMore (try_next); the rest are taken at once.
    assert 250 - 5 <= len(taken) < 250


def test_an_invalidate_closes_the_stream_as_try_next_does(scripted: Any, twins: Any) -> None:  # noqa: F811
    start = logged(scripted, 3)
    scripted.drop_collection(DB, COLL)
    fast, public = twins(start)
    events = read_in_step(fast, public)
    assert [e["operationType"] for e in events][-2:] == ["drop", "invalidate"]
    assert not fast.alive and not public.alive


def test_custom_decoding_goes_through_try_next(
    scripted: Any,  # noqa: F811
    twins: Any,
    taken: list[int],
) -> None:
    start = logged(scripted, 10)
    registry = TypeRegistry([_DecimalDecoder()])  # pymongo then decodes each event itself
    events = read_in_step(*twins(start, type_registry=registry))
    assert (len(taken), len(events)) == (0, 10)


class _OwnTryNext(CollectionChangeStream):
    def try_next(self) -> Any:
        return super().try_next()


def test_a_try_next_of_another_class_is_read_through_it(scripted: Any, twins: Any) -> None:  # noqa: F811
    start = scripted.insert(DB, COLL, {"_id": 0})["_id"]
    fast, _ = twins(start)
    assert buffered.readable(fast)
    fast.__class__ = _OwnTryNext
    assert buffered.buffered_poll(fast) is poll_cursor
    fast.__class__ = CollectionChangeStream


@pytest.mark.parametrize("fast", [True, False], ids=["buffered", "fallback"])
def test_the_threaded_consumer_reads_the_same_through_both_paths(
    scripted: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    taken: list[int],
    fast: bool,
) -> None:
    if not fast:
        monkeypatch.setattr(buffered, "readable", lambda stream: False)
    seen: list[int] = []
    store = InMemoryCheckpointStore()
    stream = spec({"insert": lambda doc: seen.append(doc["_id"])}, save_every_n=100)

    def burst() -> StreamConsumer:
        consumer = StreamConsumer(stream, store, pymongo_source)
        consumer.run(burst=True)
        return consumer

    burst()  # its start: now
    scripted.insert_many(DB, COLL, ({"_id": n} for n in range(1, 301)))
    consumer = burst()
    assert seen == list(range(1, 301))
    assert consumer.events_handled == 300
    last = scripted.events(DB, COLL)[-1]["_id"]
    assert store.find(stream.name).last_processed_token == last
    assert bool(taken) is fast
