"""The contract suite on the Redis store (real server), plus Redis-only checks."""

import asyncio
import json
import threading
import uuid

import pytest

from flowwarden_django.streams.backends.redis import RedisCheckpointStore
from flowwarden_django.streams.checkpoint import Checkpoint, CheckpointStore
from flowwarden_django.testkit import AsyncCheckpointStoreContract, CheckpointStoreContract
from flowwarden_django.testkit.checkpoint_store import now_ms, sync_progress, token
from tests.support.lanes import on_lane
from tests.support.services import redis_url


def delete_keys(store):
    for key in store.client.scan_iter(match=store.key_prefix + "*"):
        store.client.delete(key)
    store.close()


@on_lane("redis")
class TestRedisCheckpointStore(CheckpointStoreContract):
    def make_store(self):
        return RedisCheckpointStore(url=redis_url(), key_prefix=f"fwtest:{uuid.uuid4().hex[:8]}:")

    def teardown_store(self, store):
        delete_keys(store)


@on_lane("redis")
class TestRedisSpecifics:
    @pytest.fixture
    def store(self):
        store = RedisCheckpointStore(url=redis_url(), key_prefix=f"fwtest:{uuid.uuid4().hex[:8]}:")
        yield store
        delete_keys(store)

    @pytest.mark.parametrize("expected", ["dead", "other"], ids=["guard-match", "guard-mismatch"])
    def test_reset_runs_in_place_and_keeps_unknown_fields(self, store, expected):
        now = now_ms()
        store.save_processed("s", token("dead"), now)
        store.client.hset(store.key("s"), "customField", "keep me")
        store.reset_after_history_lost("s", token("fresh"), token(expected), now)
        assert store.client.hget(store.key("s"), "customField") == b"keep me"
        found = store.find("s")
        assert found.last_seen_token == token("fresh")
        assert found.last_processed_token == (None if expected == "dead" else token("dead"))

    def test_layout_matches_the_reference(self, store):
        now = now_ms()
        store.save_seen("orders", token("8263"), now, now)
        raw = store.client.hgetall(store.key("orders"))
        assert store.key("orders") == f"{store.key_prefix}checkpoint:orders"
        assert set(raw) == {
            b"_v",
            b"lastSeenToken",
            b"lastSeenTimestamp",
            b"lastHeartbeatTimestamp",
        }
        assert raw[b"lastSeenTimestamp"] == str(int(now.timestamp() * 1000)).encode()

    def test_initial_sync_layout_and_unknown_fields(self, store):
        """``initialSync`` holds the JSON, ``initialSyncBatch`` the batch the script
        compares; the script touches no other field, and clearing removes both."""
        store.save_heartbeat("orders", now_ms())
        store.client.hset(store.key("orders"), "customField", "keep me")
        assert store.save_initial_sync("orders", sync_progress(12), expected_batch=None)
        raw = store.client.hgetall(store.key("orders"))
        assert json.loads(raw[b"initialSync"]) == sync_progress(12)
        assert raw[b"initialSyncBatch"] == b"12"
        assert raw[b"customField"] == b"keep me"
        assert not store.save_initial_sync("orders", None, expected_batch=1)
        assert store.save_initial_sync("orders", None, expected_batch=12)
        raw = store.client.hgetall(store.key("orders"))
        assert set(raw) == {b"_v", b"lastHeartbeatTimestamp", b"customField"}

    def test_a_refused_initial_sync_creates_no_key(self, store):
        assert not store.save_initial_sync("orders", sync_progress(1), expected_batch=0)
        assert not store.client.exists(store.key("orders"))
        assert store.save_initial_sync("orders", None, expected_batch=None)
        assert store.client.hgetall(store.key("orders")) == {b"_v": b"1"}

    def test_default_prefix_and_cache_alias(self, settings):
        store = RedisCheckpointStore(cache="redis")
        assert store.key_prefix == "fw:"
        assert store.client.ping()


class TestRedisCheckpointStoreAsync(AsyncCheckpointStoreContract, TestRedisCheckpointStore):
    """The contract through the async API."""


