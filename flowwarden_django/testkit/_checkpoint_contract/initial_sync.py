"""The checkpoint contract: the initial-sync progress (``save_initial_sync``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from ...streams.checkpoint import Checkpoint, CheckpointStore
from .values import now_ms, same_json, sync_progress, token, write_every_anchor


class InitialSyncContract:
    """``save_initial_sync``: its batch condition, its isolation from the other writes,
    exact JSON round trips and its input checks.

    Mixed into :class:`~flowwarden_django.testkit.CheckpointStoreContract`, which gives
    the ``store`` and ``name`` fixtures.
    """

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
        write_every_anchor(store, name, now)
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
        same_json(store.find(name).initial_sync, original)
        store.save(Checkpoint(name, initial_sync=original))
        same_json(store.find(name).initial_sync, original, "saved initial_sync")
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
