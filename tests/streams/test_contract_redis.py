"""The contract suite on the Redis store (real server), plus Redis-only checks."""

import json
import uuid

import pytest

from flowwarden_django.streams.backends.redis import RedisCheckpointStore
from flowwarden_django.testkit import AsyncCheckpointStoreContract, CheckpointStoreContract
from flowwarden_django.testkit.checkpoint_store import now_ms, sync_progress, token
from tests.lanes import on_lane
from tests.services import SERVICES


def redis_url() -> str:
    return f"redis://{SERVICES['redis'].address}/15"


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
