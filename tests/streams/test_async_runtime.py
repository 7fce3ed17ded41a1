"""``AsyncStreamConsumer`` (first cut) on the scripted replica set, with pymongo's
``AsyncMongoClient`` on the wire (``async_source.async_pymongo_source``).

Each test drives the event loop with ``asyncio.run``; the loop's clients are closed
before it ends (``async_mongo_clients.aclose()``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from flowwarden_django.streams.async_source import async_mongo_clients
from flowwarden_django.streams.backends.memory import InMemoryCheckpointStore, InMemoryDlqStore
from flowwarden_django.streams.runtime import HistoryLostError, StreamState
from flowwarden_django.streams.runtime.event_loop import AsyncStreamConsumer, run_streams
from flowwarden_django.streams.spec import (
    CheckpointSpec,
    DeadLetterQueueSpec,
    RestartPolicySpec,
    RetryPolicySpec,
    StreamSpec,
)
from tests.support.lanes import on_lane

FAST = RestartPolicySpec(max_attempts=3, initial_delay="1ms", max_delay="5ms")


@pytest.fixture(scope="module")
def _scripted_rs() -> Iterator[Any]:
    pytest.importorskip("mockupdb", reason="the scripted MongoDB fake needs mockupdb==1.8.1")
    from flowwarden_django.testkit.scripted_mongo import ScriptedReplicaSet

    with ScriptedReplicaSet() as srv:
        yield srv


@pytest.fixture
def scripted(_scripted_rs: Any) -> Iterator[Any]:
    _scripted_rs.reset()
    fw = {
        **settings.FLOWWARDEN,
        "MONGO_CLIENTS": {
            "default": {"URL": _scripted_rs.uri, "OPTIONS": {"serverSelectionTimeoutMS": 5000}}
        },
        "STREAM_MAX_AWAIT_MS": 50,
    }
    with override_settings(FLOWWARDEN=fw):
        yield _scripted_rs
    assert not _scripted_rs.internal_errors, _scripted_rs.internal_errors[0]


def spec(
    handlers: dict[str, Any], *, name: str = "orders", collection: str = "orders", **options: Any
) -> StreamSpec:
    checkpoint = options.pop("checkpoint", None) or CheckpointSpec(
        save_every_n=options.pop("save_every_n", 1),
        save_interval_seconds=0,
        on_history_lost=options.pop("on_history_lost", "FAIL"),
    )
    return StreamSpec(
        name=name,
        collection=collection,
        database="app",
        handlers=handlers,
        checkpoint=checkpoint,
        restart_policy=options.pop("restart_policy", FAST),
        **options,
    )


def on_loop(main: Callable[[], Awaitable[Any]]) -> Any:
    """Run *main* on a fresh event loop, closing the loop's Mongo clients after it."""

    async def wrapped() -> Any:
        try:
            return await main()
        finally:
            await async_mongo_clients.aclose()

    return asyncio.run(wrapped())


def burst(stream: StreamSpec, store: Any, **kwargs: Any) -> AsyncStreamConsumer:
    consumer = AsyncStreamConsumer(stream, store, **kwargs)
    on_loop(lambda: consumer.run(burst=True))
    return consumer


def ids(n: int, start: int = 1) -> list[int]:
    return list(range(start, start + n))


def test_async_and_sync_handlers_see_inserts_updates_and_deletes(scripted):
    seen_async: list[tuple[str, Any]] = []
    seen_sync: list[tuple[str, Any]] = []

    async def a_insert(doc):
        await asyncio.sleep(0)
        seen_async.append(("insert", doc["_id"]))

    async def a_update(ctx):
        seen_async.append(("update", ctx.update_description.updated_fields))

    async def a_delete(doc, ctx):
        seen_async.append(("delete", ctx.document_key["_id"]))

    def s_insert(doc):
        seen_sync.append(("insert", doc["_id"]))

    def s_update(ctx):
        seen_sync.append(("update", ctx.update_description.updated_fields))

    def s_delete(doc, ctx):
        seen_sync.append(("delete", ctx.document_key["_id"]))

    async_store, sync_store = InMemoryCheckpointStore(), InMemoryCheckpointStore()
    a_spec = spec({"insert": a_insert, "update": a_update, "delete": a_delete})
    s_spec = spec({"insert": s_insert, "update": s_update, "delete": s_delete})
    burst(a_spec, async_store)  # bootstrap: the seen anchor at "now"
    burst(s_spec, sync_store)
    assert async_store.find("orders").last_seen_token is not None
    scripted.insert("app", "orders", {"_id": 1, "n": 1})
    scripted.update("app", "orders", 1, {"n": 2})
    scripted.delete("app", "orders", 1)
    consumer = burst(a_spec, async_store)
    burst(s_spec, sync_store)
    expected = [("insert", 1), ("update", {"n": 2}), ("delete", 1)]
    assert seen_async == expected
    assert seen_sync == expected
    assert consumer.state == StreamState.STOPPED and consumer.events_handled == 3
    last = scripted.events("app", "orders")[-1]["_id"]
    assert async_store.find("orders").last_processed_token == last
    assert sync_store.find("orders").last_processed_token == last


