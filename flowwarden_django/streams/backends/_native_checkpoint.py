"""The public sync and async API of the checkpoint stores with a native async client.

``NativeCheckpointStore`` writes each ``CheckpointStore`` operation and its ``a…``
twin once, in terms of the backend's store operations (see ``_calls``): the sync
method runs the operation on the blocking client, the async one on the running
loop's native client, or falls back to the thread-based default when the backend
has none. A backend (Redis, MongoDB) supplies only the operations and the two
runners (``_run`` and ``_arun``, from its connection class).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .._twins import native_pair
from ..checkpoint import Checkpoint, CheckpointStore
from ._calls import NativeOperations, Operation


class NativeCheckpointStore(NativeOperations, CheckpointStore):
    """A checkpoint store whose every operation is one sans-I/O store operation.

    Subclasses implement the ``_…_operation`` methods (each returns an
    :data:`~._calls.Operation`) and inherit, from their connection class, ``_run``
    (run an operation on the sync client) and ``_arun`` (on the loop's async client,
    or the given default).
    """

    #: The async API runs natively, or on the default executor, in parallel: these
    #: stores never touch the Django database.
    async_thread_sensitive = False

    supports_listing = True

    save, asave = native_pair(CheckpointStore.save, "_save_operation")
    find, afind = native_pair(CheckpointStore.find, "_find_operation")
    delete, adelete = native_pair(CheckpointStore.delete, "_delete_operation")
    list_checkpoints, alist_checkpoints = native_pair(
        CheckpointStore.list_checkpoints, "_list_operation"
    )
    save_seen, asave_seen = native_pair(CheckpointStore.save_seen, "_seen_operation")
    save_processed, asave_processed = native_pair(
        CheckpointStore.save_processed, "_processed_operation"
    )
    save_heartbeat, asave_heartbeat = native_pair(
        CheckpointStore.save_heartbeat, "_heartbeat_operation"
    )
    reset_after_history_lost, areset_after_history_lost = native_pair(
        CheckpointStore.reset_after_history_lost, "_reset_operation"
    )
    save_initial_sync, asave_initial_sync = native_pair(
        CheckpointStore.save_initial_sync, "_initial_sync_operation"
    )

    # -- what a backend supplies -------------------------------------------------------

    def _save_operation(self, checkpoint: Checkpoint) -> Operation[None]:
        raise NotImplementedError

    def _find_operation(self, stream_name: str) -> Operation[Checkpoint | None]:
        raise NotImplementedError

    def _delete_operation(self, stream_name: str) -> Operation[None]:
        raise NotImplementedError

    def _list_operation(self) -> Operation[list[Checkpoint]]:
        raise NotImplementedError

    def _seen_operation(self, *args: Any) -> Operation[None]:
        """``save_seen(*args)``."""
        raise NotImplementedError

    def _processed_operation(self, *args: Any) -> Operation[None]:
        """``save_processed(*args)``."""
        raise NotImplementedError

    def _heartbeat_operation(self, stream_name: str, at: datetime) -> Operation[None]:
        raise NotImplementedError

    def _reset_operation(self, *args: Any) -> Operation[None]:
        """``reset_after_history_lost(*args)``."""
        raise NotImplementedError

    def _initial_sync_operation(
        self, stream_name: str, progress: Mapping[str, Any] | None, expected_batch: int | None
    ) -> Operation[bool]:
        raise NotImplementedError
