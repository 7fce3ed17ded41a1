"""The checkpoint contract: save, find and delete (reference 1-5)."""

from __future__ import annotations

from ...streams.checkpoint import Checkpoint, CheckpointStore
from .values import now_ms, sync_progress, token


class RecordContract:
    """Whole records: saved, found, replaced and deleted.

    Mixed into :class:`~flowwarden_django.testkit.CheckpointStoreContract`, which gives
    the ``store`` and ``name`` fixtures.
    """

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
