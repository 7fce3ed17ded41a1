"""The processed-anchor policies: when the last settled event is persisted, and how.

The decisions are the core's (:class:`~.core.anchors.AnchorLedger`); a policy
serializes its writers (count threshold, age threshold, manual save), so an older
write can never land after a newer one, and performs the write: with a thread lock
and the store's sync methods (``ProcessedAnchorPolicy``, the threaded consumer), or
with an ``asyncio.Lock`` and its ``a…`` methods (``AsyncAnchorPolicy``, one event
loop). Each write carries the heartbeat, in the same operation.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from asgiref.sync import sync_to_async
from django.utils import timezone

from ...common.connections import discard_unusable_connections
from ...common.failure_log import FailureLog
from ..checkpoint import CheckpointStore
from ..core.anchors import AnchorLedger, At, resolve_at

__all__ = [
    "AsyncAnchorPolicy",
    "At",
    "PolicyOnStreamThread",
    "ProcessedAnchorPolicy",
    "TransactionalAnchors",
]

logger = logging.getLogger("flowwarden_django.streams")


def anchor_failure_log(stream_name: str) -> FailureLog:
    """The ``FailureLog`` of a stream's processed-anchor writes."""
    return FailureLog(
        logger, f"stream {stream_name!r}: saving the processed anchor (it stays dirty)"
    )


class ProcessedAnchorPolicy(AnchorLedger):
    """Decides and performs the ``save_processed`` writes of one stream, from any thread."""

    def __init__(
        self,
        store: CheckpointStore,
        stream_name: str,
        *,
        save_every_n: int = 1,
        save_interval_seconds: float = 5,
        confirmed_token: Mapping[str, Any] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        failure_log: FailureLog | None = None,
    ) -> None:
        super().__init__(
            stream_name,
            save_every_n=save_every_n,
            save_interval_seconds=save_interval_seconds,
            confirmed_token=confirmed_token,
            monotonic=monotonic,
            failure_log=failure_log or anchor_failure_log(stream_name),
        )
        self.store = store
        self._lock = threading.Lock()

    def cancel(self) -> None:
        """Refuse every later write (the stream's anchors are being replaced)."""
        with self._lock:
            self._cancel()

    def on_settled(self, token: Mapping[str, Any], at: At, *, strict: bool = False) -> None:
        """Record a terminally settled event; persist when the count is reached.

        *at* is the anchor's timestamp, or a function returning it: called only if
        this settlement is the one written (most are replaced by the next one first).
        With ``strict`` (transactional streams) every settlement is written and a
        failed write raises, so the caller's transaction rolls back with it.
        """
        with self._lock:
            if self._settled(token, at, strict):
                self._persist(strict=strict)

    def flush_if_due(self) -> bool:
        """Persist a dirty anchor older than ``save_interval_seconds``; ``True`` if written."""
        if self.age_flush_ruled_out():
            return False  # the common case, decided without the lock
        with self._lock:
            return self._aged() and self._persist()

    def flush(self) -> bool:
        """Persist a dirty anchor now (graceful stop); ``True`` if nothing is left dirty."""
        with self._lock:
            return self._pending is None or self._persist(force=True)

    def save_now(self, token: Mapping[str, Any], at: At, *, strict: bool = False) -> bool:
        """Persist *token* immediately (``ctx.save_checkpoint_now()``)."""
        with self._lock:
            self._pending = (token, at)
            return self._persist(strict=strict, force=True)

    def _persist(self, *, strict: bool = False, force: bool = False) -> bool:
        written = self._to_write(force=strict or force)
        if written is None:
            return False
        try:
            self.store.save_processed(
                self.stream_name, written[0], resolve_at(written[1]), heartbeat_at=timezone.now()
            )
        except Exception as exc:
            self._write_failed(exc, strict=strict)
            if strict:
                raise
            discard_unusable_connections()  # outside any transaction: strict raised above
            return False
        self._written(written)
        return True


