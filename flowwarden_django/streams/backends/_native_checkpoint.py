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

from ..checkpoint import Checkpoint, CheckpointStore
from ..tokens import Token
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

    def save(self, checkpoint: Checkpoint) -> None:
        self._run(self._save_operation(checkpoint))

    async def asave(self, checkpoint: Checkpoint) -> None:
        await self._arun(self._save_operation(checkpoint), super().asave, checkpoint)

    def find(self, stream_name: str) -> Checkpoint | None:
        return self._run(self._find_operation(stream_name))

    async def afind(self, stream_name: str) -> Checkpoint | None:
        return await self._arun(self._find_operation(stream_name), super().afind, stream_name)

    def delete(self, stream_name: str) -> None:
        self._run(self._delete_operation(stream_name))

    async def adelete(self, stream_name: str) -> None:
        await self._arun(self._delete_operation(stream_name), super().adelete, stream_name)

    def list_checkpoints(self) -> list[Checkpoint]:
        return self._run(self._list_operation())

    async def alist_checkpoints(self) -> list[Checkpoint]:
        return await self._arun(self._list_operation(), super().alist_checkpoints)

    def save_seen(
        self,
        stream_name: str,
        token: Token | None,
        at: datetime | None,
        heartbeat_at: datetime | None = None,
    ) -> None:
        self._run(self._seen_operation(stream_name, token, at, heartbeat_at))

    async def asave_seen(
        self,
        stream_name: str,
        token: Token | None,
        at: datetime | None,
        heartbeat_at: datetime | None = None,
    ) -> None:
        args = (stream_name, token, at, heartbeat_at)
        await self._arun(self._seen_operation(*args), super().asave_seen, *args)

    def save_processed(
        self,
        stream_name: str,
        token: Token | None,
        at: datetime | None,
        heartbeat_at: datetime | None = None,
    ) -> None:
        self._run(self._processed_operation(stream_name, token, at, heartbeat_at))

    async def asave_processed(
        self,
        stream_name: str,
        token: Token | None,
        at: datetime | None,
        heartbeat_at: datetime | None = None,
    ) -> None:
        args = (stream_name, token, at, heartbeat_at)
        await self._arun(self._processed_operation(*args), super().asave_processed, *args)

    def save_heartbeat(self, stream_name: str, at: datetime) -> None:
        self._run(self._heartbeat_operation(stream_name, at))

    async def asave_heartbeat(self, stream_name: str, at: datetime) -> None:
        operation = self._heartbeat_operation(stream_name, at)
        await self._arun(operation, super().asave_heartbeat, stream_name, at)

    def reset_after_history_lost(
        self,
        stream_name: str,
        fresh_seen_token: Token | None,
        expected_dead_processed: Token | None,
        at: datetime,
    ) -> None:
        args = (stream_name, fresh_seen_token, expected_dead_processed, at)
        self._run(self._reset_operation(*args))

    async def areset_after_history_lost(
        self,
        stream_name: str,
        fresh_seen_token: Token | None,
        expected_dead_processed: Token | None,
        at: datetime,
    ) -> None:
        args = (stream_name, fresh_seen_token, expected_dead_processed, at)
        await self._arun(self._reset_operation(*args), super().areset_after_history_lost, *args)

    def save_initial_sync(
        self,
        stream_name: str,
        progress: Mapping[str, Any] | None,
        *,
        expected_batch: int | None,
    ) -> bool:
        return self._run(self._initial_sync_operation(stream_name, progress, expected_batch))

    async def asave_initial_sync(
        self,
        stream_name: str,
        progress: Mapping[str, Any] | None,
        *,
        expected_batch: int | None,
    ) -> bool:
        operation = self._initial_sync_operation(stream_name, progress, expected_batch)
        default = super().asave_initial_sync
        return await self._arun(
            operation, default, stream_name, progress, expected_batch=expected_batch
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
