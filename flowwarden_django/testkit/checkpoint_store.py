"""The ``CheckpointStore`` contract: the reference suite plus what it lacked.

Covers upsert/find/delete, the field isolation of every partial operation, the
anchor+heartbeat writes, the history-lost reset and its guard, and, beyond the
reference, races made to happen with real threads, the preservation of
``instance_id``/``metadata`` by partial writes, exact BSON token round trips, and
the conditional ``save_initial_sync`` (its condition, its isolation from the other
writes, exact JSON round trips, and its atomicity under concurrent writers).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from ..streams.checkpoint import Checkpoint, CheckpointStore
from ._async_driven import async_driven


def now_ms() -> datetime:
    """The current UTC time truncated to milliseconds, the precision every store keeps."""
    moment = datetime.now(UTC)
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def token(label: str) -> dict[str, str]:
    """A resume token shaped like the server's."""
    return {"_data": label}


def sync_progress(batch: int, **changes: Any) -> dict[str, Any]:
    """An initial-sync progress mapping shaped like the runtime's."""
    return {
        "phase": "copying",
        "batch": batch,
        "last_id": '{"$oid": "65a1b2c3d4e5f60718293a4b"}',
        "copied": batch * 1000,
        "estimated": 50000,
        "started_at": "2026-06-01T12:30:15.123000+00:00",
        **changes,
    }


def _same(actual: Any, expected: Any, path: str, *, ordered: bool) -> None:
    """Assert equal values with identical types, recursively; with *ordered*, dict
    keys in the same order too."""
    assert type(actual) is type(expected), (
        f"{path}: type {type(actual).__name__}, expected {type(expected).__name__}"
    )
    if isinstance(expected, dict):
        keys, wanted = (list(actual), list(expected)) if ordered else (set(actual), set(expected))
        assert keys == wanted, f"{path}: keys {keys} != {wanted}"
        for key in expected:
            _same(actual[key], expected[key], f"{path}.{key}", ordered=ordered)
    elif isinstance(expected, list):
        assert len(actual) == len(expected), f"{path}: length differs"
        for index, (left, right) in enumerate(zip(actual, expected, strict=True)):
            _same(left, right, f"{path}[{index}]", ordered=ordered)
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def _same_json(actual: Any, expected: Any, path: str = "initial_sync") -> None:
    """Equal JSON values with identical types; key order is free (PostgreSQL's jsonb
    reorders keys)."""
    _same(actual, expected, path, ordered=False)


def _same_bson(actual: Any, expected: Any, path: str = "token") -> None:
    """Equal BSON values with identical types and key order (tokens compare exactly)."""
    _same(actual, expected, path, ordered=True)


