"""The checkpoint store as one consumer sees it: every write reported as a metric
signal and, for a ``SINGLE_LEADER`` stream, fenced by the stream's lease."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from asgiref.sync import sync_to_async

from .. import metrics
from ..checkpoint import Checkpoint, CheckpointStore

T = TypeVar("T")


def _observed(method: str, anchor: str, token: str | None = None) -> tuple[Any, Any]:
    """The sync and async variants of the write *method*, reported as *anchor*; the
    *token* argument (the stream name's follower, or by name) is the signal's token."""

    def token_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if token is None:
            return None
        return args[1] if len(args) > 1 else kwargs.get(token)

    def write(self: ObservedCheckpointStore, *args: Any, **kwargs: Any) -> Any:
        call = getattr(self.inner, method)
        return self._write(anchor, token_of(args, kwargs), lambda: call(*args, **kwargs))

    async def awrite(self: ObservedCheckpointStore, *args: Any, **kwargs: Any) -> Any:
        call, acall = getattr(self.inner, method), getattr(self.inner, "a" + method)
        return await self._awrite(
            anchor,
            token_of(args, kwargs),
            lambda: call(*args, **kwargs),
            lambda: acall(*args, **kwargs),
        )

    write.__name__, awrite.__name__ = method, "a" + method
    return write, awrite


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
    runs on the caller's Django connection). A store whose class says
    ``async_inline = True`` (the in-memory one: a dict under a lock held for
    microseconds) is called on the loop itself: a hop to an executor thread would cost
    tens of microseconds of CPU per write, far more than the write.
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
        #: The wrapped store never blocks: its sync operations run on the loop.
        self.inline = bool(getattr(store, "async_inline", False)) and not self.fenced

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
        if self.inline:
            return self._write(anchor, token, write)
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

    # -- reads: straight through ------------------------------------------------------

    def find(self, stream_name: str) -> Checkpoint | None:
        return self.inner.find(stream_name)

    def delete(self, stream_name: str) -> None:
        self.inner.delete(stream_name)

    def list_checkpoints(self) -> list[Checkpoint]:
        return self.inner.list_checkpoints()

    async def afind(self, stream_name: str) -> Checkpoint | None:
        if self.inline:
            return self.inner.find(stream_name)
        return await self.inner.afind(stream_name)

    async def alist_checkpoints(self) -> list[Checkpoint]:
        if self.inline:
            return self.inner.list_checkpoints()
        return await self.inner.alist_checkpoints()

    async def adelete(self, stream_name: str) -> None:
        if self.inline:
            return self.inner.delete(stream_name)
        await self.inner.adelete(stream_name)

    # -- the writes, observed (and fenced); each in a sync and an async variant -------

    save, asave = _observed("save", "record")
    save_seen, asave_seen = _observed("save_seen", "seen", "token")
    save_processed, asave_processed = _observed("save_processed", "processed", "token")
    save_heartbeat, asave_heartbeat = _observed("save_heartbeat", "heartbeat")
    reset_after_history_lost, areset_after_history_lost = _observed(
        "reset_after_history_lost", "reset", "fresh_seen_token"
    )
    save_initial_sync, asave_initial_sync = _observed("save_initial_sync", "initial_sync")
