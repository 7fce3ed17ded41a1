"""One stream's consumer on an event loop (first cut): many streams share one loop.

``AsyncStreamConsumer`` follows :class:`~.runtime.StreamConsumer`: the same spec,
the resume cascade (processed anchor, then seen anchor, then ``on_history_lost``),
the processed-anchor policy (``save_every_n``, ``save_interval_seconds``, a flush
on stop), the idle heartbeat, retries, ``on_error`` and the dead-letter queue. It
reads through an :class:`~.async_source.AsyncChangeSource`, writes through the
stores' ``a…`` methods, awaits ``async def`` handlers and runs sync ones with
``sync_to_async(thread_sensitive=True)`` (they may use the ORM).

Not in this cut (refused with a clear error): initial sync (``COPY_EXISTING``,
``RESYNC``), ``RESUME_FROM_OPLOG_START``, ``SINGLE_LEADER`` leases, transactional
streams; ``ctx.save_checkpoint_now()`` and ``ctx.send_to_dlq()`` are unavailable
(the first returns ``False``, the second raises).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.utils import timezone

from ..common.outages import error_summary, is_outage, short_message
from . import initial_sync, metrics
from .checkpoint import Checkpoint, CheckpointStore
from .context import ChangeContext, aware_datetime
from .dispatch import HandlerCaller, is_async
from .dlq import DlqPolicy, DlqStore
from .dlq import error_info as make_error_info
from .runtime import (
    DeadLetterWriteError,
    FilterError,
    HistoryLostError,
    StreamInvalidatedError,
    StreamState,
    UnhandledEventError,
    _event_anchor_at,
    announce_retry,
    dead_letter_entry,
)
from .source import is_history_lost
from .spec import LIFECYCLE_OPERATIONS, NO_RETRY, ErrorAction, StreamSpec
from .tokens import tokens_equal

logger = logging.getLogger("flowwarden_django.streams")

#: The ``on_history_lost`` strategies this cut implements.
SUPPORTED_HISTORY_LOST = ("FAIL", "RESUME_FROM_NOW")


class _RestartNow(Exception):
    """End this generation and resubscribe at once (a self-healed invalidate)."""


class _Opened:
    def __init__(
        self,
        cursor: Any,
        *,
        first_event: Mapping[str, Any] | None = None,
        certified: Mapping[str, Any] | None = None,
        confirmed: Mapping[str, Any] | None = None,
    ) -> None:
        self.cursor = cursor
        self.first_event = first_event
        self.certified = certified
        self.confirmed = confirmed


def _resolve_at(at: Any) -> datetime:
    return at() if callable(at) else at


class AsyncAnchorPolicy:
    """The processed-anchor policy on one event loop (see :mod:`.policy`).

    One consumer task is its only writer, so it needs no lock. A failed write
    leaves the anchor dirty; settling events retries it after ``retry_pause_seconds``.
    """

    retry_pause_seconds = 0.5

    def __init__(
        self,
        store: CheckpointStore,
        stream_name: str,
        *,
        save_every_n: int,
        save_interval_seconds: float,
        confirmed_token: Mapping[str, Any] | None,
        monotonic: Callable[[], float],
    ) -> None:
        self.store = store
        self.stream_name = stream_name
        self.save_every_n = max(1, save_every_n)
        self.save_interval_seconds = save_interval_seconds
        self.confirmed_token = confirmed_token
        self._monotonic = monotonic
        self._pending: tuple[Mapping[str, Any], Any] | None = None
        self._count = 0
        self._dirty_since: float | None = None
        self._failed_at: float | None = None
        self.writes = 0
        self.failures = 0

    @property
    def dirty(self) -> bool:
        return self._pending is not None

    async def on_settled(self, token: Mapping[str, Any], at: Any) -> None:
        if tokens_equal(token, self.confirmed_token):
            self._pending, self._count = None, 0
            return
        self._pending = (token, at)
        self._count += 1
        if self._dirty_since is None:
            self._dirty_since = self._monotonic()
        if self._count >= self.save_every_n:
            await self._persist()

    async def flush_if_due(self) -> bool:
        if self._pending is None or not self.save_interval_seconds:
            return False
        if self._monotonic() - (self._dirty_since or 0) < self.save_interval_seconds:
            return False
        return await self._persist()

    async def flush(self) -> bool:
        """Persist a dirty anchor now; True when nothing is left dirty."""
        return self._pending is None or await self._persist(force=True)

    async def _persist(self, *, force: bool = False) -> bool:
        assert self._pending is not None
        if (
            not force
            and self._failed_at is not None
            and self._monotonic() - self._failed_at < self.retry_pause_seconds
        ):
            return False
        token, at = self._pending
        try:
            await self.store.asave_processed(
                self.stream_name, token, _resolve_at(at), heartbeat_at=timezone.now()
            )
        except Exception:
            self.failures += 1
            self._failed_at = self._monotonic()
            logger.warning(
                "stream %r: saving the processed anchor failed (it stays dirty)",
                self.stream_name,
                exc_info=True,
            )
            return False
        self._failed_at = None
        self.writes += 1
        self.confirmed_token = token
        self._pending, self._count, self._dirty_since = None, 0, None
        return True


class AsyncStreamConsumer:
    """Consumes one declared stream on the running event loop until stopped.

    ``await run()`` returns on ``stop()`` (or, with ``burst=True``, once caught up);
    lost history under ``FAIL``, a rename, or running out of restart attempts
    raise (``state`` is then ``CRASHED``). Run many with ``asyncio.gather``.
    """

    #: The longest wait between two restarts while a server does not answer.
    outage_restart_max_seconds = 2.0

    def __init__(
        self,
        spec: StreamSpec,
        store: CheckpointStore,
        source_factory: Callable[[StreamSpec], Any] | None = None,
        *,
        dlq_store: DlqStore | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._refuse_unsupported(spec)
        if source_factory is None:
            from .async_source import async_pymongo_source

            source_factory = async_pymongo_source
        self.spec = spec
        self.store = store
        self.source_factory = source_factory
        self._dlq_store = dlq_store
        self._monotonic = monotonic
        self._stop: asyncio.Event | None = None
        self._stop_requested = False
        self._caller = HandlerCaller()
        self.state = StreamState.STOPPED
        self.last_error: BaseException | None = None
        self.events_handled = 0
        self.restarts = 0
        self.errors = 0
        self.retries = 0
        self.dead_lettered = 0
        self.heartbeats = 0
        self.policy: AsyncAnchorPolicy | None = None
        self._invalidate_cause: str | None = None

    @staticmethod
    def _refuse_unsupported(spec: StreamSpec) -> None:
        def refuse(what: str) -> None:
            raise NotImplementedError(
                f"stream {spec.name!r}: {what} is not supported by AsyncStreamConsumer yet "
                "(first cut); run this stream with the threaded StreamConsumer"
            )

        if spec.transactional:
            refuse("a transactional stream")
        if spec.deployment_mode == "SINGLE_LEADER":
            refuse("SINGLE_LEADER (leases)")
        checkpoint = spec.checkpoint
        if checkpoint.start_position == "COPY_EXISTING":
            refuse("start_position COPY_EXISTING (initial sync)")
        if checkpoint.on_history_lost not in SUPPORTED_HISTORY_LOST:
            refuse(f"on_history_lost {checkpoint.on_history_lost}")

    # -- control ---------------------------------------------------------------------

    def stop(self) -> None:
        """Stop after the event in hand (the anchor is flushed). Call it on the loop."""
        self._stop_requested = True
        if self._stop is not None:
            self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop_requested

    async def _sleep(self, seconds: float) -> bool:
        """Sleep; True if a stop cut it short."""
        assert self._stop is not None
        try:
            await asyncio.wait_for(self._stop.wait(), timeout=max(0.0, seconds))
        except TimeoutError:
            return self._stop_requested
        return True

    async def run(self, *, burst: bool = False) -> None:
        """Consume until stopped (or caught up, with *burst*); raise when terminal."""
        self._stop = asyncio.Event()
        if self._stop_requested:
            self._stop.set()
        try:
            await self._run(burst=burst)
        finally:
            # The connections sync handlers and stores opened on the thread-sensitive
            # executor: dropped when broken or expired, as the sync consumer does.
            await sync_to_async(close_old_connections, thread_sensitive=True)()

    async def _run(self, *, burst: bool) -> None:
        attempt = 0
        while not self._stop_requested:
            self.state = StreamState.STARTING
            handled_before = self.events_handled
            try:
                await self._run_generation(burst=burst)
                break
            except _RestartNow:
                self.restarts += 1
                continue
            except (HistoryLostError, StreamInvalidatedError, NotImplementedError) as exc:
                self._crash(exc)
                raise
            except Exception as exc:
                attempt = 0 if self.events_handled > handled_before else attempt
                attempt += 1
                policy = self.spec.restart_policy
                if policy.max_attempts and attempt > policy.max_attempts:
                    self._crash(exc)
                    raise
                self.last_error = exc
                self.state = StreamState.RESTARTING
                delay = policy.delay(attempt)
                if policy.jitter:
                    delay *= random.uniform(0.8, 1.2)
                if is_outage(exc):
                    delay = min(delay, self.outage_restart_max_seconds)
                logger.warning(
                    "stream %r: stopped by %s (%s); restart %d in %.1fs",
                    self.spec.name,
                    error_summary(exc),
                    short_message(exc),
                    attempt,
                    delay,
                )
                self.restarts += 1
                if await self._sleep(delay):
                    break
        self.state = StreamState.STOPPED
        metrics.emit(metrics.stream_stopped, self.spec.name, reason="GRACEFUL", cause=None)

    def _crash(self, exc: BaseException) -> None:
        self.state = StreamState.CRASHED
        self.last_error = exc
        logger.error("stream %r stopped: %s", self.spec.name, exc)
        metrics.emit(metrics.stream_stopped, self.spec.name, reason="CRASHED", cause=exc)

    # -- one generation ----------------------------------------------------------------

    async def _run_generation(self, *, burst: bool) -> None:
        source = self.source_factory(self.spec)
        opened = await self._open(source)
        self.state = StreamState.RUNNING
        checkpoint = self.spec.checkpoint
        self.policy = AsyncAnchorPolicy(
            self.store,
            self.spec.name,
            save_every_n=checkpoint.save_every_n,
            save_interval_seconds=checkpoint.save_interval_seconds,
            confirmed_token=opened.confirmed,
            monotonic=self._monotonic,
        )
        heartbeat = _Heartbeat(self, opened.certified)
        self._invalidate_cause = None
        cursor, event = opened.cursor, opened.first_event
        try:
            while not self._stop_requested:
                if event is None:
                    event = await cursor.try_next()
                if event is None:
                    if not cursor.alive:
                        raise ConnectionError("the change stream closed")
                    await self.policy.flush_if_due()
                    await heartbeat.on_idle(cursor.resume_token)
                    if burst:
                        break
                    await asyncio.sleep(0)  # let the other streams of the loop run
                    continue
                settled = await self._handle(event, source)
                if settled is None:
                    break  # a stop cut the retries short: unsettled, redelivered later
                heartbeat.last_activity = self._monotonic()
                event = None
                await self.policy.flush_if_due()
        finally:
            await self._close(cursor)

    async def _close(self, cursor: Any) -> None:
        if self.policy is not None and not await self.policy.flush():
            logger.warning("stream %r: the processed anchor could not be flushed", self.spec.name)
        try:
            await cursor.close()
        except Exception:
            logger.debug("stream %r: closing the cursor failed", self.spec.name, exc_info=True)

    # -- the resume cascade (the same decisions as StreamConsumer._open) ------------------

    async def _open(self, source: Any) -> _Opened:
        name, policy = self.spec.name, self.spec.checkpoint
        if policy.start_position == "LATEST":
            return _Opened(await source.open())
        saved = await self.store.afind(name)
        if initial_sync.due(self, saved) is not None:  # type: ignore[arg-type]
            raise NotImplementedError(
                f"stream {name!r}: an initial sync is due (or in progress); "
                "AsyncStreamConsumer does not copy yet (first cut)"
            )
        if saved is None or (saved.last_processed_token is None and saved.last_seen_token is None):
            position = await source.initial_position()
            now = timezone.now()
            await self.store.asave_seen(name, position, now, heartbeat_at=now)
            return _Opened(await source.open(resume_after=position), certified=position)
        processed, seen = saved.last_processed_token, saved.last_seen_token
        if processed is not None:
            opened = await self._try_open(source, processed)
            if opened is not None:
                opened.confirmed = processed
                return opened
        if seen is not None and not tokens_equal(seen, processed):
            opened = await self._try_open(source, seen)
            if opened is not None:
                if processed is not None:
                    metrics.emit(metrics.resume_fallback_to_seen, name)
                    logger.warning(
                        "stream %r: the processed anchor aged out of the oplog; resuming from "
                        "the last certified position (events in between were handled)",
                        name,
                    )
                opened.certified = seen
                return opened
        return await self._history_lost(source, saved)

    async def _try_open(self, source: Any, token: Mapping[str, Any]) -> _Opened | None:
        try:
            cursor = await source.open(resume_after=token)
        except Exception as exc:
            if is_history_lost(exc):
                return None
            raise
        try:
            first = await cursor.try_next()
        except Exception as exc:
            await cursor.close()
            if is_history_lost(exc):
                return None
            raise
        return _Opened(cursor, first_event=first)

    async def _history_lost(self, source: Any, saved: Checkpoint) -> _Opened:
        name, strategy = self.spec.name, self.spec.checkpoint.on_history_lost
        metrics.emit(metrics.resume_history_lost, name)
        if strategy == "FAIL":
            known = [
                t
                for t in (saved.last_processed_at, saved.last_seen_at, saved.last_heartbeat_at)
                if t is not None
            ]
            raise HistoryLostError(name, max(known) if known else None)
        # RESUME_FROM_NOW (the constructor refused the others).
        logger.warning("stream %r: history lost; resuming from now", name)
        position = await source.initial_position()
        await self.store.areset_after_history_lost(
            name, position, saved.last_processed_token, timezone.now()
        )
        return _Opened(await source.open(resume_after=position), certified=position)

    # -- one event -----------------------------------------------------------------------

    async def _handle(self, event: Mapping[str, Any], source: Any) -> bool | None:
        """Handle one event: True/False once settled, None when a stop left it unsettled."""
        operation = event.get("operationType", "")
        if operation == "invalidate":
            await self._invalidated(event, source)
        lifecycle = operation in LIFECYCLE_OPERATIONS
        if lifecycle:
            self._invalidate_cause = operation
        ctx = ChangeContext(event, stream_name=self.spec.name)
        received = metrics.listeners(metrics.event_received, self.spec.name)
        if received:
            metrics.send_event_received(
                self.spec.name,
                received,
                ctx.event_id,
                operation,
                ctx.collection_name,
                ctx.document_key,
                ctx.cluster_time,
                aware_datetime(event.get("wallTime")),
            )
        started = time.perf_counter()
        result = await self._attempt_loop(self.spec.handler_for(operation), ctx, lifecycle)
        processed = metrics.listeners(metrics.event_processed, self.spec.name)
        if processed:
            metrics.send_event_processed(
                self.spec.name, processed, time.perf_counter() - started, result
            )
        if result is not None:
            self.events_handled += 1
        return result

    async def _call(self, function: Callable[..., Any], doc: Any, ctx: ChangeContext) -> Any:
        """``async def``: awaited here; sync: on the thread-sensitive executor (ORM-safe)."""
        if is_async(function):
            shape = self._caller.shape(function)
            if shape == "doc":
                return await function(doc)
            if shape == "ctx":
                return await function(ctx)
            return await function(doc, ctx)
        return await sync_to_async(self._caller.call, thread_sensitive=True)(function, doc, ctx)

    async def _try_once(
        self, handler: Callable[..., Any] | None, ctx: ChangeContext
    ) -> Exception | None:
        if handler is None:
            return None
        if self.spec.filter is not None:
            try:
                accepted = await self._call(self.spec.filter, ctx.full_document, ctx)
            except Exception as exc:
                raise FilterError(f"stream {self.spec.name!r}: the filter raised {exc!r}") from exc
            if not accepted:
                return None
        try:
            await self._call(handler, ctx.full_document, ctx)
        except Exception as exc:
            return exc
        return None

    async def _settle(self, ctx: ChangeContext, lifecycle: bool) -> None:
        if lifecycle:
            return
        assert self.policy is not None
        await self.policy.on_settled(ctx.resume_token, _event_anchor_at(ctx.event))

    async def _attempt_loop(
        self, handler: Callable[..., Any] | None, ctx: ChangeContext, lifecycle: bool
    ) -> bool | None:
        retry = self.spec.retry_policy or NO_RETRY
        attempt = 1
        while True:
            ctx.attempt_number = attempt
            error = await self._try_once(handler, ctx)
            if error is None:
                await self._settle(ctx, lifecycle)
                return True
            self.errors += 1
            self.last_error = error
            action = await self._error_action(error, ctx)
            if action is ErrorAction.SKIP:
                logger.warning(
                    "stream %r: skipped %s after: %r", self.spec.name, ctx.summary(), error
                )
                await self._settle(ctx, lifecycle)
                return False
            if action is ErrorAction.RETRY:
                again = attempt < retry.max_attempts
            elif action is ErrorAction.RETHROW:
                again = retry.should_retry(error, attempt)
            else:
                again = False
            metrics.emit(
                metrics.event_error,
                self.spec.name,
                error=error,
                will_retry=again,
                attempt=attempt,
                event_id=ctx.event_id,
            )
            if not again:
                await self._dead_letter(error, ctx, lifecycle)
                return False
            delay = announce_retry(self.spec.name, ctx, error, attempt, retry)
            self.retries += 1
            if await self._sleep(delay):
                return None
            attempt += 1

    async def _error_action(self, error: Exception, ctx: ChangeContext) -> ErrorAction:
        handler = self.spec.error_handler_for(error)
        if handler is None:
            return ErrorAction.RETHROW
        try:
            if is_async(handler):
                decision = await handler(error, ctx)
            else:
                decision = await sync_to_async(handler, thread_sensitive=True)(error, ctx)
            return ErrorAction.RETHROW if decision is None else ErrorAction(decision)
        except Exception:
            logger.exception(
                "stream %r: the on_error handler failed; applying the retry policy", self.spec.name
            )
            return ErrorAction.RETHROW

    # -- the dead-letter queue -------------------------------------------------------------

    @property
    def dlq_store(self) -> DlqStore:
        if self._dlq_store is None:
            from .stores import dlq_stores

            queue = self.spec.dead_letter_queue
            self._dlq_store = dlq_stores[queue.store if queue is not None else "default"]
        return self._dlq_store

    async def _dead_letter(self, error: Exception, ctx: ChangeContext, lifecycle: bool) -> None:
        queue = self.spec.dead_letter_queue
        if queue is None or not queue.enabled:
            raise UnhandledEventError(
                f"stream {self.spec.name!r}: {ctx.summary()} failed: {error!r}"
            ) from error
        policy = DlqPolicy(
            queue.retention_days, queue.include_original_document, queue.include_stack_trace
        )
        info = make_error_info(error, include_stack_trace=queue.include_stack_trace)
        entry = dead_letter_entry(self.spec.name, ctx, info, policy)
        try:
            await self.dlq_store.asave(entry, policy)
        except Exception as exc:
            metrics.emit(metrics.event_dlq_failed, self.spec.name, error=exc)
            raise DeadLetterWriteError(
                f"stream {self.spec.name!r}: could not park {ctx.summary()}: {exc}"
            ) from exc
        self.dead_lettered += 1
        metrics.emit(metrics.event_sent_to_dlq, self.spec.name, entry_id=entry.id)
        logger.error(
            "stream %r: %s parked in the dead-letter queue as %s (%s: %s)",
            self.spec.name,
            ctx.summary(),
            entry.id,
            info.type,
            info.message,
        )
        await self._settle(ctx, lifecycle)

    async def _invalidated(self, event: Mapping[str, Any], source: Any) -> None:
        cause = self._invalidate_cause or "drop"
        name = self.spec.name
        metrics.emit(metrics.stream_invalidated, name, cause=cause)
        self.policy = None  # no anchor write may land after the reset below
        saved = await self.store.afind(name)
        dead = saved.last_processed_token if saved else None
        terminal = cause == "rename" or self.spec.checkpoint.on_history_lost == "FAIL"
        if not terminal:
            try:
                fresh = await source.initial_position()
                await self.store.areset_after_history_lost(name, fresh, dead, timezone.now())
            except Exception:
                logger.exception("stream %r: repairing after invalidate failed", name)
                terminal = True
            else:
                logger.warning("stream %r: collection %s; restarting from now", name, cause)
                raise _RestartNow
        await self.store.areset_after_history_lost(name, event["_id"], dead, timezone.now())
        raise StreamInvalidatedError(
            f"stream {name!r}: the collection was {'renamed' if cause == 'rename' else 'dropped'}"
            " (invalidate); the stream stopped. Reset its checkpoint to start it again."
        )


class _Heartbeat:
    """Certifies an idle stream's position (the seen anchor), as the sync heartbeat."""

    def __init__(self, consumer: AsyncStreamConsumer, certified: Mapping[str, Any] | None):
        self.consumer = consumer
        self.interval = float(consumer.spec.checkpoint.idle_heartbeat_interval_seconds)
        self.certified = certified
        now = consumer._monotonic()
        self.last_activity = now
        self.last_write = now

    async def on_idle(self, position: Mapping[str, Any] | None) -> None:
        if position is None or not self.interval:
            return
        now = self.consumer._monotonic()
        if now - self.last_activity < self.interval or now - self.last_write < self.interval:
            return
        store, name, at = self.consumer.store, self.consumer.spec.name, timezone.now()
        try:
            if tokens_equal(position, self.certified):
                await store.asave_heartbeat(name, at)
            else:
                await store.asave_seen(name, position, at, heartbeat_at=at)
        except Exception as exc:
            metrics.emit(metrics.heartbeat_failed, name, error=exc)
            logger.warning("stream %r: the heartbeat write failed: %s", name, exc)
            return
        self.consumer.heartbeats += 1
        self.certified = position
        self.last_write = now


async def run_streams(consumers: list[AsyncStreamConsumer], *, burst: bool = False) -> None:
    """Run *consumers* concurrently on the running loop; the first terminal error
    stops the others and is raised."""
    tasks = [asyncio.ensure_future(c.run(burst=burst)) for c in consumers]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for consumer in consumers:
            consumer.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