class CheckpointStoreContract:
    """Behaviour every ``CheckpointStore`` must have. Subclass it and implement
    :meth:`make_store`; override :meth:`clean_state` if the store needs wiping.

    Each test uses stream names of its own, so a shared backend needs no cleanup.
    The race tests run real threads; :meth:`thread_finished` closes the Django
    connections each thread opened.
    """

    #: Writes per anchor in the two-writer race.
    race_writes: int = 2000
    #: Rounds of the processed-write versus reset race.
    reset_race_rounds: int = 100
    #: Rounds of the two initial-sync races.
    initial_sync_race_rounds: int = 50
    #: Threads competing for each batch in the initial-sync race.
    initial_sync_writers: int = 4

    def make_store(self) -> CheckpointStore:
        """Return the store under test."""
        raise NotImplementedError("Subclasses return the store under test")

    def clean_state(self, store: CheckpointStore) -> None:
        """Wipe the store before each test (nothing by default)."""

    def teardown_store(self, store: CheckpointStore) -> None:
        """Release or wipe the store after each test (``store.close()`` by default)."""
        store.close()

    def thread_finished(self) -> None:
        """Called at the end of every worker thread the race tests start."""
        from django.db import connections

        connections.close_all()

    @pytest.fixture
    def store(self) -> Iterator[CheckpointStore]:
        store = self.make_store()
        self.clean_state(store)
        yield store
        self.teardown_store(store)

    @pytest.fixture
    def name(self) -> str:
        return f"contract-{uuid.uuid4().hex[:12]}"

    def run_threads(self, *targets: Callable[[], None]) -> None:
        """Run *targets* in threads, wait for all, and re-raise the first error."""
        errors: list[BaseException] = []

        def wrap(target: Callable[[], None]) -> Callable[[], None]:
            def run() -> None:
                try:
                    target()
                except BaseException as exc:  # re-raised below, in the test's thread
                    errors.append(exc)
                finally:
                    self.thread_finished()

            return run

        threads = [threading.Thread(target=wrap(t), daemon=True) for t in targets]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
            assert not thread.is_alive(), "a worker thread did not finish within 600 s"
        if errors:
            raise errors[0]

    # -- save / find / delete (reference 1-5) ----------------------------------

    def test_save_and_find(self, store: CheckpointStore, name: str) -> None:
        now = now_ms()
        store.save(
            Checkpoint(
                name,
                "pod-a",
                token("T"),
                now,
                token("T"),
                now,
                None,
                {"env": "test"},
                sync_progress(4),
            )
        )
        found = store.find(name)
        assert found is not None
        assert found.stream_name == name
        assert found.instance_id == "pod-a"
        assert found.last_seen_token == token("T")
        assert found.last_seen_at == now
        assert found.last_processed_token == token("T")
        assert found.last_processed_at == now
        assert found.last_heartbeat_at is None
        assert found.metadata["env"] == "test"
        assert found.initial_sync == sync_progress(4)

    def test_save_updates_existing(self, store: CheckpointStore, name: str) -> None:
        now = now_ms()
        store.save(Checkpoint(name, None, token("t1"), now))
        store.save(Checkpoint(name, "pod-b", token("t2"), now, token("t2"), now))
        found = store.find(name)
        assert found is not None
        assert found.last_seen_token == token("t2")
        assert found.instance_id == "pod-b"
        assert found.last_processed_token == token("t2")

    def test_save_replaces_the_whole_record(self, store: CheckpointStore, name: str) -> None:
        now = now_ms()
        store.save(
            Checkpoint(
                name, "pod-a", token("a"), now, token("b"), now, now, {"k": 1}, sync_progress(2)
            )
        )
        store.save(Checkpoint(name))
        assert store.find(name) == Checkpoint(name)

    def test_find_returns_none_when_not_found(self, store: CheckpointStore, name: str) -> None:
        assert store.find(name) is None

    def test_delete_removes_checkpoint(self, store: CheckpointStore, name: str) -> None:
        store.save(Checkpoint(name))
        assert store.find(name) == Checkpoint(name), "an all-null record must still be found"
        store.delete(name)
        assert store.find(name) is None

    def test_delete_non_existent_does_not_raise(self, store: CheckpointStore, name: str) -> None:
        store.delete(name)
        assert store.find(name) is None

    # -- partial writes (reference 6-15, 20) --------------------------------------

    def test_save_seen_does_not_overwrite_processed(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        store.save(Checkpoint(name, None, token("seen1"), now, token("processed1"), now))
        store.save_seen(name, token("seen2"), now + timedelta(seconds=10))
        found = store.find(name)
        assert found.last_seen_token == token("seen2")
        assert found.last_seen_at == now + timedelta(seconds=10)
        assert found.last_processed_token == token("processed1")
        assert found.last_processed_at == now

    def test_save_processed_does_not_overwrite_seen(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        store.save(Checkpoint(name, None, token("seen1"), now, token("processed1"), now))
        store.save_processed(name, token("processed2"), now + timedelta(seconds=10))
        found = store.find(name)
        assert found.last_processed_token == token("processed2")
        assert found.last_processed_at == now + timedelta(seconds=10)
        assert found.last_seen_token == token("seen1")
        assert found.last_seen_at == now

    def test_save_seen_creates_record_if_missing(self, store: CheckpointStore, name: str) -> None:
        now = now_ms()
        store.save_seen(name, token("seen"), now)
        found = store.find(name)
        assert found is not None
        assert (found.last_seen_token, found.last_seen_at) == (token("seen"), now)
        assert (found.last_processed_token, found.last_processed_at) == (None, None)

    def test_save_processed_creates_record_if_missing(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        store.save_processed(name, token("processed"), now)
        found = store.find(name)
        assert found is not None
        assert (found.last_processed_token, found.last_processed_at) == (token("processed"), now)
        assert (found.last_seen_token, found.last_seen_at) == (None, None)

    def test_save_and_find_round_trips_heartbeat(self, store: CheckpointStore, name: str) -> None:
        now = now_ms()
        store.save(Checkpoint(name, None, token("s"), now, token("p"), now, now, {}))
        assert store.find(name).last_heartbeat_at == now

    def test_save_seen_with_heartbeat_writes_both(self, store: CheckpointStore, name: str) -> None:
        now = now_ms()
        store.save(Checkpoint(name, None, None, None, token("p"), now))
        store.save_seen(
            name, token("seen"), now + timedelta(seconds=10), now + timedelta(seconds=11)
        )
        found = store.find(name)
        assert found.last_seen_token == token("seen")
        assert found.last_seen_at == now + timedelta(seconds=10)
        assert found.last_heartbeat_at == now + timedelta(seconds=11)
        assert (found.last_processed_token, found.last_processed_at) == (token("p"), now)

    def test_save_processed_with_heartbeat_writes_both(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        store.save(Checkpoint(name, None, token("s"), now))
        store.save_processed(
            name, token("p"), now + timedelta(seconds=10), now + timedelta(seconds=11)
        )
        found = store.find(name)
        assert found.last_processed_token == token("p")
        assert found.last_processed_at == now + timedelta(seconds=10)
        assert found.last_heartbeat_at == now + timedelta(seconds=11)
        assert (found.last_seen_token, found.last_seen_at) == (token("s"), now)

    def test_save_processed_with_heartbeat_creates_record_if_missing(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        store.save_processed(name, token("p"), now, now + timedelta(seconds=1))
        found = store.find(name)
        assert found.last_processed_token == token("p")
        assert found.last_processed_at == now
        assert found.last_heartbeat_at == now + timedelta(seconds=1)
        assert found.last_seen_token is None

    def test_save_heartbeat_touches_only_the_heartbeat(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        store.save(Checkpoint(name, None, token("s"), now, token("p"), now))
        store.save_heartbeat(name, now + timedelta(seconds=30))
        found = store.find(name)
        assert found.last_heartbeat_at == now + timedelta(seconds=30)
        assert (found.last_seen_token, found.last_seen_at) == (token("s"), now)
        assert (found.last_processed_token, found.last_processed_at) == (token("p"), now)

    def test_save_heartbeat_creates_record_if_missing(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        store.save_heartbeat(name, now)
        found = store.find(name)
        assert found is not None
        assert found.last_heartbeat_at == now
        assert found.last_seen_token is None
        assert found.last_processed_token is None

    def test_save_processed_without_heartbeat_keeps_heartbeat(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        store.save(Checkpoint(name, None, token("s"), now, None, None, now, {}))
        store.save_processed(name, token("p"), now + timedelta(seconds=5))
        found = store.find(name)
        assert found.last_heartbeat_at == now
        assert found.last_processed_token == token("p")

    def test_save_seen_without_heartbeat_keeps_heartbeat(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        store.save(Checkpoint(name, None, None, None, token("p"), now, now, {}))
        store.save_seen(name, token("s"), now + timedelta(seconds=5))
        assert store.find(name).last_heartbeat_at == now

    # -- history-lost reset (reference 16-19) ------------------------------------

    def _dead_state(self, store: CheckpointStore, name: str, now: datetime) -> None:
        store.save(
            Checkpoint(
                name,
                "pod-a",
                token("deadSeen"),
                now,
                token("deadProcessed"),
                now,
                now,
                {"env": "test"},
            )
        )

    def test_reset_installs_fresh_seen_and_clears_processed(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        recovery = now + timedelta(seconds=60)
        self._dead_state(store, name, now)
        store.reset_after_history_lost(name, token("fresh"), token("deadProcessed"), recovery)
        found = store.find(name)
        assert (found.last_seen_token, found.last_seen_at) == (token("fresh"), recovery)
        assert found.last_heartbeat_at == recovery
        assert (found.last_processed_token, found.last_processed_at) == (None, None)
        assert found.instance_id == "pod-a"
        assert found.metadata == {"env": "test"}

    def test_reset_keeps_a_processed_anchor_replaced_concurrently(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        recovery = now + timedelta(seconds=60)
        store.save(
            Checkpoint(
                name,
                "pod-a",
                token("deadSeen"),
                now,
                token("freshProcessed"),
                now,
                now,
                {"env": "test"},
            )
        )
        store.reset_after_history_lost(name, token("fresh"), token("deadProcessed"), recovery)
        found = store.find(name)
        assert (found.last_processed_token, found.last_processed_at) == (
            token("freshProcessed"),
            now,
        )
        assert (found.last_seen_token, found.last_seen_at) == (token("fresh"), recovery)
        assert found.last_heartbeat_at == recovery
        assert found.instance_id == "pod-a"
        assert found.metadata == {"env": "test"}

    def test_reset_without_fresh_token_clears_both_pairs_and_heartbeat(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        self._dead_state(store, name, now)
        store.reset_after_history_lost(name, None, token("deadProcessed"), now)
        found = store.find(name)
        assert (found.last_seen_token, found.last_seen_at) == (None, None)
        assert (found.last_processed_token, found.last_processed_at) == (None, None)
        assert found.last_heartbeat_at is None, (
            "a heartbeat without any recoverable position would be a lie"
        )
        assert found.instance_id == "pod-a"
        assert found.metadata == {"env": "test"}

    def test_reset_creates_record_if_missing(self, store: CheckpointStore, name: str) -> None:
        recovery = now_ms()
        store.reset_after_history_lost(name, token("fresh"), None, recovery)
        found = store.find(name)
        assert found is not None
        assert (found.last_seen_token, found.last_seen_at) == (token("fresh"), recovery)
        assert found.last_heartbeat_at == recovery
        assert found.last_processed_token is None

    def test_reset_with_expected_none_keeps_an_existing_processed_anchor(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        store.save_processed(name, token("p"), now)
        store.reset_after_history_lost(name, token("fresh"), None, now)
        assert store.find(name).last_processed_token == token("p")

    # -- initial-sync progress: save_initial_sync ------------------------------------

    def _full_record(self, name: str, now: datetime, progress: Any = None) -> Checkpoint:
        return Checkpoint(
            name, "pod-a", token("s"), now, token("p"), now, now, {"env": "test"}, progress
        )

    def test_save_initial_sync_creates_the_record_if_missing(
        self, store: CheckpointStore, name: str
    ) -> None:
        assert store.save_initial_sync(name, sync_progress(0), expected_batch=None) is True
        assert store.find(name) == Checkpoint(name, initial_sync=sync_progress(0))

    def test_save_initial_sync_sets_progress_on_a_record_without_it(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        store.save(self._full_record(name, now))
        assert store.save_initial_sync(name, sync_progress(0), expected_batch=None) is True
        assert store.find(name) == self._full_record(name, now, sync_progress(0))

    def test_save_initial_sync_replaces_progress_of_the_expected_batch(
        self, store: CheckpointStore, name: str
    ) -> None:
        store.save_initial_sync(name, sync_progress(0), expected_batch=None)
        for batch in range(1, 4):
            written = store.save_initial_sync(name, sync_progress(batch), expected_batch=batch - 1)
            assert written is True
            assert store.find(name).initial_sync == sync_progress(batch)
        # The same batch again: the stored batch is what is compared, not the new one.
        repeat = sync_progress(3, copied=3500)
        assert store.save_initial_sync(name, repeat, expected_batch=3) is True
        assert store.find(name).initial_sync == repeat
        # Writing exactly what is stored is still a successful write (MySQL's
        # rowcount counts changed rows unless the client asks for found rows).
        assert store.save_initial_sync(name, repeat, expected_batch=3) is True
        # A batch may go back (a restarted copy): nothing orders batches but the caller.
        assert store.save_initial_sync(name, sync_progress(0), expected_batch=3) is True
        assert store.find(name).initial_sync == sync_progress(0)

    def test_save_initial_sync_refuses_another_batch_and_writes_nothing(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        stored = sync_progress(3)
        store.save(self._full_record(name, now, stored))
        for expected in (None, 0, 2, 4, 2**62):
            for progress in (sync_progress(9), None):
                assert store.save_initial_sync(name, progress, expected_batch=expected) is False, (
                    f"expected_batch={expected} matched a stored batch 3"
                )
        assert store.find(name) == self._full_record(name, now, stored)

    def test_save_initial_sync_batch_zero_is_not_no_progress(
        self, store: CheckpointStore, name: str
    ) -> None:
        store.save_initial_sync(name, sync_progress(0), expected_batch=None)
        assert store.save_initial_sync(name, sync_progress(1), expected_batch=None) is False
        assert store.save_initial_sync(name, None, expected_batch=None) is False
        assert store.find(name).initial_sync == sync_progress(0)
        assert store.save_initial_sync(name, sync_progress(1), expected_batch=0) is True

    def test_save_initial_sync_clears(self, store: CheckpointStore, name: str) -> None:
        now = now_ms()
        store.save(self._full_record(name, now, sync_progress(5)))
        assert store.save_initial_sync(name, None, expected_batch=5) is True
        assert store.find(name) == self._full_record(name, now)
        # Cleared is "no progress": None matches it again, and clearing again is a no-op.
        assert store.save_initial_sync(name, None, expected_batch=None) is True
        assert store.save_initial_sync(name, None, expected_batch=5) is False
        assert store.find(name) == self._full_record(name, now)
        assert store.save_initial_sync(name, sync_progress(0), expected_batch=None) is True
        assert store.find(name).initial_sync == sync_progress(0)

    def test_save_initial_sync_clearing_a_missing_record_creates_it(
        self, store: CheckpointStore, name: str
    ) -> None:
        assert store.save_initial_sync(name, None, expected_batch=None) is True
        assert store.find(name) == Checkpoint(name)

    def test_save_initial_sync_expecting_a_batch_creates_no_record(
        self, store: CheckpointStore, name: str
    ) -> None:
        assert store.save_initial_sync(name, sync_progress(1), expected_batch=0) is False
        assert store.save_initial_sync(name, None, expected_batch=0) is False
        assert store.find(name) is None
        assert store.save_initial_sync(name, sync_progress(0), expected_batch=None) is True

    def test_save_initial_sync_touches_no_other_field(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        store.save(self._full_record(name, now))
        store.save_initial_sync(name, sync_progress(0), expected_batch=None)
        store.save_initial_sync(name, sync_progress(1), expected_batch=0)
        store.save_initial_sync(name, sync_progress(7), expected_batch=5)  # refused
        assert store.find(name) == self._full_record(name, now, sync_progress(1))
        store.save_initial_sync(name, None, expected_batch=1)
        assert store.find(name) == self._full_record(name, now)

    def test_partial_writes_keep_initial_sync(self, store: CheckpointStore, name: str) -> None:
        now = now_ms()
        progress = sync_progress(6)
        store.save_initial_sync(name, progress, expected_batch=None)
        store.save_seen(name, token("s1"), now)
        store.save_seen(name, token("s2"), now, now)
        store.save_processed(name, token("p1"), now)
        store.save_processed(name, token("p2"), now, now)
        store.save_heartbeat(name, now)
        store.reset_after_history_lost(name, token("fresh"), token("other"), now)
        store.reset_after_history_lost(name, token("fresh"), token("p2"), now)
        store.reset_after_history_lost(name, None, None, now)
        assert store.find(name).initial_sync == progress
        # ... and the condition still sees the stored batch.
        assert store.save_initial_sync(name, sync_progress(7), expected_batch=6) is True

    def test_partial_writes_creating_the_record_store_no_progress(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        writes = {
            "seen": lambda stream: store.save_seen(stream, token("s"), now, now),
            "processed": lambda stream: store.save_processed(stream, token("p"), now),
            "heartbeat": lambda stream: store.save_heartbeat(stream, now),
            "reset": lambda stream: store.reset_after_history_lost(stream, None, None, now),
        }
        for label, write in writes.items():
            stream = f"{name}-{label}"
            write(stream)
            assert store.find(stream).initial_sync is None
            assert store.save_initial_sync(stream, sync_progress(0), expected_batch=None), label

    def test_save_replaces_initial_sync_and_the_condition_follows(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        store.save_initial_sync(name, sync_progress(2), expected_batch=None)
        store.save(self._full_record(name, now))  # a full replace: no progress
        assert store.find(name).initial_sync is None
        assert store.save_initial_sync(name, sync_progress(3), expected_batch=2) is False
        store.save(self._full_record(name, now, sync_progress(7)))
        assert store.find(name).initial_sync == sync_progress(7)
        assert store.save_initial_sync(name, sync_progress(8), expected_batch=None) is False
        assert store.save_initial_sync(name, sync_progress(8), expected_batch=7) is True
        assert store.find(name) == self._full_record(name, now, sync_progress(8))

    def test_delete_removes_initial_sync(self, store: CheckpointStore, name: str) -> None:
        store.save_initial_sync(name, sync_progress(3), expected_batch=None)
        store.delete(name)
        assert store.find(name) is None
        assert store.save_initial_sync(name, sync_progress(4), expected_batch=3) is False
        assert store.save_initial_sync(name, sync_progress(0), expected_batch=None) is True

    def test_initial_sync_round_trips_exactly_as_json(
        self, store: CheckpointStore, name: str
    ) -> None:
        original = sync_progress(
            2**62,
            copied=2**62,
            rate=0.25,
            whole=1.0,
            tiny=1e-07,
            near_limit=9999999999999998.0,
            negative=-1.5,
            big=2**63 - 1,
            smallest=-(2**63),
            zero=0,
            flag=True,
            off=False,
            nothing=None,
            text="é 😀 \\ \" ' \n\t <&>",
            empty_text="",
            empty_list=[],
            empty_dict={},
            nested={"list": [1, 2.5, None, True, "x", {"deep": [[], {}]}], "k": {"z": -1}},
        )
        store.save_initial_sync(name, original, expected_batch=None)
        _same_json(store.find(name).initial_sync, original)
        store.save(Checkpoint(name, initial_sync=original))
        _same_json(store.find(name).initial_sync, original, "saved initial_sync")
        assert store.save_initial_sync(name, None, expected_batch=2**62) is True

    def test_initial_sync_is_a_copy(self, store: CheckpointStore, name: str) -> None:
        """Changing the caller's mapping after the write changes nothing stored."""
        progress = sync_progress(0, nested={"ids": [1]})
        store.save_initial_sync(name, progress, expected_batch=None)
        progress["copied"] = -1
        progress["nested"]["ids"].append(2)
        assert store.find(name).initial_sync == sync_progress(0, nested={"ids": [1]})
        found = store.find(name)
        found.initial_sync["nested"]["ids"].append(3)
        assert store.find(name).initial_sync == sync_progress(0, nested={"ids": [1]})

    def test_list_checkpoints_shows_initial_sync(self, store: CheckpointStore, name: str) -> None:
        if not store.supports_listing:
            pytest.skip(f"{type(store).__name__} does not support listing")
        store.save_initial_sync(f"{name}-a", sync_progress(5), expected_batch=None)
        store.save_heartbeat(f"{name}-b", now_ms())
        listed = [cp for cp in store.list_checkpoints() if cp.stream_name.startswith(name)]
        assert [cp.initial_sync for cp in listed] == [sync_progress(5), None]

    def test_save_initial_sync_rejects_bad_input(self, store: CheckpointStore, name: str) -> None:
        bad_progress: list[tuple[Any, type[Exception]]] = [
            ("batch", TypeError),
            ([("batch", 1)], TypeError),
            ({}, TypeError),
            ({"batch": None}, TypeError),
            ({"batch": -1}, ValueError),
            ({"batch": 2**63}, ValueError),
            ({"batch": True}, TypeError),
            ({"batch": 1.0}, TypeError),
            ({"batch": "1"}, TypeError),
            ({"batch": 1, "at": datetime.now(UTC)}, TypeError),
            ({"batch": 1, "pair": (1, 2)}, TypeError),
            ({"batch": 1, "nested": {"set": {1}}}, TypeError),
            ({"batch": 1, "list": [b"bytes"]}, TypeError),
            ({"batch": 1, 5: "key"}, TypeError),
            ({"batch": 1, "nan": float("nan")}, ValueError),
            ({"batch": 1, "inf": float("-inf")}, ValueError),
            ({"batch": 1, "huge": 1e16}, ValueError),
            ({"batch": 1, "huge": 2**64}, ValueError),
            ({"batch": 1, "a.b": 1}, ValueError),
            ({"batch": 1, "$op": 1}, ValueError),
            ({"batch": 1, "text": "nul\x00"}, ValueError),
            ({"batch": 1, "text": "\ud800"}, ValueError),
        ]
        for progress, error in bad_progress:
            with pytest.raises(error):
                store.save_initial_sync(name, progress, expected_batch=None)
        for expected, error in [(-1, ValueError), (True, TypeError), ("0", TypeError)]:
            with pytest.raises(error):
                store.save_initial_sync(name, sync_progress(0), expected_batch=expected)
        with pytest.raises(TypeError):
            store.save_initial_sync(name, sync_progress(0))  # type: ignore[call-arg]
        for bad_name in ("", "x" * 256, 5):
            with pytest.raises(ValueError):
                store.save_initial_sync(
                    bad_name,  # type: ignore[arg-type]
                    sync_progress(0),
                    expected_batch=None,
                )
        assert store.find(name) is None, "a rejected write must not create the record"
        store.save_initial_sync(name, sync_progress(1), expected_batch=None)
        with pytest.raises(TypeError):
            store.save_initial_sync(name, {"batch": 2, "at": now_ms()}, expected_batch=1)
        assert store.find(name).initial_sync == sync_progress(1)

    # -- beyond the reference ------------------------------------------------------

    def test_partial_writes_keep_instance_id_and_metadata(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        metadata = {"env": "test", "nested": {"n": 3, "tags": ["a", "b"]}}
        store.save(Checkpoint(name, "pod-a", None, None, None, None, None, metadata))
        store.save_seen(name, token("s1"), now)
        store.save_seen(name, token("s2"), now, now)
        store.save_processed(name, token("p1"), now)
        store.save_processed(name, token("p2"), now, now)
        store.save_heartbeat(name, now)
        store.reset_after_history_lost(name, token("fresh"), token("other"), now)
        store.reset_after_history_lost(name, None, token("p2"), now)
        found = store.find(name)
        assert found.instance_id == "pod-a"
        assert dict(found.metadata) == metadata

    def test_tokens_round_trip_exactly_as_bson(self, store: CheckpointStore, name: str) -> None:
        bson = pytest.importorskip("bson")
        from bson import Binary, Int64, Timestamp

        original = {
            "_data": "8263A1B2C3000000012B022C0100296E5A1004",
            "raw": Binary(b"\x00\x01\xfe\xff", 0),
            "uuid": Binary(uuid.UUID(int=7).bytes, 4),
            "clusterTime": Timestamp(1_700_000_000, 42),
            "big": Int64(2**40),
            "small": 7,
            "float": 1.5,
            "flag": True,
            "nothing": None,
            "nested": {"list": [1, Int64(-(2**62)), {"deep": Binary(b"z", 5)}], "s": "é"},
        }
        expected = bson.decode(bson.encode(original))
        now = now_ms()
        store.save_processed(name, original, now)
        store.save_seen(name, original, now)
        found = store.find(name)
        _same_bson(found.last_processed_token, expected, "last_processed_token")
        _same_bson(found.last_seen_token, expected, "last_seen_token")
        store.save(Checkpoint(name, None, original, now, original, now))
        _same_bson(store.find(name).last_processed_token, expected, "saved token")

    def test_reset_guard_compares_tokens_exactly(self, store: CheckpointStore, name: str) -> None:
        pytest.importorskip("bson")
        from bson import Binary, Int64, Timestamp

        now = now_ms()

        stored = {
            "_data": "82AA",
            "ts": Timestamp(10, 1),
            "bin": Binary(b"\x01\x02", 5),
            "n": Int64(5),
        }
        near_misses = [
            {**stored, "_data": "82aa"},
            {**stored, "ts": Timestamp(10, 2)},
            {**stored, "bin": Binary(b"\x01\x03", 5)},
            {**stored, "bin": Binary(b"\x01\x02", 0)},
            {**stored, "n": 5},
            {**stored, "n": 5.0},
            {"ts": Timestamp(10, 1), "_data": "82AA", "bin": Binary(b"\x01\x02", 5), "n": Int64(5)},
            {"_data": "82AA", "ts": Timestamp(10, 1), "bin": Binary(b"\x01\x02", 5)},
        ]
        store.save_processed(name, stored, now)
        for miss in near_misses:
            store.reset_after_history_lost(name, token("fresh"), miss, now)
            assert store.find(name).last_processed_token is not None, f"{miss} matched {stored}"
        store.reset_after_history_lost(name, token("fresh"), dict(stored), now)
        assert store.find(name).last_processed_token is None

    def test_rejects_bad_input(self, store: CheckpointStore, name: str) -> None:
        naive = datetime(2026, 1, 1)
        now = now_ms()
        with pytest.raises(TypeError):
            store.save_seen(name, ["not", "a", "document"], now)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            store.save_processed(name, token("p"), naive)
        with pytest.raises(ValueError):
            store.save_heartbeat(name, naive)
        with pytest.raises(TypeError):
            store.save_heartbeat(name, None)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            store.reset_after_history_lost(name, token("f"), None, None)  # type: ignore[arg-type]
        for bad_name in ("", "x" * 256, 5):
            with pytest.raises(ValueError):
                store.save_processed(bad_name, token("p"), now)  # type: ignore[arg-type]
        assert store.find(name) is None, "a rejected write must not create the record"

    def test_stream_names_are_exact(self, store: CheckpointStore, name: str) -> None:
        """Names differing only in case or a trailing space are different streams."""
        now = now_ms()
        names = [name, name.upper(), name + " "]
        for index, stream in enumerate(names):
            store.save_processed(stream, token(f"p{index}"), now)
        for index, stream in enumerate(names):
            found = store.find(stream)
            assert found.stream_name == stream
            assert found.last_processed_token == token(f"p{index}")
        longest = "n" * 255
        store.save_seen(longest, token("s"), now)
        assert store.find(longest).stream_name == longest
        store.delete(longest)

    def test_timestamps_come_back_in_utc(self, store: CheckpointStore, name: str) -> None:
        """Whatever zone goes in, UTC comes out, to at least millisecond precision."""
        paris = timezone(timedelta(hours=2))
        at = datetime(2026, 6, 1, 12, 30, 15, 123456, tzinfo=paris)
        store.save_processed(name, token("p"), at, at)
        store.save_seen(name, token("s"), at)
        found = store.find(name)
        for value in (found.last_processed_at, found.last_heartbeat_at, found.last_seen_at):
            assert value.utcoffset() == timedelta(0)
            assert timedelta(0) <= at - value < timedelta(milliseconds=1)

    def test_list_checkpoints(self, store: CheckpointStore, name: str) -> None:
        if not store.supports_listing:
            pytest.skip(f"{type(store).__name__} does not support listing")
        now = now_ms()
        store.save_processed(f"{name}-b", token("b"), now)
        store.save_seen(f"{name}-a", token("a"), now)
        listed = [cp for cp in store.list_checkpoints() if cp.stream_name.startswith(name)]
        assert [cp.stream_name for cp in listed] == [f"{name}-a", f"{name}-b"]
        assert listed[0].last_seen_token == token("a")
        assert listed[1].last_processed_token == token("b")

    # -- races, made to happen ---------------------------------------------------

    def test_concurrent_anchor_writers_never_go_back(
        self, store: CheckpointStore, name: str
    ) -> None:
        """Two threads write the two anchors while a third reads: neither anchor ever
        goes back, and each ends at the last value its writer wrote."""
        writes = self.race_writes
        base = now_ms()
        done = threading.Event()
        regressions: list[str] = []

        def index(tok: Any) -> int:
            return -1 if tok is None else int(tok["_data"][1:])

        def write(kind: str) -> None:
            save = store.save_seen if kind == "s" else store.save_processed
            for i in range(writes):
                save(name, token(f"{kind}{i:08d}"), base + timedelta(milliseconds=i))

        def seen_writer() -> None:
            write("s")

        def processed_writer() -> None:
            write("p")

        def reader() -> None:
            last = {"seen": -1, "processed": -1}
            while not done.is_set():
                found = store.find(name)
                if found is None:
                    continue
                for anchor, tok in (
                    ("seen", found.last_seen_token),
                    ("processed", found.last_processed_token),
                ):
                    current = index(tok)
                    if current < last[anchor]:
                        regressions.append(f"{anchor} went back from {last[anchor]} to {current}")
                    last[anchor] = current

        def writers() -> None:
            try:
                self.run_threads(seen_writer, processed_writer)
            finally:
                done.set()

        self.run_threads(writers, reader)
        assert not regressions, regressions[:5]
        final = store.find(name)
        assert final.last_seen_token == token(f"s{writes - 1:08d}")
        assert final.last_processed_token == token(f"p{writes - 1:08d}")
        assert final.last_seen_at == base + timedelta(milliseconds=writes - 1)
        assert final.last_processed_at == base + timedelta(milliseconds=writes - 1)

    def test_processed_write_racing_reset_is_never_removed(
        self, store: CheckpointStore, name: str
    ) -> None:
        """A processed anchor written while a reset runs survives it, whatever the order."""
        rounds = self.reset_race_rounds
        now = now_ms()
        barrier = threading.Barrier(3, timeout=120)
        lost: list[str] = []

        def stream(round_: int) -> str:
            return f"{name}-{round_}"

        def resetter() -> None:
            for r in range(rounds):
                barrier.wait()
                store.reset_after_history_lost(
                    stream(r), token(f"fresh{r}"), token(f"dead{r}"), now
                )
                barrier.wait()

        def processor() -> None:
            for r in range(rounds):
                barrier.wait()
                store.save_processed(stream(r), token(f"live{r}"), now)
                barrier.wait()

        def coordinator() -> None:
            for r in range(rounds):
                store.save(
                    Checkpoint(
                        stream(r), "pod-a", None, None, token(f"dead{r}"), now, None, {"round": r}
                    )
                )
                barrier.wait()  # both workers go
                barrier.wait()  # both workers are done
                found = store.find(stream(r))
                if found.last_processed_token != token(f"live{r}"):
                    lost.append(f"round {r}: processed = {found.last_processed_token}")
                elif found.last_seen_token != token(f"fresh{r}") or found.metadata != {"round": r}:
                    lost.append(f"round {r}: {found}")

        self.run_threads(resetter, processor, coordinator)
        assert not lost, lost[:5]

    def test_concurrent_initial_sync_writers_one_wins_each_batch(
        self, store: CheckpointStore, name: str
    ) -> None:
        """Writers race for every batch (the first on a missing record): the condition
        lets exactly one of them write each time."""
        writers, rounds = self.initial_sync_writers, self.initial_sync_race_rounds
        barrier = threading.Barrier(writers, timeout=120)
        wins: list[list[int]] = [[] for _ in range(rounds)]

        def writer(index: int) -> Callable[[], None]:
            def run() -> None:
                for batch in range(rounds):
                    expected = None if batch == 0 else batch - 1
                    barrier.wait()  # all go
                    progress = sync_progress(batch, writer=index)
                    if store.save_initial_sync(name, progress, expected_batch=expected):
                        wins[batch].append(index)
                    barrier.wait()  # all done before the next batch

            return run

        self.run_threads(*(writer(i) for i in range(writers)))
        assert [len(winners) for winners in wins] == [1] * rounds, wins
        final = store.find(name).initial_sync
        assert final == sync_progress(rounds - 1, writer=wins[-1][0])

    def test_initial_sync_racing_record_creation_is_never_refused(
        self, store: CheckpointStore, name: str
    ) -> None:
        """The first progress write (expecting none) races another partial write that
        creates the record: the record had no progress, so the write must succeed,
        and neither write may erase the other."""
        rounds = self.initial_sync_race_rounds
        now = now_ms()
        barrier = threading.Barrier(2, timeout=120)
        refused: list[int] = []

        def stream(round_: int) -> str:
            return f"{name}-{round_}"

        def syncer() -> None:
            for r in range(rounds):
                barrier.wait()
                if not store.save_initial_sync(stream(r), sync_progress(0), expected_batch=None):
                    refused.append(r)

        def creator() -> None:
            for r in range(rounds):
                barrier.wait()
                if r % 2:
                    store.save_heartbeat(stream(r), now)
                else:
                    store.save_processed(stream(r), token(f"p{r}"), now, now)

        self.run_threads(syncer, creator)
        assert not refused, f"refused in rounds {refused[:10]}"
        for r in range(rounds):
            found = store.find(stream(r))
            assert found.initial_sync == sync_progress(0), f"round {r}: {found}"
            assert found.last_heartbeat_at == now, f"round {r}: {found}"
            if r % 2 == 0:
                assert found.last_processed_token == token(f"p{r}"), f"round {r}: {found}"


#: The operations :class:`AsyncCheckpointStoreContract` drives through their ``a…`` twins.
CHECKPOINT_OPERATIONS = (
    "save",
    "find",
    "delete",
    "list_checkpoints",
    "save_seen",
    "save_processed",
    "save_heartbeat",
    "reset_after_history_lost",
    "save_initial_sync",
)


class AsyncCheckpointStoreContract(CheckpointStoreContract):
    """The same contract through the async API (``asave``, ``afind``…).

    Every test of :class:`CheckpointStoreContract` runs against a stand-in whose
    sync operations await the store's ``a…`` variants on an event loop
    (``testkit/_async_driven.py``): the same values, errors and races, from async
    code. Then a few tests of its own await many calls at once.

    Subclass it like the sync contract (``make_store``), or put it first in front
    of an existing sync test class to run that class's setup through the async API::

        class TestMyStoreAsync(AsyncCheckpointStoreContract, TestMyStore):
            pass
    """

    #: Each driven call awaits on a fresh event loop (``async_to_sync``), some ten
    #: times the cost of a sync call: fewer writes race in the race test.
    race_writes = 300

    @pytest.fixture
    def store(self) -> Iterator[CheckpointStore]:
        store = self.make_store()
        self.clean_state(store)
        yield async_driven(store, CHECKPOINT_OPERATIONS)
        self.teardown_store(store)

    def test_async_variants_are_coroutine_functions(self, store: Any) -> None:
        for operation in CHECKPOINT_OPERATIONS:
            assert inspect.iscoroutinefunction(getattr(store.driven, f"a{operation}")), operation

    def test_gathered_async_writes_all_land(self, store: Any, name: str) -> None:
        real: CheckpointStore = store.driven
        now = now_ms()
        streams = [f"{name}-{index}" for index in range(10)]

        async def scenario() -> list[Checkpoint | None]:
            await asyncio.gather(
                *(real.asave_seen(s, token(f"s{i}"), now) for i, s in enumerate(streams)),
                *(real.asave_processed(s, token(f"p{i}"), now) for i, s in enumerate(streams)),
            )
            written = await asyncio.gather(
                *(
                    real.asave_initial_sync(s, sync_progress(0), expected_batch=None)
                    for s in streams
                )
            )
            assert written == [True] * len(streams)
            return list(await asyncio.gather(*(real.afind(s) for s in streams)))

        for index, found in enumerate(async_to_sync(scenario)()):
            assert found is not None
            assert found.last_seen_token == token(f"s{index}")
            assert found.last_processed_token == token(f"p{index}")
            assert found.initial_sync == sync_progress(0)
