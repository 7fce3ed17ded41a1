"""In-process dead-letter store, for tests and single-process demos."""

from __future__ import annotations

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
from ._memory_common import LockedRecords


class InMemoryDlqStore(LockedRecords, CompareAndSetDlqStore):
    """Keeps dead letters in a dict guarded by one lock.

    Every operation, and each compare-and-set transition, runs under that lock.
    Entries are stored and returned as copies after a BSON round trip, so they
    come back exactly as the other backends return them. Nothing expires by
    itself: ``purge_expired`` removes what is past its ``expires_at``.
    """

    #: The async API runs on the default executor, in parallel: this never touches
    #: the Django database.
    async_thread_sensitive = False

    _copy = staticmethod(normalized)

    def save(self, entry: DeadLetter, policy: DlqPolicy) -> None:
        check_entry(entry)
        self._put(entry.id, entry)

    def find_by_id(self, entry_id: str) -> DeadLetter | None:
        return self._get(entry_id)

    def find_by_stream(
        self, stream_name: str, *, status: str | None = None, limit: int | None = None
    ) -> list[DeadLetter]:
        check_limit(limit)
        with self._lock:
            found = [
                entry
                for entry in self._records.values()
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
                for entry in self._records.values()
                if entry.stream_name == stream_name and entry.status == PENDING
            )

    def _change_status(self, change: StatusChange) -> bool:
        with self._lock:
            current = self._records.get(change.entry_id)
            if current is None or current.status not in change.allowed:
                return False
            updated = current.replace(status=change.status, **change.changes)
            if change.replayed is not None:
                count = current.replay_count + 1
                updated = updated.replace(replay_count=count, last_replayed_at=change.replayed)
            self._records[change.entry_id] = normalized(updated)
            return True

    def purge_expired(self, now: datetime) -> int:
        check_aware(now, "now")
        with self._lock:
            expired = [
                entry_id
                for entry_id, entry in self._records.items()
                if entry.expires_at is not None and entry.expires_at < now
            ]
            for entry_id in expired:
                del self._records[entry_id]
        return len(expired)

    def delete(self, entry_id: str) -> None:
        with self._lock:
            self._records.pop(entry_id, None)

    def clear(self) -> None:
        """Remove every entry."""
        with self._lock:
            self._records.clear()
