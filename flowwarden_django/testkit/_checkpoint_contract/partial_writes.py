"""The checkpoint contract: the partial writes (reference 6-15, 20)."""

from __future__ import annotations

from datetime import timedelta

from ...streams.checkpoint import Checkpoint, CheckpointStore
from .values import now_ms, token


def _pair(found: Checkpoint, anchor: str) -> tuple[object, object]:
    """The (token, at) pair of *anchor* (``seen`` or ``processed``) in *found*."""
    return getattr(found, f"last_{anchor}_token"), getattr(found, f"last_{anchor}_at")


def _other(anchor: str) -> str:
    """The anchor that is not *anchor*."""
    return "processed" if anchor == "seen" else "seen"


class PartialWriteContract:
    """The partial writes (``save_seen``, ``save_processed``, ``save_heartbeat``): each
    touches its own fields only, and creates the record when it is missing.

    Mixed into :class:`~flowwarden_django.testkit.CheckpointStoreContract`, which gives
    the ``store`` and ``name`` fixtures.
    """

    def _writes_only_its_anchor(self, store: CheckpointStore, name: str, anchor: str) -> None:
        """``save_<anchor>`` sets its pair and leaves the other anchor as it was."""
        other = _other(anchor)
        now = now_ms()
        store.save(Checkpoint(name, None, token("seen1"), now, token("processed1"), now))
        getattr(store, f"save_{anchor}")(name, token(f"{anchor}2"), now + timedelta(seconds=10))
        found = store.find(name)
        assert _pair(found, anchor) == (token(f"{anchor}2"), now + timedelta(seconds=10))
        assert _pair(found, other) == (token(f"{other}1"), now)

    def _creates_the_record(self, store: CheckpointStore, name: str, anchor: str) -> None:
        """``save_<anchor>`` on a missing record creates it, with only that pair."""
        now = now_ms()
        getattr(store, f"save_{anchor}")(name, token(anchor), now)
        found = store.find(name)
        assert found is not None
        assert _pair(found, anchor) == (token(anchor), now)
        assert _pair(found, _other(anchor)) == (None, None)

    def test_save_seen_does_not_overwrite_processed(
        self, store: CheckpointStore, name: str
    ) -> None:
        self._writes_only_its_anchor(store, name, "seen")

    def test_save_processed_does_not_overwrite_seen(
        self, store: CheckpointStore, name: str
    ) -> None:
        self._writes_only_its_anchor(store, name, "processed")

    def test_save_seen_creates_record_if_missing(self, store: CheckpointStore, name: str) -> None:
        self._creates_the_record(store, name, "seen")

    def test_save_processed_creates_record_if_missing(
        self, store: CheckpointStore, name: str
    ) -> None:
        self._creates_the_record(store, name, "processed")

    def _writes_anchor_and_heartbeat(self, store: CheckpointStore, name: str, anchor: str) -> None:
        """``save_<anchor>`` with a heartbeat sets both, and leaves the other anchor."""
        other = _other(anchor)
        now = now_ms()
        store.save(
            Checkpoint(name, **{f"last_{other}_token": token(other[0]), f"last_{other}_at": now})
        )
        write = getattr(store, f"save_{anchor}")
        write(name, token(anchor), now + timedelta(seconds=10), now + timedelta(seconds=11))
        found = store.find(name)
        assert _pair(found, anchor) == (token(anchor), now + timedelta(seconds=10))
        assert found.last_heartbeat_at == now + timedelta(seconds=11)
        assert _pair(found, other) == (token(other[0]), now)

    def test_save_seen_with_heartbeat_writes_both(self, store: CheckpointStore, name: str) -> None:
        self._writes_anchor_and_heartbeat(store, name, "seen")

    def test_save_processed_with_heartbeat_writes_both(
        self, store: CheckpointStore, name: str
    ) -> None:
        self._writes_anchor_and_heartbeat(store, name, "processed")

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
