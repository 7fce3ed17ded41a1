"""The SPI itself: the record, the no-op store, the read-modify-write defaults,
the store registry, and proof that the race tests catch a store that is not atomic."""

import threading
import time
from datetime import datetime
from types import MappingProxyType

import pytest
from django.test import override_settings

from flowwarden_django.exceptions import InvalidCheckpointStoreError
from flowwarden_django.streams import Checkpoint, CheckpointStore, checkpoint_stores
from flowwarden_django.streams.backends.memory import InMemoryCheckpointStore
from flowwarden_django.streams.backends.orm import OrmCheckpointStore
from flowwarden_django.streams.tokens import token_from_json, token_to_json, tokens_equal
from flowwarden_django.testkit import AsyncCheckpointStoreContract, CheckpointStoreContract
from flowwarden_django.testkit.checkpoint_store import now_ms, sync_progress, token


class ThreeMethodStore(CheckpointStore):
    """A minimal backend: only the abstract methods, everything else from the defaults."""

    def __init__(self, delay: float = 0.0):
        self._records = {}
        self._lock = threading.Lock()
        self.delay = delay

    def save(self, checkpoint):
        with self._lock:
            self._records[checkpoint.stream_name] = checkpoint

    def find(self, stream_name):
        with self._lock:
            found = self._records.get(stream_name)
        time.sleep(self.delay)  # a network round trip, to widen the read-modify-write window
        return found

    def delete(self, stream_name):
        with self._lock:
            self._records.pop(stream_name, None)


class TestDefaultsForASingleWriter(CheckpointStoreContract):
    """The read-modify-write defaults are correct as long as nothing races them."""

    def make_store(self):
        return ThreeMethodStore()

    def thread_finished(self):
        pass

    @pytest.fixture(autouse=True)
    def _skip_races(self, request):
        races = (
            "test_concurrent_anchor_writers",
            "test_processed_write_racing_reset",
            "test_concurrent_initial_sync_writers",
            "test_initial_sync_racing_record_creation",
        )
        if request.node.name.startswith(races):
            pytest.skip("the defaults are documented as unsafe under concurrent writers")
        kept = ("round_trip_exactly", "in_utc", "initial_sync_is_a_copy")
        if any(part in request.node.name for part in kept):
            pytest.skip("ThreeMethodStore keeps the caller's objects")


class RacingContract(CheckpointStoreContract):
    race_writes = 200
    reset_race_rounds = 40

    def thread_finished(self):
        pass


def test_anchor_race_catches_read_modify_write():
    with pytest.raises(AssertionError):
        RacingContract().test_concurrent_anchor_writers_never_go_back(
            ThreeMethodStore(delay=0.0005), "race"
        )


def test_reset_race_catches_a_non_atomic_guard():
    with pytest.raises(AssertionError):
        RacingContract().test_processed_write_racing_reset_is_never_removed(
            ThreeMethodStore(delay=0.002), "race"
        )


def test_initial_sync_race_catches_a_non_atomic_condition():
    with pytest.raises(AssertionError):
        RacingContract().test_concurrent_initial_sync_writers_one_wins_each_batch(
            ThreeMethodStore(delay=0.002), "race"
        )


def test_initial_sync_creation_race_catches_a_read_modify_write():
    with pytest.raises(AssertionError):
        RacingContract().test_initial_sync_racing_record_creation_is_never_refused(
            ThreeMethodStore(delay=0.002), "race"
        )


def test_checkpoint_validates_its_fields():
    with pytest.raises(ValueError, match="stream_name"):
        Checkpoint("")
    with pytest.raises(ValueError, match="timezone-aware"):
        Checkpoint("s", last_seen_at=datetime(2026, 1, 1))
    with pytest.raises(TypeError, match="BSON document"):
        Checkpoint("s", last_processed_token="8263")
    assert Checkpoint("s", metadata=None).metadata == {}


