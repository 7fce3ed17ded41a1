"""The asyncio consumer's reading without a coroutine per buffered event
(``runtime.buffered``).

``buffered_poll`` takes an event pymongo's ``AsyncChangeStream`` already holds with
``try_next()``'s bookkeeping: each step must leave the same event and the same
``resume_token`` as ``try_next()`` does on a twin stream, batch ends (the
postBatchResumeToken), idle polls and an invalidate included. Anything else goes
through the public ``try_next()`` (the fallback), which the consumer must read the
same through.
"""

from __future__ import annotations

import asyncio
from types import CoroutineType
from typing import Any

import pymongo
import pytest
from bson.codec_options import TypeDecoder, TypeRegistry
from bson.decimal128 import Decimal128
from pymongo.asynchronous.change_stream import AsyncCollectionChangeStream

from flowwarden_django.streams.backends.memory import InMemoryCheckpointStore
from flowwarden_django.streams.core.effects import PollCursor, poll_cursor
from flowwarden_django.streams.runtime import buffered
from flowwarden_django.streams.spec import RetryPolicySpec
from tests.streams.test_async_runtime import _scripted_rs, burst, scripted, spec  # noqa: F401

DB, COLL = "app", "orders"


async def _polled(poll: Any, stream: Any) -> tuple[Any, bool]:
    """One poll through *poll*: the event and whether it came without a coroutine."""
    result = poll(PollCursor(stream))
    if type(result) is CoroutineType:
        return await result, False
    return result, True


async def _twins(uri: str, start: Any, **options: Any) -> tuple[Any, Any, Any]:
    client: Any = pymongo.AsyncMongoClient(uri, serverSelectionTimeoutMS=5000, **options)
    coll = client[DB][COLL]
    fast = await coll.watch(resume_after=start, max_await_time_ms=50)
    public = await coll.watch(resume_after=start, max_await_time_ms=50)
    return client, fast, public


def _read_in_step(uri: str, start: Any, **options: Any) -> tuple[int, int, list[Any]]:
    """Read two twin streams to their first idle poll, one through ``buffered_poll`` and
    one through ``try_next()``, comparing every step; (buffered, total, events)."""

    async def main() -> tuple[int, int, list[Any]]:
        client, fast, public = await _twins(uri, start, **options)
        poll = buffered.buffered_poll(fast)
        taken, events = 0, []
        try:
            while True:
                event, at_once = await _polled(poll, fast)
                expected = await public.try_next()
                assert event == expected
                assert fast.alive == public.alive
                if event is None:
                    # Through try_next(): each idle getMore answers a fresh no-op
                    # position, so the twins' tokens differ; both are past the last event.
                    assert not at_once
                    assert fast.resume_token["_data"] > events[-1]["_id"]["_data"]
                    assert public.resume_token["_data"] > events[-1]["_id"]["_data"]
                    return taken, len(events), events
                assert fast.resume_token == public.resume_token
                taken += at_once
                events.append(event)
        finally:
            await fast.close()
            await public.close()
            await client.close()

    return asyncio.run(main())


def test_buffered_events_come_with_try_next_s_tokens_across_batches(scripted):  # noqa: F811
    start = scripted.insert(DB, COLL, {"_id": 0})["_id"]
    scripted.insert_many(DB, COLL, ({"_id": n} for n in range(1, 251)))
    taken, total, events = _read_in_step(scripted.uri, start)
    assert total == 250
    assert [e["documentKey"]["_id"] for e in events] == list(range(1, 251))
    # Every batch's first event needs a getMore (try_next); the rest are taken at once.
    assert 0 < taken < total
    assert taken >= total - 5


def test_an_invalidate_closes_the_stream_as_try_next_does(scripted):  # noqa: F811
    start = scripted.insert(DB, COLL, {"_id": 0})["_id"]
    scripted.insert_many(DB, COLL, ({"_id": n} for n in range(1, 4)))
    scripted.drop_collection(DB, COLL)

    async def main() -> None:
        client, fast, public = await _twins(scripted.uri, start)
        poll = buffered.buffered_poll(fast)
        try:
            operations = []
            while fast.alive:
                event, _ = await _polled(poll, fast)
                expected = await public.try_next()
                assert event == expected
                assert (fast.resume_token, fast.alive) == (public.resume_token, public.alive)
                operations.append(event and event["operationType"])
            assert operations[-2:] == ["drop", "invalidate"]
        finally:
            await fast.close()
            await public.close()
            await client.close()

    asyncio.run(main())


