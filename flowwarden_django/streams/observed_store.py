"""The checkpoint store as one consumer sees it: every write reported as a metric
signal and, for a ``SINGLE_LEADER`` stream, fenced by the stream's lease."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, TypeVar

from asgiref.sync import sync_to_async

from . import metrics
from .checkpoint import Checkpoint, CheckpointStore

T = TypeVar("T")


class ObservedCheckpointStore(CheckpointStore):
    """Wraps a consumer's store: ``checkpoint_saved`` after each successful write,
    ``checkpoint_failed`` for each failure, and each write inside ``fence()``.

    A conditional write whose condition failed (``save_initial_sync`` returning
    ``False``) wrote nothing: it sends neither signal.

    ``fence`` is the lease guard of a ``SINGLE_LEADER`` stream: it raises
    ``LeaseLostError`` when the consumer's fencing token is no longer current,
    so a consumer that lost its lease cannot move the anchors of the new leader.

    The async variants call the wrapped store's ``a…`` methods (native on the Redis
    and MongoDB backends) and signal like the sync ones; under a fence they run the
    fenced sync write on the thread-sensitive executor (the ORM lock service's guard
    runs on the caller's Django connection).
    """

    def __init__(
        self,
        store: CheckpointStore,
        stream_name: str,
        fence: Callable[[], AbstractContextManager[Any]] | None = None,
    ) -> None:
        self.inner = store
        self.stream_name = stream_name
        self.fence = fence or contextlib.nullcontext

    @property
    def async_thread_sensitive(self) -> bool:  # type: ignore[override]
        """The wrapped store's choice when nothing fences; ``True`` under a fence (the
        ORM lock service's guard runs on the caller's Django connection)."""
        if self.fence is not contextlib.nullcontext:
            return True
        return self.inner.async_thread_sensitive

    @property
    def fenced(self) -> bool:
        """Whether writes run inside a lease fence (a ``SINGLE_LEADER`` stream)."""
        return self.fence is not contextlib.nullcontext

    def _write(self, anchor: str, token: Any, write: Callable[[], T]) -> T:
        try:
            with self.fence():
                result = write()
        except Exception as exc:
            metrics.emit(metrics.checkpoint_failed, self.stream_name, anchor=anchor, error=exc)
            raise
        return self._saved(anchor, token, result)

    async def _awrite(
        self, anchor: str, token: Any, write: Callable[[], T], awrite: Callable[[], Awaitable[T]]
    ) -> T:
        """The async write: the wrapped store's own ``a…`` method when nothing fences
        (native where the backend has an async client); under a fence, the sync write
        on the thread-sensitive executor, inside the fence."""
        if self.fenced:
            return await sync_to_async(self._write, thread_sensitive=True)(anchor, token, write)
        try:
            result = await awrite()
        except Exception as exc:
            metrics.emit(metrics.checkpoint_failed, self.stream_name, anchor=anchor, error=exc)
            raise
        return self._saved(anchor, token, result)

    def _saved(self, anchor: str, token: Any, result: T) -> T:
        if result is not False:  # False: a conditional write that wrote nothing
            metrics.emit(metrics.checkpoint_saved, self.stream_name, anchor=anchor, token=token)
        return result

    # -- reads and whole-record operations: straight through -------------------------

    def save(self, checkpoint: Checkpoint) -> None:
        self._write("record", None, lambda: self.inner.save(checkpoint))

    def find(self, stream_name: str) -> Checkpoint | None:
        return self.inner.find(stream_name)

    def delete(self, stream_name: str) -> None:
        self.inner.delete(stream_name)

    def list_checkpoints(self) -> list[Checkpoint]:
        return self.inner.list_checkpoints()

    # -- the partial writes a consumer makes ------------------------------------------

    def save_seen(
        self,
        stream_name: str,
        token: Mapping[str, Any],
        at: datetime,
        heartbeat_at: datetime | None = None,
    ) -> None:
        self._write(
            "seen", token, lambda: self.inner.save_seen(stream_name, token, at, heartbeat_at)
        )

    def save_processed(
        self,
        stream_name: str,
        token: Mapping[str, Any],
        at: datetime,
        heartbeat_at: datetime | None = None,
    ) -> None:
        self._write(
            "processed",
            token,
            lambda: self.inner.save_processed(stream_name, token, at, heartbeat_at),
        )

    def save_heartbeat(self, stream_name: str, at: datetime) -> None:
        self._write("heartbeat", None, lambda: self.inner.save_heartbeat(stream_name, at))

    def reset_after_history_lost(
        self,
        stream_name: str,
        fresh_seen_token: Mapping[str, Any] | None,
        expected_dead_processed_token: Mapping[str, Any] | None,
        at: datetime,
    ) -> None:
        self._write(
            "reset",
            fresh_seen_token,
            lambda: self.inner.reset_after_history_lost(
                stream_name, fresh_seen_token, expected_dead_processed_token, at
            ),
        )

    def save_initial_sync(
        self,
        stream_name: str,
        progress: Mapping[str, Any] | None,
        *,
        expected_batch: int | None,
    ) -> bool:
        return self._write(
            "initial_sync",
            None,
            lambda: self.inner.save_initial_sync(
                stream_name, progress, expected_batch=expected_batch
            ),
        )

    # -- async: the wrapped store's own a… methods (see _awrite) ------------------------

    async def afind(self, stream_name: str) -> Checkpoint | None:
        return await self.inner.afind(stream_name)

    async def alist_checkpoints(self) -> list[Checkpoint]:
        return await self.inner.alist_checkpoints()

    async def adelete(self, stream_name: str) -> None:
        await self.inner.adelete(stream_name)

    async def asave(self, checkpoint: Checkpoint) -> None:
        await self._awrite(
            "record",
            None,
            lambda: self.inner.save(checkpoint),
            lambda: self.inner.asave(checkpoint),
        )

    async def asave_seen(
        self,
        stream_name: str,
        token: Mapping[str, Any],
        at: datetime,
        heartbeat_at: datetime | None = None,
    ) -> None:
        args = (stream_name, token, at, heartbeat_at)
        await self._awrite(
            "seen",
            token,
            lambda: self.inner.save_seen(*args),
            lambda: self.inner.asave_seen(*args),
        )

    async def asave_processed(
        self,
        stream_name: str,
        token: Mapping[str, Any],
        at: datetime,
        heartbeat_at: datetime | None = None,
    ) -> None:
        args = (stream_name, token, at, heartbeat_at)
        await self._awrite(
            "processed",
            token,
            lambda: self.inner.save_processed(*args),
            lambda: self.inner.asave_processed(*args),
        )

    async def asave_heartbeat(self, stream_name: str, at: datetime) -> None:
        await self._awrite(
            "heartbeat",
            None,
            lambda: self.inner.save_heartbeat(stream_name, at),
            lambda: self.inner.asave_heartbeat(stream_name, at),
        )

    async def areset_after_history_lost(
        self,
        stream_name: str,
        fresh_seen_token: Mapping[str, Any] | None,
        expected_dead_processed_token: Mapping[str, Any] | None,
        at: datetime,
    ) -> None:
        args = (stream_name, fresh_seen_token, expected_dead_processed_token, at)
        await self._awrite(
            "reset",
            fresh_seen_token,
            lambda: self.inner.reset_after_history_lost(*args),
            lambda: self.inner.areset_after_history_lost(*args),
        )

    async def asave_initial_sync(
        self,
        stream_name: str,
        progress: Mapping[str, Any] | None,
        *,
        expected_batch: int | None,
    ) -> bool:
        return await self._awrite(
            "initial_sync",
            None,
            lambda: self.inner.save_initial_sync(
                stream_name, progress, expected_batch=expected_batch
            ),
            lambda: self.inner.asave_initial_sync(
                stream_name, progress, expected_batch=expected_batch
            ),
        )
