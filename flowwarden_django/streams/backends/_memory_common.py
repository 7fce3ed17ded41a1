"""What the in-process checkpoint and dead-letter stores share: records in a dict
guarded by one lock, each stored and returned as a copy."""

from __future__ import annotations

import threading
from typing import Any


class LockedRecords:
    """Records by key in a dict guarded by one lock; :meth:`_copy` makes the copy a
    record is stored as, and returned as (so the caller's objects never leak in)."""

    def __init__(self) -> None:
        self._records: dict[str, Any] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _copy(record: Any) -> Any:
        raise NotImplementedError

    def _put(self, key: str, record: Any) -> None:
        stored = self._copy(record)
        with self._lock:
            self._records[key] = stored

    def _get(self, key: str) -> Any:
        with self._lock:
            found = self._records.get(key)
        return None if found is None else self._copy(found)