def test_five_streams_run_concurrently_in_one_loop(scripted):
    store = InMemoryCheckpointStore()
    names = [f"orders{i}" for i in range(5)]
    handled: dict[str, list[int]] = {name: [] for name in names}

    def make(name: str, barrier: asyncio.Barrier) -> Callable[..., Awaitable[None]]:
        async def on_insert(doc):
            if not handled[name]:
                # Every stream waits here for the four others: only streams that run
                # concurrently on the loop get past it.
                await asyncio.wait_for(barrier.wait(), timeout=60)
            handled[name].append(doc["_id"])

        return on_insert

    async def main(populate: bool) -> None:
        barrier = asyncio.Barrier(5)
        consumers = [
            AsyncStreamConsumer(
                spec({"insert": make(name, barrier)}, name=name, collection=name), store
            )
            for name in names
        ]
        await run_streams(consumers, burst=True)
        assert all(c.state == StreamState.STOPPED for c in consumers)

    on_loop(lambda: main(False))  # bootstrap the five streams
    for i, name in enumerate(names):
        for n in ids(4, start=10 * i):
            scripted.insert("app", name, {"_id": n})
    on_loop(lambda: main(True))
    assert handled == {name: ids(4, start=10 * i) for i, name in enumerate(names)}
    for name in names:
        last = scripted.events("app", name)[-1]["_id"]
        assert store.find(name).last_processed_token == last


def test_a_stop_flushes_and_the_next_run_continues_after_the_processed_anchor(scripted):
    store = InMemoryCheckpointStore()
    handled: list[int] = []
    holder: dict[str, AsyncStreamConsumer] = {}

    async def on_insert(doc):
        handled.append(doc["_id"])
        if doc["_id"] == 5:
            holder["consumer"].stop()

    stream = spec({"insert": on_insert}, save_every_n=3)
    burst(stream, store)
    for n in ids(10):
        scripted.insert("app", "orders", {"_id": n})
    holder["consumer"] = consumer = AsyncStreamConsumer(stream, store)
    on_loop(lambda: consumer.run())  # not burst: only the stop ends it
    assert handled == ids(5) and consumer.state == StreamState.STOPPED
    events = scripted.events("app", "orders")
    # The stop flushed the dirty anchor (event 5; the count alone wrote event 3).
    assert store.find("orders").last_processed_token == events[4]["_id"]
    handled.clear()
    burst(stream, store)
    assert handled == ids(5, start=6)


class _Killed(AsyncStreamConsumer):
    """A consumer whose generation ends without the flush on stop (as a kill would)."""

    async def _close(self, cursor: Any) -> None:
        await cursor.close()


def test_without_the_flush_redelivery_is_at_most_save_every_n_minus_one(scripted):
    store = InMemoryCheckpointStore()
    handled: list[int] = []
    holder: dict[str, AsyncStreamConsumer] = {}

    async def on_insert(doc):
        handled.append(doc["_id"])
        if doc["_id"] == 5:
            holder["consumer"].stop()

    stream = spec({"insert": on_insert}, save_every_n=3)
    burst(stream, store)
    for n in ids(8):
        scripted.insert("app", "orders", {"_id": n})
    holder["consumer"] = consumer = _Killed(stream, store)
    on_loop(lambda: consumer.run())
    assert handled == ids(5)
    handled.clear()
    burst(stream, store)
    assert handled == [4, 5, 6, 7, 8]  # 4 and 5 again: save_every_n - 1 redelivered
    events = scripted.events("app", "orders")
    assert store.find("orders").last_processed_token == events[-1]["_id"]


class BadOrder(Exception):
    pass


def test_a_failing_handler_is_retried_then_dead_lettered(scripted):
    store, dlq = InMemoryCheckpointStore(), InMemoryDlqStore()
    attempts: list[int] = []
    handled: list[int] = []

    async def on_insert(doc, ctx):
        if doc["_id"] == 2:
            attempts.append(ctx.attempt_number)
            raise BadOrder("bad order")
        handled.append(doc["_id"])

    stream = spec(
        {"insert": on_insert},
        retry_policy=RetryPolicySpec(max_attempts=3, initial_delay="1ms", jitter=False),
        dead_letter_queue=DeadLetterQueueSpec(),
    )
    burst(stream, store, dlq_store=dlq)
    for n in ids(3):
        scripted.insert("app", "orders", {"_id": n})
    consumer = burst(stream, store, dlq_store=dlq)
    assert attempts == [1, 2, 3] and handled == [1, 3]
    assert consumer.retries == 2 and consumer.dead_lettered == 1
    (entry,) = dlq.find_by_stream("orders")
    assert entry.attempts == 3 and entry.error.type.endswith("BadOrder")
    assert entry.document_key == {"_id": 2}
    assert entry.resume_token == scripted.events("app", "orders")[1]["_id"]
    last = scripted.events("app", "orders")[-1]["_id"]
    assert store.find("orders").last_processed_token == last


