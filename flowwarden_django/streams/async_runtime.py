"""One stream's consumer on an event loop: many streams share one loop.

``AsyncStreamConsumer`` follows :class:`~.runtime.StreamConsumer`: the same spec,
the resume cascade (processed anchor, then seen anchor, then ``on_history_lost``
with all four strategies), the processed-anchor policy (``save_every_n``,
``save_interval_seconds`` with an age flusher, a flush on stop), the idle
heartbeat, retries, ``on_error``, the dead-letter queue, ``SINGLE_LEADER`` leases
(``lease_valid`` and a fenced store, as ``StreamManager`` passes them) and
transactional streams. It reads through an :class:`~.async_source.AsyncChangeSource`,
writes through the stores' ``a…`` methods and awaits ``async def`` handlers.

What runs on a thread, and why:

* sync handlers, filters and ``on_error`` handlers run through
  ``sync_to_async(thread_sensitive=True)`` inside the stream's own
  ``ThreadSensitiveContext``: each stream that has sync code gets one thread (and
  one database connection) of its own, as a Django request does, and a stream of
  ``async def`` handlers on async stores uses none;
* a transactional stream's attempt (the handler, then the anchor write, in one
  ``transaction.atomic``) runs on that thread: a Django transaction belongs to a
  thread. An ``async def`` handler still runs on the loop, and its async ORM calls
  come back to that thread, inside the transaction;
* an initial sync (``COPY_EXISTING``, ``RESYNC``, a resync on demand) copies with the
  sync driver on a worker thread, through the same code as the threaded consumer
  (:mod:`.initial_sync`): a bounded phase, after which the stream streams natively.

:class:`~.async_manager.AsyncStreamManager` runs these consumers for
``flowwarden_streams run --asyncio``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from functools import partial
from typing import Any

from asgiref.sync import ThreadSensitiveContext, async_to_sync, sync_to_async
from django.db import close_old_connections, connections
from django.utils import timezone

from ..common.connections import discard_unusable_connections
from ..common.failure_log import FailureLog
from . import initial_sync, metrics
from .checkpoint import Checkpoint, CheckpointStore
from .context import ChangeContext
from .core import effects
from .core.driving import adrive
from .core.events import (
    FilterError,
    attempt_loop,
    dead_letter,
    park_on_request,
)
from .core.heartbeat import Heartbeat
from .core.resume import HistoryLostError, Opened, open_arguments, open_stream
from .dispatch import HandlerCaller, is_async
from .dlq import DlqStore
from .locks import LeaseLostError
from .observed_store import ObservedCheckpointStore
from .policy import ProcessedAnchorPolicy, anchor_failure_log
from .runtime import (
    StreamConsumer,
    StreamInvalidatedError,
    StreamState,
    _event_anchor_at,
    _RestartNow,
    announce_received,
)
from .source import ChangeSource
from .spec import LIFECYCLE_OPERATIONS, StreamSpec
from .tokens import tokens_equal

logger = logging.getLogger("flowwarden_django.streams")


def _resolve_at(at: Any) -> datetime:
    return at() if callable(at) else at


def _on_loop_thread() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class AsyncAnchorPolicy:
    """The processed-anchor policy on one event loop (see :mod:`.policy`).

    An ``asyncio.Lock`` serializes its writes (the count threshold, the age flusher, a
    manual save), so an older anchor never lands after a newer one; an event settled
    while a write is in flight keeps the anchor dirty. A failed write
    leaves the anchor dirty; settling events retry it after ``retry_pause_seconds``.
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
        failure_log: FailureLog | None = None,
    ) -> None:
        self.store = store
        #: The consumer's, which outlives a generation's policy (logged once an outage).
        self.failure_log = failure_log or anchor_failure_log(stream_name)
        self.stream_name = stream_name
        self.save_every_n = max(1, save_every_n)
        self.save_interval_seconds = save_interval_seconds
        self.confirmed_token = confirmed_token
        self._monotonic = monotonic
        self._lock = asyncio.Lock()
        self._pending: tuple[Mapping[str, Any], Any] | None = None
        self._count = 0
        self._dirty_since: float | None = None
        self._failed_at: float | None = None
        self._cancelled = False
        self.writes = 0
        self.failures = 0

    @property
    def dirty(self) -> bool:
        return self._pending is not None

    def cancel(self) -> None:
        """Refuse every later write (the stream's anchors are being replaced)."""
        self._cancelled = True
        self._pending = None

    async def on_settled(self, token: Mapping[str, Any], at: Any) -> None:
        # No await before the write: on one loop this bookkeeping is atomic, so the lock
        # is taken only to write (once per save_every_n events).
        # Dict equality first: BSON-encoding both tokens on every event is costly.
        if token == self.confirmed_token and tokens_equal(token, self.confirmed_token):
            self._pending, self._count = None, 0
            return
        self._pending = (token, at)
        self._count += 1
        if self._dirty_since is None:
            self._dirty_since = self._monotonic()
        if self._count >= self.save_every_n:
            async with self._lock:
                if self._pending is not None:
                    await self._persist()

    async def flush_if_due(self) -> bool:
        if self._pending is None or not self.save_interval_seconds:
            return False
        async with self._lock:
            if self._pending is None:
                return False
            if self._monotonic() - (self._dirty_since or 0) < self.save_interval_seconds:
                return False
            return await self._persist()

    async def flush(self) -> bool:
        """Persist a dirty anchor now; True when nothing is left dirty."""
        async with self._lock:
            return self._pending is None or await self._persist(force=True)

    async def save_now(self, token: Mapping[str, Any], at: Any) -> bool:
        """Persist *token* immediately (``ctx.asave_checkpoint_now()``)."""
        async with self._lock:
            self._pending = (token, at)
            return await self._persist(force=True)

    async def _persist(self, *, force: bool = False) -> bool:
        if self._cancelled:
            self._pending = None
            return False
        assert self._pending is not None
        if (
            not force
            and self._failed_at is not None
            and self._monotonic() - self._failed_at < self.retry_pause_seconds
        ):
            return False
        written = self._pending
        token, at = written
        try:
            await self.store.asave_processed(
                self.stream_name, token, _resolve_at(at), heartbeat_at=timezone.now()
            )
        except Exception as exc:
            self.failures += 1
            self._failed_at = self._monotonic()
            self.failure_log.failed(exc)
            if self.store.async_thread_sensitive:  # the write ran on the stream's thread
                await sync_to_async(discard_unusable_connections, thread_sensitive=True)()
            return False
        self._failed_at = None
        self.failure_log.succeeded()
        self.writes += 1
        self.confirmed_token = token
        if self._pending is written:  # else an event settled during the write: still dirty
            self._pending, self._count, self._dirty_since = None, 0, None
        return True