class AsyncAnchorPolicy(AnchorLedger):
    """The processed-anchor policy on one event loop.

    An ``asyncio.Lock`` serializes its writes; the bookkeeping of a settled event
    needs none (nothing else runs on the loop meanwhile), so the lock is taken only
    to write. An event settled while a write is in flight keeps the anchor dirty.
    """

    def __init__(self, store: CheckpointStore, stream_name: str, **options: Any) -> None:
        options["failure_log"] = options.get("failure_log") or anchor_failure_log(stream_name)
        super().__init__(stream_name, **options)
        self.store = store
        self._lock = asyncio.Lock()

    def cancel(self) -> None:
        """Refuse every later write (the stream's anchors are being replaced)."""
        self._cancel()

    async def on_settled(self, token: Mapping[str, Any], at: At) -> None:
        """Record a settled event; persist when the count is reached."""
        if self.record(token, at):
            await self.write_recorded()

    def record(self, token: Mapping[str, Any], at: At) -> bool:
        """``on_settled``'s bookkeeping, on the loop without a coroutine: whether a
        write is due now (then await :meth:`write_recorded`)."""
        return self._settled(token, at, False)

    async def write_recorded(self) -> None:
        """Persist the anchor :meth:`record` said is due (unless a write took it)."""
        async with self._lock:
            if self._pending is not None:
                await self._persist()

    async def flush_if_due(self) -> bool:
        """Persist a dirty anchor older than ``save_interval_seconds``; True if written."""
        if self.age_flush_ruled_out():
            return False
        async with self._lock:
            return self._aged() and await self._persist()

    async def flush(self) -> bool:
        """Persist a dirty anchor now; True when nothing is left dirty."""
        async with self._lock:
            return self._pending is None or await self._persist(force=True)

    async def save_now(self, token: Mapping[str, Any], at: At) -> bool:
        """Persist *token* immediately (``ctx.asave_checkpoint_now()``)."""
        async with self._lock:
            self._pending = (token, at)
            return await self._persist(force=True)

    async def _persist(self, *, force: bool = False) -> bool:
        written = self._to_write(force=force)
        if written is None:
            return False
        try:
            await self.store.asave_processed(
                self.stream_name, written[0], resolve_at(written[1]), heartbeat_at=timezone.now()
            )
        except Exception as exc:
            self._write_failed(exc, strict=False)
            if self.store.async_thread_sensitive:  # the write ran on the stream's thread
                await sync_to_async(discard_unusable_connections, thread_sensitive=True)()
            return False
        self._written(written)
        return True


class TransactionalAnchors:
    """The anchors of a transactional stream on an event loop: every write is made
    inside the event's transaction, on the stream's thread (the threaded consumer's
    strict policy), so nothing is ever left dirty for the loop to flush."""

    def __init__(self, policy: ProcessedAnchorPolicy) -> None:
        self.policy = policy

    @property
    def confirmed_token(self) -> Mapping[str, Any] | None:
        return self.policy.confirmed_token

    def cancel(self) -> None:
        self.policy.cancel()

    async def flush_if_due(self) -> bool:
        return False

    async def flush(self) -> bool:
        return not self.policy.dirty


class PolicyOnStreamThread:
    """A sync anchor policy (``ProcessedAnchorPolicy``: a thread lock, the store's
    sync methods) used from an event loop: each call that may write runs on the
    stream's thread. The window of a transactional stream handled in parallel on
    asyncio feeds its ``MarkedAnchorPolicy`` through it."""

    def __init__(self, policy: ProcessedAnchorPolicy) -> None:
        self.policy = policy

    @property
    def confirmed_token(self) -> Mapping[str, Any] | None:
        return self.policy.confirmed_token

    @property
    def dirty(self) -> bool:
        return self.policy.dirty

    def cancel(self) -> None:
        self.policy.cancel()

    async def on_settled(self, token: Mapping[str, Any], at: At) -> None:
        await sync_to_async(self.policy.on_settled, thread_sensitive=True)(token, at)

    async def on_settled_batch(self, settled: list[tuple[Mapping[str, Any], At]]) -> None:
        """``on_settled`` for each of *settled*, in order, in one hop to the thread."""
        await sync_to_async(self._settle_all, thread_sensitive=True)(settled)

    def _settle_all(self, settled: list[tuple[Mapping[str, Any], At]]) -> None:
        for token, at in settled:
            self.policy.on_settled(token, at)

    async def flush_if_due(self) -> bool:
        if not self.policy.dirty:
            return False
        return await sync_to_async(self.policy.flush_if_due, thread_sensitive=True)()

    async def flush(self) -> bool:
        return await sync_to_async(self.policy.flush, thread_sensitive=True)()

    async def save_now(self, token: Mapping[str, Any], at: At) -> bool:
        return await sync_to_async(self.policy.save_now, thread_sensitive=True)(token, at)
