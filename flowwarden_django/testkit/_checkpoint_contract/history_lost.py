"""The checkpoint contract: the history-lost reset (reference 16-19)."""

from __future__ import annotations

from datetime import datetime, timedelta

from ...streams.checkpoint import Checkpoint, CheckpointStore
from .values import now_ms, token


class HistoryLostContract:
    """``reset_after_history_lost``: a fresh seen anchor, the processed one cleared, and
    its guard against a processed anchor replaced meanwhile.

    Mixed into :class:`~flowwarden_django.testkit.CheckpointStoreContract`, which gives
    the ``store`` and ``name`` fixtures.
    """

    def _dead_state(
        self, store: CheckpointStore, name: str, now: datetime, processed: str = "deadProcessed"
    ) -> None:
        metadata = {"env": "test"}
        seen, processed_token = token("deadSeen"), token(processed)
        store.save(Checkpoint(name, "pod-a", seen, now, processed_token, now, now, metadata))

    def _assert_fresh(self, found: Checkpoint, recovery: datetime) -> None:
        """The fresh seen pair and heartbeat are in; the owner and metadata are kept."""
        assert (found.last_seen_token, found.last_seen_at) == (token("fresh"), recovery)
        assert found.last_heartbeat_at == recovery
        assert found.instance_id == "pod-a"
        assert found.metadata == {"env": "test"}

    def test_reset_installs_fresh_seen_and_clears_processed(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        recovery = now + timedelta(seconds=60)
        self._dead_state(store, name, now)
        store.reset_after_history_lost(name, token("fresh"), token("deadProcessed"), recovery)
        found = store.find(name)
        self._assert_fresh(found, recovery)
        assert (found.last_processed_token, found.last_processed_at) == (None, None)

    def test_reset_keeps_a_processed_anchor_replaced_concurrently(
        self, store: CheckpointStore, name: str
    ) -> None:
        now = now_ms()
        recovery = now + timedelta(seconds=60)
        self._dead_state(store, name, now, processed="freshProcessed")
        store.reset_after_history_lost(name, token("fresh"), token("deadProcessed"), recovery)
        found = store.find(name)
        assert (found.last_processed_token, found.last_processed_at) == (
            token("freshProcessed"),
            now,
        )
        self._assert_fresh(found, recovery)

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
