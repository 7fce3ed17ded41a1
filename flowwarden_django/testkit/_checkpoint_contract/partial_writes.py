"""The checkpoint contract: the partial writes (reference 6-15, 20)."""

from __future__ import annotations

from datetime import timedelta

import pytest

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

    @pytest.fixture(params=["seen", "processed"])
    def anchor(self, request: pytest.FixtureRequest) -> str:
        """The anchor a test writes: it runs once for ``seen``, once for ``processed``."""
        return request.param

    @pytest.fixture
    def other(self, anchor: str) -> str:
        """The anchor the test does not write."""
        return _other(anchor)

    def test_save_anchor_does_not_overwrite_the_other(
        self, store: CheckpointStore, name: str, anchor: str, other: str
    ) -> None:
        """``save_<anchor>`` sets its pair and leaves the other anchor as it was."""
        now = now_ms()
        store.save(Checkpoint(name, None, token("seen1"), now, token("processed1"), now))
        getattr(store, f"save_{anchor}")(name, token(f"{anchor}2"), now + timedelta(seconds=10))
        found = store.find(name)
        assert _pair(found, anchor) == (token(f"{anchor}2"), now + timedelta(seconds=10))
        assert _pair(found, other) == (token(f"{other}1"), now)

    def test_save_anchor_creates_record_if_missing(
        self, store: CheckpointStore, name: str, anchor: str, other: str
    ) -> None:
        """``save_<anchor>`` on a missing record creates it, with only that pair."""
        now = now_ms()
        getattr(store, f"save_{anchor}")(name, token(anchor), now)
        found = store.find(name)
        assert found is not None
        assert _pair(found, anchor) == (token(anchor), now)
        assert _pair(found, other) == (None, None)

    def test_save_anchor_with_heartbeat_writes_both(
        self, store: CheckpointStore, name: str, anchor: str, other: str
    ) -> None:
        """``save_<anchor>`` with a heartbeat sets both, and leaves the other anchor."""
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