def test_a_failure_without_a_dlq_restarts_and_redelivers(scripted):
    store = InMemoryCheckpointStore()
    calls: list[int] = []

    def on_insert(doc):
        calls.append(doc["_id"])
        if len(calls) == 1:
            raise RuntimeError("transient")

    stream = spec({"insert": on_insert})
    burst(stream, store)
    scripted.insert("app", "orders", {"_id": 1})
    consumer = burst(stream, store)
    assert calls == [1, 1] and consumer.restarts == 1


def test_history_lost_under_fail_raises_history_lost_error(scripted):
    store = InMemoryCheckpointStore()
    handled: list[int] = []
    stream = spec({"insert": lambda doc: handled.append(doc["_id"])})
    burst(stream, store)
    scripted.insert("app", "orders", {"_id": 1})
    burst(stream, store)
    scripted.lose_history()
    scripted.insert("app", "orders", {"_id": 2})
    before = store.find("orders")
    consumer = AsyncStreamConsumer(stream, store)
    with pytest.raises(HistoryLostError):
        on_loop(lambda: consumer.run(burst=True))
    assert consumer.state == StreamState.CRASHED
    assert handled == [1] and store.find("orders") == before


def test_history_lost_under_resume_from_now_restarts_from_now(scripted):
    store = InMemoryCheckpointStore()
    handled: list[int] = []
    stream = spec({"insert": lambda doc: handled.append(doc["_id"])})
    burst(stream, store)
    scripted.insert("app", "orders", {"_id": 1})
    burst(stream, store)
    scripted.lose_history()
    burst(spec(stream.handlers, on_history_lost="RESUME_FROM_NOW"), store)
    saved = store.find("orders")
    assert saved.last_processed_token is None and saved.last_seen_token is not None
    scripted.insert("app", "orders", {"_id": 3})
    burst(stream, store)
    assert handled == [1, 3]


def test_an_idle_poll_certifies_the_position_as_the_seen_anchor(scripted):
    store = InMemoryCheckpointStore()
    clock = [0.0]
    stream = spec(
        {},
        checkpoint=CheckpointSpec(save_interval_seconds=0, idle_heartbeat_interval_seconds=10),
    )
    burst(stream, store)
    scripted.insert("app", "orders", {"_id": 1})  # no handler: settled without one
    first = store.find("orders").last_seen_token
    consumer = AsyncStreamConsumer(stream, store, monotonic=lambda: clock[0])
    on_loop(lambda: consumer.run(burst=True))
    assert consumer.heartbeats == 0  # not idle for the interval yet
    consumer = AsyncStreamConsumer(stream, store, monotonic=lambda: clock.pop(0) if clock else 100)
    clock[:] = [0.0]
    on_loop(lambda: consumer.run(burst=True))
    assert consumer.heartbeats == 1
    saved = store.find("orders")
    assert saved.last_seen_token not in (None, first) and saved.last_heartbeat_at is not None


@on_lane("postgres", databases=["postgres"])
def test_sync_orm_handlers_and_the_orm_store_on_postgres(scripted):
    from flowwarden_django.streams.backends.orm import OrmCheckpointStore
    from tests.testapp.models import Effect

    store = OrmCheckpointStore(using="postgres")

    def on_insert(doc):
        Effect.objects.using("postgres").create(order_id=doc["_id"], stream="orders")

    stream = spec({"insert": on_insert}, save_every_n=2)
    burst(stream, store)
    for n in ids(5):
        scripted.insert("app", "orders", {"_id": n})
    burst(stream, store)
    rows = Effect.objects.using("postgres").order_by("order_id")
    assert list(rows.values_list("order_id", flat=True)) == ids(5)
    last = scripted.events("app", "orders")[-1]["_id"]
    assert store.find("orders").last_processed_token == last


def test_a_stream_without_sync_code_makes_no_thread_to_close_its_connections(scripted, monkeypatch):
    from flowwarden_django.streams.runtime import event_loop

    closed: list[str] = []
    monkeypatch.setattr(event_loop.connections, "close_all", lambda: closed.append("closed"))
    seen: list[int] = []

    async def on_insert(doc):
        seen.append(doc["_id"])

    burst(spec({"insert": on_insert}), InMemoryCheckpointStore())
    assert closed == []

    def on_insert_sync(doc):
        seen.append(doc["_id"])

    burst(spec({"insert": on_insert_sync}), InMemoryCheckpointStore())
    assert closed == ["closed"]


def test_sync_code_outside_the_handlers_still_gets_its_connections_closed():
    from asgiref.sync import ThreadSensitiveContext, sync_to_async

    from flowwarden_django.streams.runtime.event_loop import _made_a_thread

    async def main() -> list[bool]:
        made = []
        async with ThreadSensitiveContext() as context:
            made.append(_made_a_thread(context))
            await sync_to_async(lambda: None, thread_sensitive=True)()  # an on_error, say
            made.append(_made_a_thread(context))
        return made

    assert asyncio.run(main()) == [False, True]
