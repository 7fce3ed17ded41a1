"""In-process checkpoint store, for tests and single-process demos."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from ..checkpoint import Checkpoint, CheckpointStore, check_anchor_write
from ..tokens import Token, check_token, normalize_token, tokens_equal


class InMemoryCheckpointStore(CheckpointStore):
    """Keeps checkpoints in a dict guarded by one lock; every operation is atomic.

    Tokens are stored after a BSON round trip, so they come back exactly as the
    other backends return them, and later changes to the caller's dict do not leak in.
    """

    supports_listing = True

    def __init__(self) -> None:
        self._records: dict[str, Checkpoint] = {}
        self._lock = threading.Lock()

    def save(self, checkpoint: Checkpoint) -> None:
        stored = checkpoint.replace(
            last_seen_token=normalize_token(checkpoint.last_seen_token),
            last_processed_token=normalize_token(checkpoint.last_processed_token),
            metadata=dict(checkpoint.metadata),
        )
        with self._lock:
            self._records[checkpoint.stream_name] = stored

    def find(self, stream_name: str) -> Checkpoint | None:
        with self._lock:
            found = self._records.get(stream_name)
        if found is None:
            return None
        return found.replace(
            last_seen_token=normalize_token(found.last_seen_token),
            last_processed_token=normalize_token(found.last_processed_token),
            metadata=dict(found.metadata),
        )

    def delete(self, stream_name: str) -> None:
        with self._lock:
            self._records.pop(stream_name, None)

    def list_checkpoints(self) -> list[Checkpoint]:
        with self._lock:
            names = sorted(self._records)
        return [cp for cp in map(self.find, names) if cp is not None]

    def clear(self) -> None:
        """Remove every checkpoint."""
        with self._lock:
            self._records.clear()

    def _update(self, stream_name: str, changes: dict[str, Any]) -> None:
        with self._lock:
            current = self._records.get(stream_name) or Checkpoint(stream_name)
            self._records[stream_name] = current.replace(**changes)

    def save_seen(
        self,
        stream_name: str,
        token: Token | None,
        at: datetime | None,
        heartbeat_at: datetime | None = None,
    ) -> None:
        check_anchor_write(token, at, heartbeat_at)
        changes: dict[str, Any] = {"last_seen_token": normalize_token(token), "last_seen_at": at}
        if heartbeat_at is not None:
            changes["last_heartbeat_at"] = heartbeat_at
        self._update(stream_name, changes)

    def save_processed(
        self,
        stream_name: str,
        token: Token | None,
        at: datetime | None,
        heartbeat_at: datetime | None = None,
    ) -> None:
        check_anchor_write(token, at, heartbeat_at)
        changes: dict[str, Any] = {
            "last_processed_token": normalize_token(token),
            "last_processed_at": at,
        }
        if heartbeat_at is not None:
            changes["last_heartbeat_at"] = heartbeat_at
        self._update(stream_name, changes)

    def save_heartbeat(self, stream_name: str, at: datetime) -> None:
        check_anchor_write(None, at)
        self._update(stream_name, {"last_heartbeat_at": at})

    def reset_after_history_lost(
        self,
        stream_name: str,
        fresh_seen_token: Token | None,
        expected_dead_processed: Token | None,
        at: datetime,
    ) -> None:
        check_anchor_write(fresh_seen_token, at)
        check_token(expected_dead_processed, "expected_dead_processed")
        fresh = normalize_token(fresh_seen_token)
        with self._lock:
            current = self._records.get(stream_name) or Checkpoint(stream_name)
            changes: dict[str, Any] = {
                "last_seen_token": fresh,
                "last_seen_at": at if fresh is not None else None,
                "last_heartbeat_at": at if fresh is not None else None,
            }
            if tokens_equal(current.last_processed_token, expected_dead_processed):
                changes.update(last_processed_token=None, last_processed_at=None)
            self._records[stream_name] = current.replace(**changes)
