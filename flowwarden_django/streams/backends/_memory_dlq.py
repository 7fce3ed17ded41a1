"""In-process dead-letter store, for tests and single-process demos."""

from __future__ import annotations

import threading
from datetime import datetime

from ..dlq import PENDING, DeadLetter, DlqPolicy
from ._dlq_common import (
    CompareAndSetDlqStore,
    StatusChange,
    check_aware,
    check_entry,
    check_limit,
    normalized,
)


class InMemoryDlqStore(CompareAndSetDlqStore):
    """Keeps dead letters in a dict guarded by one lock.

    Every operation, and each compare-and-set transition, runs under that lock.
    Entries are stored and returned as copies after a BSON round trip, so they
    come back exactly as the other backends return them. Nothing expires by
    itself: ``purge_expired`` removes what is past its ``expires_at``.
    """

    #: The async API runs on the default executor, in parallel: this never touches
    #: the Django database.
    async_thread_sensitive = False

    def __init__(self) -> None:
        self._entries: dict[str, DeadLetter] = {}
        self._lock = threading.Lock()

    def save(self, entry: DeadLetter, policy: DlqPolicy) -> None:
        check_entry(entry)
        stored = normalized(entry)
        with self._lock:
            self._entries[entry.id] = stored

    def find_by_id(self, entry_id: str) -> DeadLetter | None:
        with self._lock:
            found = self._entries.get(entry_id)
        return None if found is None else normalized(found)

    def find_by_stream(
        self, stream_name: str, *, status: str | None = None, limit: int | None = None
    ) -> list[DeadLetter]:
        check_limit(limit)
        with self._lock:
            found = [
                entry
                for entry in self._entries.values()
                if entry.stream_name == stream_name and (status is None or entry.status == status)
            ]
        # Newest first; equal timestamps by id, as the ORM store orders them.
        found.sort(key=lambda entry: entry.id)
        found.sort(key=lambda entry: entry.created_at, reverse=True)
        return [normalized(entry) for entry in found[:limit]]

    def count(self, stream_name: str) -> int:
        with self._lock:
            return sum(
                1
                for entry in self._entries.values()
                if entry.stream_name == stream_name and entry.status == PENDING
            )

    def _change_status(self, change: StatusChange) -> bool:
        with self._lock:
            current = self._entries.get(change.entry_id)
            if current is None or current.status not in change.allowed:
                return False
            updated = current.replace(status=change.status, **change.changes)
            if change.replayed is not None:
                count = current.replay_count + 1
                updated = updated.replace(replay_count=count, last_replayed_at=change.replayed)
            self._entries[change.entry_id] = normalized(updated)
            return True

    def purge_expired(self, now: datetime) -> int:
        check_aware(now, "now")
        with self._lock:
            expired = [
                entry_id
                for entry_id, entry in self._entries.items()
                if entry.expires_at is not None and entry.expires_at < now
            ]
            for entry_id in expired:
                del self._entries[entry_id]
        return len(expired)

    def delete(self, entry_id: str) -> None:
        with self._lock:
            self._entries.pop(entry_id, None)

    def clear(self) -> None:
        """Remove every entry."""
        with self._lock:
            self._entries.clear()