class _TransactionalAnchors:
    """The anchors of a transactional stream: every write is made inside the event's
    transaction, on the stream's thread (the threaded consumer's strict policy), so
    nothing is ever left dirty for the loop to flush."""

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


def _shared_counter(name: str) -> property:
    """A counter kept by the consumer's thread side (``StreamConsumer``), so the copy
    and the transactional attempts count in the same place as the loop does."""

    def get(self: AsyncStreamConsumer) -> Any:
        return getattr(self._thread_side, name)

    def put(self: AsyncStreamConsumer, value: Any) -> None:
        setattr(self._thread_side, name, value)

    return property(get, put)


class AsyncStreamConsumer:
    """Consumes one declared stream on the running event loop until stopped.

    ``await run()`` returns on ``stop()`` (or, with ``burst=True``, once caught up, or
    when a ``SINGLE_LEADER`` stream's lease is lost); lost history under ``FAIL``, a
    rename, or running out of restart attempts raise (``state`` is then
    ``CRASHED``). Run many with :func:`run_streams`. ``stop()`` may be called from
    any thread. *copy_source_factory* makes the sync source an initial sync copies
    through (default: the stream's pymongo source).
    """

    #: How often the age flusher looks for a dirty anchor past its threshold.
    flush_tick_seconds = 1.0
    #: How often a retry backoff looks at the lease.
    lease_check_seconds = 0.25

    events_handled = _shared_counter("events_handled")
    documents_copied = _shared_counter("documents_copied")
    errors = _shared_counter("errors")
    retries = _shared_counter("retries")
    dead_lettered = _shared_counter("dead_lettered")
    restarts = _shared_counter("restarts")
    state = _shared_counter("state")
    last_error = _shared_counter("last_error")
    started_at = _shared_counter("started_at")
    restarting_since = _shared_counter("restarting_since")
    _last_event_time = _shared_counter("_last_event_time")

    def __init__(
        self,
        spec: StreamSpec,
        store: CheckpointStore,
        source_factory: Callable[[StreamSpec], Any] | None = None,
        *,
        dlq_store: DlqStore | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        lease_valid: Callable[[], bool] | None = None,
        copy_source_factory: Callable[[StreamSpec], ChangeSource] | None = None,
        sleep: Callable[[float], bool] | None = None,
    ) -> None:
        if source_factory is None:
            from .async_source import async_pymongo_source

            source_factory = async_pymongo_source
        if copy_source_factory is None:
            from .manager import pymongo_source

            copy_source_factory = pymongo_source
        self.spec = spec
        self.store = (
            store
            if isinstance(store, ObservedCheckpointStore)
            else ObservedCheckpointStore(store, spec.name)
        )
        self.source_factory = source_factory
        self.copy_source_factory = copy_source_factory
        self.lease_valid = lease_valid
        self._monotonic = monotonic
        # Retry backoff waits here (a test's clock); True when a stop interrupts it.
        self._backoff_sleep = sleep
        #: The thread side: a StreamConsumer of the same stream that runs what must
        #: run on a thread (transactional attempts, the copy, sync ctx actions) and
        #: keeps the counters. It never opens a change stream.
        self._thread_side = StreamConsumer(
            spec,
            self.store,
            copy_source_factory,
            monotonic=monotonic,
            dlq_store=dlq_store,
            lease_valid=lease_valid,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stop_requested = False
        self._caller = HandlerCaller()
        self._async_functions: dict[int, tuple[Callable[..., Any], bool]] = {}
        #: Whether this stream has a thread with database connections to look after:
        #: sync code (a handler, the filter, a transaction) or a thread-bound store.
        self.uses_thread = (
            spec.transactional
            or self.store.async_thread_sensitive
            or any(
                not is_async(code)
                for code in (*spec.handlers.values(), spec.on_change, spec.filter)
                if code is not None
            )
        )
        self._last_housekeeping = float("-inf")
        #: Set after each dead-letter write; whoever reports the backlog clears it.
        self.dlq_dirty: threading.Event = self._thread_side.dlq_dirty
        self.heartbeats = 0
        self.policy: AsyncAnchorPolicy | _TransactionalAnchors | None = None
        self._invalidate_cause: str | None = None

    @property
    def last_event_at(self) -> datetime | None:
        """When the last event was handled."""
        return self._thread_side.last_event_at

    @last_event_at.setter
    def last_event_at(self, value: datetime | None) -> None:
        self._thread_side.last_event_at = value

    @property
    def dlq_store(self) -> DlqStore:
        return self._thread_side.dlq_store

    def configuration(self) -> dict[str, Any]:
        """The stream's settings as ``stream_started`` reports them."""
        return self._thread_side.configuration()

    # -- control ---------------------------------------------------------------------

    def stop(self) -> None:
        """Stop after the event in hand (the anchor is flushed); from any thread."""
        self._stop_requested = True
        self._thread_side.stop()  # a copy in progress stops after its batch
        loop, event = self._loop, self._stop
        if loop is None or event is None:
            return
        if _on_loop_thread() and asyncio.get_running_loop() is loop:
            event.set()
        else:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nothing waits
                loop.call_soon_threadsafe(event.set)

    @property
    def stopping(self) -> bool:
        return self._stop_requested

    def _lease_lost(self) -> bool:
        return self.lease_valid is not None and not self.lease_valid()

    def _check_lease(self) -> None:
        if self._lease_lost():
            raise LeaseLostError(f"stream {self.spec.name!r}: the lease was lost")

    async def _sleep(self, seconds: float) -> bool:
        """Sleep; True if a stop (or a lost lease) cut it short."""
        assert self._stop is not None
        deadline = time.monotonic() + max(0.0, seconds)
        while not (self._stop_requested or self._lease_lost()):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            step = left if self.lease_valid is None else min(left, self.lease_check_seconds)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=step)
        return True

    async def _backoff(self, seconds: float) -> bool:
        """Sleep a retry backoff; True if a stop (or a lost lease) cut it short."""
        if self._backoff_sleep is not None:
            return self._backoff_sleep(seconds) or self._stop_requested or self._lease_lost()
        return await self._sleep(seconds)

    async def run(self, *, burst: bool = False) -> None:
        """Consume until stopped (or caught up, with *burst*); raise when terminal."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if self._stop_requested:
            self._stop.set()
        # Its own thread-sensitive context: this stream's sync code (handlers, the
        # ORM) runs on a thread of its own, not on one thread shared by every stream.
        async with ThreadSensitiveContext():
            try:
                await self._run(burst=burst)
            finally:
                await metrics.drain()  # signals for async receivers, sent as tasks
                # The thread goes with the context: close its database connections.
                await sync_to_async(connections.close_all, thread_sensitive=True)()

    async def _run(self, *, burst: bool) -> None:
        attempt = 0
        while not self._stop_requested:
            self.state = StreamState.STARTING
            handled_before = self.events_handled + self.documents_copied
            try:
                await self._run_generation(burst=burst)
                break
            except initial_sync.CopyInterrupted:
                break  # a stop during the copy: it resumes after its last batch
            except _RestartNow:
                self.restarts += 1
                continue
            except (
                HistoryLostError,
                StreamInvalidatedError,
                initial_sync.InitialSyncConflictError,
            ) as exc:
                self._crash(exc)
                raise
            except LeaseLostError as exc:
                self.last_error = exc
                logger.warning("stream %r: %s; stopping", self.spec.name, exc)
                break
            except Exception as exc:
                progressed = self.events_handled + self.documents_copied > handled_before
                attempt = 0 if progressed else attempt
                attempt += 1
                policy = self.spec.restart_policy
                if policy.max_attempts and attempt > policy.max_attempts:
                    self._crash(exc)
                    raise
                # Django drops broken connections only around requests: without this,
                # every restart would fail again on the stream thread's dead connection.
                await self._discard_unusable_connections()
                delay = self._thread_side._restarting(attempt, exc)
                if await self._sleep(delay):
                    break
        self.state = StreamState.STOPPED
        metrics.emit(metrics.stream_stopped, self.spec.name, reason="GRACEFUL", cause=None)

    async def _discard_unusable_connections(self) -> None:
        """Close the stream thread's broken connections, after a failure there."""
        if self.uses_thread:
            await sync_to_async(discard_unusable_connections, thread_sensitive=True)()

    async def _database_housekeeping(self) -> None:
        """Drop broken or expired connections of the stream's thread now and then while
        it idles, as each request does in a web process (see ``StreamConsumer``)."""
        now = self._monotonic()
        interval = self._thread_side.housekeeping_interval_seconds
        if self.uses_thread and now - self._last_housekeeping >= interval:
            self._last_housekeeping = now
            await sync_to_async(close_old_connections, thread_sensitive=True)()

    def _crash(self, exc: BaseException) -> None:
        self.state = StreamState.CRASHED
        self.last_error = exc
        logger.error("stream %r stopped: %s", self.spec.name, exc)
        metrics.emit(metrics.stream_stopped, self.spec.name, reason="CRASHED", cause=exc)

    # -- one generation ----------------------------------------------------------------

    def _started(self) -> None:
        self.state = StreamState.RUNNING
        self.started_at = timezone.now()
        if self.restarting_since is not None:
            logger.info("stream %r: running again", self.spec.name)
            self.restarting_since = None
        metrics.emit(metrics.stream_started, self.spec.name, config=self.configuration())
        side = self._thread_side
        side._restart_error = None
        if side._restart_cause is not None:
            attempt, cause = side._restart_cause
            side._restart_cause = None
            metrics.emit(metrics.stream_restarted, self.spec.name, attempt=attempt, cause=cause)

    def _new_policy(self, confirmed: Mapping[str, Any] | None) -> Any:
        checkpoint = self.spec.checkpoint
        kind = ProcessedAnchorPolicy if self.spec.transactional else AsyncAnchorPolicy
        policy = kind(
            self.store,
            self.spec.name,
            save_every_n=checkpoint.save_every_n,
            save_interval_seconds=checkpoint.save_interval_seconds,
            confirmed_token=confirmed,
            monotonic=self._monotonic,
            failure_log=self._thread_side._anchor_failures,
        )
        if isinstance(policy, ProcessedAnchorPolicy):
            # Transactional: the thread side writes each anchor inside its transaction.
            self._thread_side.policy = policy
            return _TransactionalAnchors(policy)
        return policy

    async def _run_generation(self, *, burst: bool) -> None:
        source = self.source_factory(self.spec)
        opened = await self._open(source)
        self._started()
        self._thread_side._plans = {}
        policy = self.policy = self._new_policy(opened.confirmed_processed)
        heartbeat = Heartbeat(
            self.spec.name,
            self.spec.checkpoint.idle_heartbeat_interval_seconds,
            self._monotonic,
            self._thread_side._heartbeat_failures,
            certified=opened.certified,
            recovery_expected=opened.recovery_expected,
        )
        self._invalidate_cause = None
        cursor, event = opened.cursor, opened.first_event
        flusher = self._start_flusher(policy)
        # Without an age threshold flush_if_due() never writes: not asked per event.
        by_age = bool(self.spec.checkpoint.save_interval_seconds)
        beating = bool(heartbeat.interval)
        try:
            while not self._stop_requested:
                if event is None:
                    event = await cursor.try_next()
                if event is None:
                    if not cursor.alive:
                        raise ConnectionError("the change stream closed")
                    await policy.flush_if_due()
                    writes = heartbeat.writes
                    await adrive(heartbeat.on_idle(cursor.resume_token), self._perform)
                    self.heartbeats += heartbeat.writes - writes
                    await self._database_housekeeping()
                    if burst:
                        break
                    await asyncio.sleep(0)  # let the other streams of the loop run
                    continue
                self._check_lease()
                settled = await self._handle(event, source)
                if settled is None:
                    self._check_lease()
                    if self._stop_requested:
                        break  # unsettled: redelivered on the next start
                    raise ConnectionError("an event was left unsettled; resubscribing")
                if beating:  # the idle heartbeat's clock (nothing else reads it)
                    heartbeat.last_activity = self._monotonic()
                event = None
                if by_age:
                    await policy.flush_if_due()
        finally:
            if flusher is not None:
                flusher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await flusher
            await self._close(cursor)

    def _start_flusher(self, policy: Any) -> asyncio.Task[None] | None:
        """Flush an aged dirty anchor while a slow handler holds the stream's task."""
        interval = self.spec.checkpoint.save_interval_seconds
        if not interval or not isinstance(policy, AsyncAnchorPolicy):
            return None
        tick = min(float(interval), self.flush_tick_seconds)

        async def flush_loop() -> None:
            while True:
                await asyncio.sleep(tick)
                await policy.flush_if_due()

        return asyncio.ensure_future(flush_loop())

    async def _close(self, cursor: Any) -> None:
        if self.policy is not None:
            if self._lease_lost():
                self.policy.cancel()  # the fence would refuse it: the new leader owns it
            elif not await self.policy.flush():
                logger.warning(
                    "stream %r: the processed anchor could not be flushed", self.spec.name
                )
        try:
            await cursor.close()
        except Exception:
            logger.debug("stream %r: closing the cursor failed", self.spec.name, exc_info=True)

    # -- the resume cascade (the same decisions as StreamConsumer._open) ------------------

    async def _open(self, source: Any) -> Opened:
        """The resume cascade (``core.resume``), performed on the loop."""
        return await adrive(open_stream(self.spec), partial(self._perform, source=source))

    async def _perform(self, effect: effects.Effect, source: Any = None) -> Any:
        """Do what the core asks (see ``core.effects``), awaiting each call."""
        store, name = self.store, self.spec.name
        match effect:
            case effects.PollCursor(cursor):
                return await cursor.try_next()
            case effects.OpenCursor():
                return await source.open(**open_arguments(effect))
            case effects.FindCheckpoint():
                return await store.afind(name)
            case effects.SaveSeen(position, at):
                return await store.asave_seen(name, position, at, heartbeat_at=at)
            case effects.SaveHeartbeat(at):
                return await store.asave_heartbeat(name, at)
            case effects.ResetAfterHistoryLost(position, expected, at):
                return await store.areset_after_history_lost(name, position, expected, at)
            case effects.CloseCursor(cursor):
                return await cursor.close()
            case effects.InitialPosition():
                return await source.initial_position()
            case effects.OldestOplogTime():
                return await source.oldest_oplog_time()
            case effects.CopyCollection(saved, reason):
                # On a worker thread: the threaded consumer's copy, with the sync driver.
                self.state = StreamState.COPYING
                return await sync_to_async(self._copy, thread_sensitive=False)(saved, reason)
            case effects.DiscardUnusableConnections():
                return await self._discard_unusable_connections()
            case effects.TryOnce(handler, ctx, lifecycle):
                return await self._try_once(handler, ctx, lifecycle)
            case effects.CallErrorHandler(handler, error, ctx):
                return await self._call_error_handler(handler, error, ctx)
            case effects.Backoff(seconds):
                return await self._backoff(seconds)
            case effects.Settle(ctx, lifecycle):
                return await self._settle(ctx, lifecycle)
            case effects.ParkFailedEvent():
                return await self._dead_letter(effect)
            case effects.SaveDeadLetter(entry, policy):
                return await self.dlq_store.asave(entry, policy)
        raise TypeError(f"not an effect of the consumer core: {effect!r}")

    def _copy(self, saved: Checkpoint | None, reason: str) -> Mapping[str, Any]:
        try:
            copier = initial_sync.InitialSync(
                self._thread_side, self.copy_source_factory(self.spec)
            )
            return copier.run(saved, reason)
        finally:
            connections.close_all()  # this worker thread's own connections

    # -- one event -----------------------------------------------------------------------

    def _context(self, event: Mapping[str, Any], event_id: str | None = None) -> ChangeContext:
        return ChangeContext(
            event,
            stream_name=self.spec.name,
            save_now=self._save_now,
            send_to_dlq=self._send_to_dlq,
            event_id=event_id,
            asave_now=self._asave_now,
            asend_to_dlq=self._asend_to_dlq,
        )

    async def _handle(self, event: Mapping[str, Any], source: Any) -> bool | None:
        """Handle one event: True/False once settled, None when a stop left it unsettled."""
        operation = event.get("operationType", "")
        if operation == "invalidate":
            await self._invalidated(event, source)
        name = self.spec.name
        event_id = announce_received(name, event, operation)
        side = self._thread_side
        plan = side._plans.get(operation) or side._plan(operation)
        started = time.perf_counter()
        if plan.plain:
            # A document handler, no filter, no transaction: no context unless it fails.
            result = await self._plain_attempt(plan.handler, event, event_id)
        else:
            ctx = self._context(event, event_id)
            lifecycle = operation in LIFECYCLE_OPERATIONS
            if lifecycle:
                self._invalidate_cause = operation
            result = await self._attempt_loop(plan.handler, ctx, lifecycle)
        processed = metrics.listeners(metrics.event_processed, name)
        if processed:
            metrics.send_event_processed(name, processed, time.perf_counter() - started, result)
        if result is not None:
            self.events_handled += 1
            self._last_event_time = time.time()
        return result

    async def _plain_attempt(
        self, handler: Callable[..., Any], event: Mapping[str, Any], event_id: str | None
    ) -> bool | None:
        try:
            if self._awaitable(handler):
                await handler(event.get("fullDocument"))
            else:
                await sync_to_async(handler, thread_sensitive=True)(event.get("fullDocument"))
        except Exception as exc:
            ctx = self._context(event, event_id)
            return await self._attempt_loop(handler, ctx, False, failed=exc)
        assert isinstance(self.policy, AsyncAnchorPolicy)
        await self.policy.on_settled(event["_id"], _event_anchor_at(event))
        return True

    def _awaitable(self, function: Callable[..., Any]) -> bool:
        """Whether *function* is an ``async def`` (read once per function)."""
        known = self._async_functions.get(id(function))
        if known is None or known[0] is not function:
            known = self._async_functions[id(function)] = (function, is_async(function))
        return known[1]

    async def _call(self, function: Callable[..., Any], doc: Any, ctx: ChangeContext) -> Any:
        """``async def``: awaited here; sync: on the stream's thread (ORM-safe)."""
        if self._awaitable(function):
            shape = self._caller.shape(function)
            if shape == "doc":
                return await function(doc)
            if shape == "ctx":
                return await function(ctx)
            return await function(doc, ctx)
        return await sync_to_async(self._caller.call, thread_sensitive=True)(function, doc, ctx)

    async def _try_once(
        self, handler: Callable[..., Any] | None, ctx: ChangeContext, lifecycle: bool
    ) -> Exception | None:
        if self.spec.transactional and not lifecycle:
            # The handler and the anchor write in one transaction, on the stream's thread.
            return await sync_to_async(self._thread_side._try_once, thread_sensitive=True)(
                handler, ctx, lifecycle
            )
        if handler is None:
            await self._settle(ctx, lifecycle)  # no handler for this operation: settled
            return None
        if self.spec.filter is not None:
            try:
                accepted = await self._call(self.spec.filter, ctx.full_document, ctx)
            except Exception as exc:
                raise FilterError(f"stream {self.spec.name!r}: the filter raised {exc!r}") from exc
            if not accepted:
                await self._settle(ctx, lifecycle)
                return None
        try:
            await self._call(handler, ctx.full_document, ctx)
        except Exception as exc:
            return exc
        await self._settle(ctx, lifecycle)
        return None

    async def _settle(self, ctx: ChangeContext, lifecycle: bool) -> None:
        if lifecycle or ctx.saved_manually:
            return
        if self.spec.transactional:
            await sync_to_async(self._thread_side._settle, thread_sensitive=True)(ctx, lifecycle)
            return
        assert isinstance(self.policy, AsyncAnchorPolicy)
        await self.policy.on_settled(ctx.resume_token, _event_anchor_at(ctx.event))

    async def _attempt_loop(
        self,
        handler: Callable[..., Any] | None,
        ctx: ChangeContext,
        lifecycle: bool,
        *,
        failed: Exception | None = None,
    ) -> bool | None:
        """``core.events.attempt_loop``, performed on the loop."""
        decision = attempt_loop(self.spec, handler, ctx, lifecycle, self, failed=failed)
        return await adrive(decision, self._perform)

    async def _call_error_handler(self, handler: Any, error: Exception, ctx: ChangeContext) -> Any:
        if is_async(handler):
            return await handler(error, ctx)
        return await sync_to_async(handler, thread_sensitive=True)(error, ctx)

    async def _dead_letter(self, effect: effects.ParkFailedEvent) -> None:
        if self.spec.transactional:
            # The dead letter and the anchor in one transaction, as the threaded consumer.
            await sync_to_async(self._thread_side._dead_letter, thread_sensitive=True)(effect)
            return
        failures = self._thread_side._dlq_failures
        decision = dead_letter(
            self.spec, effect.error, effect.ctx, effect.lifecycle, self, failures
        )
        await adrive(decision, self._perform)

    # -- what a handler may do with its context ----------------------------------------

    def _refuse_on_loop(self, action: str) -> None:
        if _on_loop_thread():
            raise RuntimeError(
                f"stream {self.spec.name!r}: ctx.{action}() blocks; from an async def "
                f"handler use `await ctx.a{action}()`"
            )

    def _save_now(self, ctx: ChangeContext) -> bool:
        """``ctx.save_checkpoint_now()`` from a sync handler (on the stream's thread)."""
        self._refuse_on_loop("save_checkpoint_now")
        if self.spec.transactional:
            return self._thread_side._save_now(ctx)  # inside the attempt's transaction
        return async_to_sync(self._asave_now)(ctx)

    async def _asave_now(self, ctx: ChangeContext) -> bool:
        if self.spec.transactional:
            # Back to the stream's thread: the attempt's transaction is open there.
            return await sync_to_async(self._thread_side._save_now, thread_sensitive=True)(ctx)
        policy = self.policy
        if ctx.operation_type in LIFECYCLE_OPERATIONS or not isinstance(policy, AsyncAnchorPolicy):
            logger.warning(
                "stream %r: save_checkpoint_now() ignored for a %s event",
                self.spec.name,
                ctx.operation_type,
            )
            return False
        return await policy.save_now(ctx.resume_token, _event_anchor_at(ctx.event))

    def _send_to_dlq(self, ctx: ChangeContext, reason: str) -> None:
        """``ctx.send_to_dlq(reason)`` from a sync handler (on the stream's thread)."""
        self._refuse_on_loop("send_to_dlq")
        self._thread_side._send_to_dlq(ctx, reason)

    async def _asend_to_dlq(self, ctx: ChangeContext, reason: str) -> None:
        failures = self._thread_side._dlq_failures
        await adrive(park_on_request(self.spec, ctx, reason, self, failures), self._perform)

    # -- invalidation --------------------------------------------------------------------

    async def _invalidated(self, event: Mapping[str, Any], source: Any) -> None:
        cause = self._invalidate_cause or "drop"
        name = self.spec.name
        metrics.emit(metrics.stream_invalidated, name, cause=cause)
        if self.policy is not None:
            self.policy.cancel()  # no anchor write may land after the reset below
        self.policy = None
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
