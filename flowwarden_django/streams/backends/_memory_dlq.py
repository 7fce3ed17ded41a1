"""In-process dead-letter store, for tests and single-process demos."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime

from ..dlq import PENDING, REPLAYED, REPLAYING, DeadLetter, DlqPolicy, DlqStore, ErrorInfo
from ._dlq_common import (
    check_aware,
    check_entry,
    check_error,
    check_limit,
    check_transition,
    normalized,
    settles,
)


class InMemoryDlqStore(DlqStore):
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

    def transition(
        self,
        entry_id: str,
        to_status: str,
        *,
        from_statuses: Sequence[str] = (PENDING,),
        at: datetime,
        by: str = "",
        note: str = "",
    ) -> bool:
        allowed = check_transition(entry_id, to_status, from_statuses, at, by)
        changes: dict[str, object] = {"status": to_status}
        if settles(to_status):
            changes.update(resolved_at=at, resolved_by=by, note=note)
        with self._lock:
            current = self._entries.get(entry_id)
            if current is None or current.status not in allowed:
                return False
            if to_status == REPLAYED:
                changes.update(replay_count=current.replay_count + 1, last_replayed_at=at)
            self._entries[entry_id] = normalized(current.replace(**changes))
            return True

    def record_replay_failure(self, entry_id: str, error: ErrorInfo, *, at: datetime) -> bool:
        check_error(error)
        check_aware(at, "at")
        with self._lock:
            current = self._entries.get(entry_id)
            if current is None or current.status != REPLAYING:
                return False
            self._entries[entry_id] = normalized(
                current.replace(
                    status=PENDING,
                    error=error,
                    replay_count=current.replay_count + 1,
                    last_replayed_at=at,
                )
            )
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