def test_checkpoint_validates_initial_sync():
    assert Checkpoint("s").initial_sync is None
    progress = sync_progress(0)
    assert Checkpoint("s", initial_sync=progress).initial_sync is progress
    assert Checkpoint("s", initial_sync=MappingProxyType({"batch": 2})).initial_sync["batch"] == 2
    with pytest.raises(TypeError, match="mapping or None"):
        Checkpoint("s", initial_sync=[("batch", 1)])
    with pytest.raises(
        TypeError, match=r"initial_sync\['batch'\] must be an int >= 0, not missing"
    ):
        Checkpoint("s", initial_sync={"phase": "copying"})
    with pytest.raises(TypeError, match="not a bool"):
        Checkpoint("s", initial_sync={"batch": False})
    with pytest.raises(ValueError, match="from 0 to 2"):
        Checkpoint("s", initial_sync={"batch": -1})
    with pytest.raises(TypeError, match=r"initial_sync\['at'\] is a datetime"):
        Checkpoint("s", initial_sync={"batch": 1, "at": now_ms()})
    with pytest.raises(ValueError, match=r"initial_sync\['n'\]\[1\] = nan"):
        Checkpoint("s", initial_sync={"batch": 1, "n": [1, float("nan")]})


def test_save_initial_sync_needs_a_keyword_expected_batch():
    store = InMemoryCheckpointStore()
    with pytest.raises(TypeError):
        store.save_initial_sync("s", sync_progress(0), None)  # type: ignore[misc]
    assert store.find("s") is None


def test_noop_store_is_shared_and_ignores_everything():
    store = CheckpointStore.noop()
    assert store is CheckpointStore.noop()
    store.save(Checkpoint("s"))
    store.save_processed("s", token("p"), now_ms())
    store.reset_after_history_lost("s", token("f"), None, now_ms())
    assert store.save_initial_sync("s", sync_progress(3), expected_batch=2) is True
    assert store.find("s") is None
    assert store.list_checkpoints() == []
    with pytest.raises(ValueError):
        store.save_heartbeat("s", datetime(2026, 1, 1))
    with pytest.raises(TypeError):
        store.save_initial_sync("s", {"phase": "copying"}, expected_batch=None)


def test_tokens_helpers():
    assert tokens_equal(None, None)
    assert not tokens_equal({"a": 1, "b": 2}, {"b": 2, "a": 1})
    assert token_from_json(token_to_json({"_data": "82"})) == {"_data": "82"}
    with pytest.raises(ValueError, match="JSON object"):
        token_from_json("[1]")
    with pytest.raises(ValueError, match="Extended JSON"):
        token_from_json("{nope")


def test_registry_builds_one_store_per_alias():
    assert isinstance(checkpoint_stores["default"], OrmCheckpointStore)
    assert checkpoint_stores["default"] is checkpoint_stores["default"]
    with pytest.raises(InvalidCheckpointStoreError, match="configured aliases: default"):
        checkpoint_stores["missing"]


def test_registry_follows_setting_changes():
    memory = "flowwarden_django.streams.backends.memory.InMemoryCheckpointStore"
    with override_settings(FLOWWARDEN={"CHECKPOINT_STORES": {"default": {"BACKEND": memory}}}):
        assert isinstance(checkpoint_stores["default"], InMemoryCheckpointStore)
        assert checkpoint_stores.all() == [checkpoint_stores["default"]]
    assert isinstance(checkpoint_stores["default"], OrmCheckpointStore)


def test_registry_reports_bad_options_with_the_setting():
    orm = "flowwarden_django.streams.backends.orm.OrmCheckpointStore"
    bad = {"CHECKPOINT_STORES": {"default": {"BACKEND": orm, "OPTIONS": {"nope": 1}}}}
    expected = r'\["default"\]\["OPTIONS"\]'
    with (
        override_settings(FLOWWARDEN=bad),
        pytest.raises(InvalidCheckpointStoreError, match=expected),
    ):
        checkpoint_stores["default"]


class TestDefaultsForASingleWriterAsync(AsyncCheckpointStoreContract, TestDefaultsForASingleWriter):
    """The async defaults on the read-modify-write defaults."""
