"""In-process checkpoint store, for tests and single-process demos."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..checkpoint import (
    CHECKPOINT_TIMES,
    CHECKPOINT_TOKENS,
    Checkpoint,
    CheckpointStore,
    plain_progress,
    stored_copy,
)
from ._memory_common import LockedRecords


def _stored(checkpoint: Checkpoint) -> Checkpoint:
    """A copy as the other backends return it: tokens after a BSON round trip,
    timestamps in UTC, and a metadata dict and initial-sync progress of its own."""
    return stored_copy(
        checkpoint,
        CHECKPOINT_TOKENS,
        CHECKPOINT_TIMES,
        metadata=dict(checkpoint.metadata),
        initial_sync=plain_progress(checkpoint.initial_sync),
    )


class InMemoryCheckpointStore(LockedRecords, CheckpointStore):
    """Keeps checkpoints in a dict guarded by one lock.

    The SPI's partial operations, ``save_initial_sync``'s condition included, run
    their read-modify-write under that lock, so each is atomic. Tokens are stored
    after a BSON round trip: they come back exactly as the other backends return
    them, and later changes to the caller's dict (or progress) do not leak in.
    """

    #: The async API runs on the default executor, in parallel: this never touches
    #: the Django database.
    async_thread_sensitive = False
    #: ... and a consumer's wrapper calls it on the loop itself (``ObservedCheckpointStore``):
    #: a dict under a lock held for microseconds is cheaper than a hop to a thread.
    async_inline = True

    supports_listing = True

    _copy = staticmethod(_stored)

    def save(self, checkpoint: Checkpoint) -> None:
        self._put(checkpoint.stream_name, checkpoint)

    def find(self, stream_name: str) -> Checkpoint | None:
        return self._get(stream_name)

    def delete(self, stream_name: str) -> None:
        with self._lock:
            self._records.pop(stream_name, None)

    def list_checkpoints(self) -> list[Checkpoint]:
        with self._lock:
            records = sorted(self._records.items())
        return [_stored(checkpoint) for _, checkpoint in records]

    def clear(self) -> None:
        """Remove every checkpoint."""
        with self._lock:
            self._records.clear()

    def _read_modify_write(
        self, stream_name: str, changes: Callable[[Checkpoint], dict[str, Any] | None]
    ) -> bool:
        with self._lock:
            current = self._records.get(stream_name) or Checkpoint(stream_name)
            update = changes(current)
            if update is None:
                return False
            self._records[stream_name] = _stored(current.replace(**update))
            return True


# The dead-letter store and lock service of this backend live in their own modules.
from ._memory_dlq import InMemoryDlqStore as InMemoryDlqStore  # noqa: E402
from ._memory_locks import InMemoryLockService as InMemoryLockService  # noqa: E402