NATIVE_ASYNC = (
    "asave",
    "afind",
    "adelete",
    "alist_checkpoints",
    "asave_seen",
    "asave_processed",
    "asave_heartbeat",
    "areset_after_history_lost",
    "asave_initial_sync",
)


@on_lane("redis")
class TestRedisNativeAsync:
    """The async operations run on a ``redis.asyncio`` client, one per event loop."""

    @pytest.fixture
    def store(self):
        store = RedisCheckpointStore(url=redis_url(), key_prefix=f"fwtest:{uuid.uuid4().hex[:8]}:")
        yield store
        delete_keys(store)

    @pytest.fixture
    def no_thread_path(self, monkeypatch):
        """The base class's default (the sync operation in a thread) fails the test."""

        async def refuse(self, method, /, *args, **kwargs):
            raise AssertionError(f"{method.__name__} ran through the thread-based default")

        monkeypatch.setattr(CheckpointStore, "_run_sync", refuse)

    @pytest.mark.parametrize("name", NATIVE_ASYNC)
    def test_the_operation_is_overridden(self, name):
        assert getattr(RedisCheckpointStore, name) is not getattr(CheckpointStore, name)

    def test_every_operation_runs_on_the_loop_without_the_sync_client(self, store, no_thread_path):
        async def scenario():
            now = now_ms()
            await store.asave(Checkpoint("a", instance_id="i", last_seen_token=token("1")))
            await store.asave_seen("a", token("2"), now, now)
            await store.asave_processed("a", None, None)
            await store.asave_heartbeat("b", now)
            await store.areset_after_history_lost("b", token("fresh"), None, now)
            assert await store.asave_initial_sync("b", sync_progress(3), expected_batch=None)
            assert not await store.asave_initial_sync("b", None, expected_batch=1)
            found = await store.afind("a")
            assert found.last_seen_token == token("2")
            assert found.last_processed_token is None
            listed = await store.alist_checkpoints()
            assert [cp.stream_name for cp in listed] == ["a", "b"]
            assert listed[1].initial_sync == sync_progress(3)
            await store.adelete("a")
            assert await store.afind("a") is None
            return threading.get_ident()

        assert asyncio.run(scenario()) == threading.get_ident()
        assert store._client is None  # the sync client was never opened

    def test_one_client_per_loop_closed_with_its_loop(self, store, no_thread_path):
        async def scenario(stream, seen):
            first = await store.async_client()
            assert await store.async_client() is first
            seen.append(first.client)
            await store.asave_heartbeat(stream, now_ms())
            return [cp.stream_name for cp in await store.alist_checkpoints()]

        seen = []
        assert asyncio.run(scenario("one", seen)) == ["one"]
        assert not store._async_clients  # closed and dropped when the loop ended
        assert asyncio.run(scenario("two", seen)) == ["one", "two"]
        assert seen[0] is not seen[1]
        assert not store._async_clients

    def test_close_drops_the_async_clients(self, store, no_thread_path):
        async def scenario():
            assert await store.afind("a") is None
            assert store._async_clients
            store.close()
            assert not store._async_clients
            assert await store.afind("a") is None  # a fresh client for this loop

        asyncio.run(scenario())

    def test_cache_alias_gets_a_native_client(self, settings, no_thread_path):
        store = RedisCheckpointStore(cache="redis", key_prefix=f"fwtest:{uuid.uuid4().hex[:8]}:")

        async def scenario():
            await store.asave_heartbeat("a", now_ms())
            return (await store.afind("a")).last_heartbeat_at

        try:
            assert asyncio.run(scenario()) is not None
        finally:
            delete_keys(store)

    def test_a_client_that_cannot_be_mirrored_falls_back_to_a_thread(self):
        import redis

        client = redis.Redis.from_url(
            redis_url(), redis_connect_func=lambda connection: connection.on_connect()
        )
        store = RedisCheckpointStore(client=client, key_prefix=f"fwtest:{uuid.uuid4().hex[:8]}:")

        async def scenario():
            assert await store.async_client() is None
            await store.asave_heartbeat("a", now_ms())
            return (await store.afind("a")).last_heartbeat_at, threading.get_ident()

        try:
            found, ident = asyncio.run(scenario())
            assert found is not None
            assert ident == threading.get_ident()
        finally:
            delete_keys(store)
            client.close()