class _DecimalDecoder(TypeDecoder):
    bson_type = Decimal128

    def transform_bson(self, value: Any) -> Any:
        return value.to_decimal()


def test_custom_decoding_goes_through_try_next(scripted):  # noqa: F811
    start = scripted.insert(DB, COLL, {"_id": 0})["_id"]
    scripted.insert_many(DB, COLL, ({"_id": n} for n in range(1, 11)))
    registry = TypeRegistry([_DecimalDecoder()])  # pymongo then decodes each event itself
    taken, total, _ = _read_in_step(scripted.uri, start, type_registry=registry)
    assert (taken, total) == (0, 10)


class _OwnTryNext(AsyncCollectionChangeStream):
    async def try_next(self) -> Any:
        return await super().try_next()


def test_what_it_was_not_written_for_is_read_through_try_next(scripted, monkeypatch):  # noqa: F811
    assert buffered.buffered_poll(object()) is poll_cursor  # not pymongo's
    start = scripted.insert(DB, COLL, {"_id": 0})["_id"]
    scripted.insert_many(DB, COLL, ({"_id": n} for n in range(1, 4)))

    async def main() -> list[bool]:
        client, fast, public = await _twins(scripted.uri, start)
        try:
            assert buffered.readable(fast)
            fast.__class__ = _OwnTryNext  # a subclass that changes try_next
            assert buffered.buffered_poll(fast) is poll_cursor
            fast.__class__ = AsyncCollectionChangeStream
            # A pymongo without the private fields it reads.
            monkeypatch.setattr(buffered, "_CURSOR_FIELDS", ("_data", "_no_such_field"))
            assert buffered.buffered_poll(fast) is poll_cursor
            return [buffered.readable(public)]
        finally:
            await fast.close()
            await public.close()
            await client.close()

    assert asyncio.run(main()) == [False]


@pytest.mark.parametrize("fast", [True, False], ids=["buffered", "fallback"])
def test_the_consumer_reads_the_same_through_both_paths(scripted, monkeypatch, fast):  # noqa: F811
    if not fast:
        monkeypatch.setattr(buffered, "readable", lambda stream: False)
    taken: list[Any] = []
    original = buffered.take
    monkeypatch.setattr(buffered, "take", lambda s: taken.append(1) or original(s))
    seen: list[int] = []

    async def handle(doc: Any) -> None:
        seen.append(doc["_id"])

    store = InMemoryCheckpointStore()
    stream = spec({"insert": handle}, save_every_n=100)
    burst(stream, store)  # its start: now
    scripted.insert_many(DB, COLL, ({"_id": n} for n in range(1, 301)))
    consumer = burst(stream, store)
    assert seen == list(range(1, 301))
    assert consumer.events_handled == 300
    last = scripted.events(DB, COLL)[-1]["_id"]
    assert store.find(stream.name).last_processed_token == last
    assert bool(taken) is fast


# -- the plain path of an async def handler ---------------------------------------------------- #


def test_a_handler_that_suspends_fails_or_finishes_at_once_is_handled_alike(scripted):  # noqa: F811
    seen: list[int] = []
    failed: set[int] = set()

    async def handle(doc: Any) -> None:
        n = doc["_id"]
        if n % 3 == 0:
            await asyncio.sleep(0)  # suspends
        if n % 5 == 0 and n not in failed:  # fails once: before or after suspending
            failed.add(n)
            raise RuntimeError(f"first attempt at {n}")
        if n % 7 == 0:
            await asyncio.sleep(0.001)
        seen.append(n)

    store = InMemoryCheckpointStore()
    stream = spec(
        {"insert": handle},
        save_every_n=10,
        retry_policy=RetryPolicySpec(max_attempts=2, initial_delay="1ms", jitter=False),
    )
    burst(stream, store)  # its start: now
    scripted.insert_many(DB, COLL, ({"_id": n} for n in range(1, 41)))
    consumer = burst(stream, store)
    assert seen == list(range(1, 41))
    assert consumer.retries == len(failed) == 8
    assert consumer.events_handled == 40
    last = scripted.events(DB, COLL)[-1]["_id"]
    assert store.find(stream.name).last_processed_token == last
