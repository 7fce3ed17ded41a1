"""The asyncio driver of one stream's consumer: many streams share one event loop.

``AsyncStreamConsumer`` awaits what the consumer core (``streams.core``) decides, the
threaded :class:`~.threaded.StreamConsumer` calls it: the same spec and the same
decisions. It reads through an :class:`~.async_source.AsyncChangeSource`, writes
through the stores' ``a…`` methods and awaits ``async def`` handlers.

What runs on a thread, and why:

* sync handlers, filters and ``on_error`` handlers run through
  ``sync_to_async(thread_sensitive=True)`` inside the stream's own
  ``ThreadSensitiveContext``: each stream that has sync code gets one thread (and
  one database connection) of its own, as a Django request does;
* a transactional stream's attempt (the handler, then the anchor write, in one
  ``transaction.atomic``) runs on that thread: a Django transaction belongs to a
  thread. An ``async def`` handler still runs on the loop;
* an initial sync copies with the sync driver on a worker thread, through the same
  code as the threaded consumer (:mod:`..initial_sync`): a bounded phase.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

from asgiref.sync import SyncToAsync, ThreadSensitiveContext, async_to_sync, sync_to_async
from django.db import close_old_connections, connections

from ...common import tracing
from ...common.connections import discard_unusable_connections
from ...common.tracing import event_attributes
from .. import initial_sync, metrics
from ..checkpoint import Checkpoint, CheckpointStore
from ..context import ChangeContext
from ..core import effects
from ..core.anchors import event_anchor_at, refuses_manual_save
from ..core.driving import adrive
from ..core.effects import poll_cursor
from ..core.events import FilterError, attempt_loop, dead_letter, park_on_request
from ..core.generation import consume
from ..core.heartbeat import Heartbeat
from ..core.lifecycle import StreamState, failing, supervise
from ..core.resume import open_arguments, open_stream
from ..dispatch import AsyncHandlerCaller, is_async
from ..dlq import DlqStore
from ..locks import LeaseLostError
from ..source import ChangeSource
from ..spec import LIFECYCLE_OPERATIONS, StreamSpec
from .async_parallel import AsyncWindow, AsyncWindowedAnchors, current_entry, reader_inline
from .buffered import buffered_poll
from .parallel import HandOff, WindowedAnchors
from .policy import (
    AsyncAnchorPolicy,
    PolicyOnStreamThread,
    ProcessedAnchorPolicy,
    TransactionalAnchors,
)
from .settled_marks import MarkedAnchorPolicy, SettledMarks, anchor_policy_class
from .threaded import StreamConsumer

logger = logging.getLogger("flowwarden_django.streams")


def _on_loop_thread() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _made_a_thread(context: ThreadSensitiveContext) -> bool:
    """Whether sync code ran in *context* (on a thread asgiref made for it); True when
    this asgiref does not say."""
    made = getattr(SyncToAsync, "context_to_thread_executor", None)
    return True if made is None else context in made


def _shared(name: str) -> property:
    """An attribute kept by the consumer's thread side (``StreamConsumer``), so the copy
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

    events_handled = _shared("events_handled")
    documents_copied = _shared("documents_copied")
    errors = _shared("errors")
    retries = _shared("retries")
    dead_lettered = _shared("dead_lettered")
    restarts = _shared("restarts")
    state = _shared("state")
    last_error = _shared("last_error")
    started_at = _shared("started_at")
    restarting_since = _shared("restarting_since")
    restart_error = _shared("restart_error")
    restart_cause = _shared("restart_cause")
    last_event_stamp = _shared("last_event_stamp")
    last_event_at = _shared("last_event_at")
    dlq_store = _shared("dlq_store")

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
            from ..async_source import async_pymongo_source

            source_factory = async_pymongo_source
        if copy_source_factory is None:
            from ..clients import pymongo_source

            copy_source_factory = pymongo_source
        #: The thread side: a StreamConsumer of the same stream that runs what must
        #: run on a thread (transactional attempts, the copy, sync ctx actions) and
        #: keeps the counters. It never opens a change stream.
        self._thread_side = StreamConsumer(
            spec,
            store,
            copy_source_factory,
            monotonic=monotonic,
            dlq_store=dlq_store,
            lease_valid=lease_valid,
        )
        self.spec = spec
        self.store = self._thread_side.store  # observed (metrics of each write)
        self.source_factory = source_factory
        self.copy_source_factory = copy_source_factory
        self.lease_valid = lease_valid
        self._monotonic = monotonic
        # Retry backoff waits here (a test's clock); True when a stop interrupts it.
        self._backoff_sleep = sleep
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stop_requested = False
        self._caller = AsyncHandlerCaller()
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
        #: What a handler's context may ask of this consumer, from a thread or the loop.
        self.actions = {"save_now": self._save_now, "send_to_dlq": self._send_to_dlq}
        self.actions.update(asave_now=self._asave_now, asend_to_dlq=self._asend_to_dlq)
        #: Set after each dead-letter write; whoever reports the backlog clears it.
        self.dlq_dirty = self._thread_side.dlq_dirty
        self.heartbeats = 0
        self.policy: AsyncAnchorPolicy | TransactionalAnchors | AsyncWindowedAnchors | None = None
        #: A parallel stream's window (``parallelism`` > 1), while a generation runs.
        self.window: AsyncWindow | None = None

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

    @property
    def counts(self) -> StreamConsumer:
        """Where the counters are kept (the thread side), to add to them directly."""
        return self._thread_side

    def _lease_lost(self) -> bool:
        return self.lease_valid is not None and not self.lease_valid()

    def check_lease(self) -> None:
        """Raise ``LeaseLostError`` when this process no longer leads the stream."""
        if self.lease_valid is not None and not self.lease_valid():  # _lease_lost(), inlined
            raise LeaseLostError(f"stream {self.spec.name!r}: the lease was lost")

    async def _sleep(self, seconds: float) -> bool:
        """Sleep; True if a stop (or a lost lease) cut it short."""
        assert self._stop is not None
        deadline = time.monotonic() + max(0.0, seconds)
        while not (self._stop_requested or self._lease_lost() or self._window_closing()):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            watching = self.lease_valid is not None or self.window is not None
            step = min(left, self.lease_check_seconds) if watching else left
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=step)
        return True

    def _window_closing(self) -> bool:
        """A parallel stream's window is closing: another event failed for good."""
        return self.window is not None and self.window.closing

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
        async with ThreadSensitiveContext() as context:
            try:
                await adrive(supervise(self, burst=burst), self._perform)
            finally:
                await metrics.drain()  # signals for async receivers, sent as tasks
                # The thread goes with the context: close its database connections
                # (making it only to close nothing would cost two thread starts).
                if self.uses_thread or _made_a_thread(context):
                    await sync_to_async(connections.close_all, thread_sensitive=True)()

    async def _on_stream_thread(self, function: Callable[[], Any]) -> None:
        """Run *function* on the stream's thread, when it has one."""
        if self.uses_thread:
            await sync_to_async(function, thread_sensitive=True)()

    async def _database_housekeeping(self) -> None:
        """Drop broken or expired connections of the stream's thread now and then while
        it idles, as each request does in a web process (see ``StreamConsumer``)."""
        now = self._monotonic()
        if now - self._last_housekeeping >= self._thread_side.housekeeping_interval_seconds:
            self._last_housekeeping = now
            await self._on_stream_thread(close_old_connections)
        await asyncio.sleep(0)  # let the other streams of the loop run

    # -- one generation ----------------------------------------------------------------

    async def _run_generation(self, *, burst: bool) -> None:
        source = self.source_factory(self.spec)
        perform = partial(self._perform, source=source)
        opened = await adrive(open_stream(self.spec), perform)
        side = self._thread_side
        side._plans = {}
        policy = self.policy = self._new_policy(opened.confirmed_processed)
        heartbeat = Heartbeat.of_generation(
            self.spec, opened, self._monotonic, side._heartbeat_failures
        )
        flusher = self._start_flusher(policy)
        window = await self._open_window(policy)
        try:
            fast = self._fast_paths(opened.cursor)
            await adrive(consume(self, opened, heartbeat, burst=burst), perform, fast=fast)
        except Exception as exc:
            failing(self, exc)
            raise
        finally:
            if window is not None:
                await window.close()  # the running events finish first: their anchors count
                self._caller.executor = None
            if flusher is not None:
                flusher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await flusher
            await self._close(opened.cursor)
            self.window = None

    async def _open_window(self, policy: Any) -> AsyncWindow | None:
        """A parallel stream's window; the event path's anchor calls then go through it
        and its sync handlers run on the window's threads."""
        if not self.spec.windowed:
            return None
        marks = None
        if isinstance(policy, PolicyOnStreamThread):
            side, store = self._thread_side, self.store.inner
            found = await sync_to_async(store.settled_marks, thread_sensitive=True)(self.spec.name)
            marks = SettledMarks(store, self.spec.name, found)
            side.policy = WindowedAnchors(side.policy, marks)
        window = self.window = AsyncWindow(self, policy, marks)
        self.policy = AsyncWindowedAnchors(policy)
        self._caller.executor = window.executor
        return window

    def _new_policy(self, confirmed: Mapping[str, Any] | None) -> Any:
        checkpoint = self.spec.checkpoint
        transactional = self.spec.transactional
        kind = anchor_policy_class(self.spec) if transactional else AsyncAnchorPolicy
        policy = kind(
            self.store,
            self.spec.name,
            save_every_n=checkpoint.save_every_n,
            save_interval_seconds=checkpoint.save_interval_seconds,
            confirmed_token=confirmed,
            monotonic=self._monotonic,
            failure_log=self._thread_side._anchor_failures,
        )
        if isinstance(policy, MarkedAnchorPolicy):
            # Transactional, in parallel: each event's transaction (on a window
            # thread) writes its settled mark; the window moves the anchor.
            self._thread_side.policy = policy
            return PolicyOnStreamThread(policy)
        if isinstance(policy, ProcessedAnchorPolicy):
            # Transactional: the thread side writes each anchor inside its transaction.
            self._thread_side.policy = policy
            return TransactionalAnchors(policy)
        return policy

    def _start_flusher(self, policy: Any) -> asyncio.Task[None] | None:
        """Flush an aged dirty anchor while a slow handler holds the stream's task."""
        interval = self.spec.checkpoint.save_interval_seconds
        if not interval or not isinstance(policy, AsyncAnchorPolicy | PolicyOnStreamThread):
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

    async def _perform(self, effect: effects.Effect, source: Any = None) -> Any:
        """Do what the core asks (see ``core.effects``), awaiting each call."""
        store, name = self.store, self.spec.name
        match effect:
            case effects.PollCursor():
                return await poll_cursor(effect)
            case effects.HandleEvent():
                return await self._handle_effect(effect)
            case effects.Submit(event, operation, event_id):
                return await self.window.submit(event, operation, event_id)  # type: ignore[union-attr]
            case effects.WindowBusy():
                return await self.window.busy()  # type: ignore[union-attr]
            case effects.AwaitWindow(seconds):
                return await self.window.wait(seconds)  # type: ignore[union-attr]
            case effects.DrainWindow():
                return await self.window.drain()  # type: ignore[union-attr]
            case effects.FlushAnchorIfDue():
                return await self.policy.flush_if_due()  # type: ignore[union-attr]
            case effects.Idle():
                return await self._database_housekeeping()
            case effects.RunGeneration(burst):
                return await self._run_generation(burst=burst)
            case effects.PauseBeforeRestart(seconds):
                return await self._sleep(seconds)
            case effects.CancelAnchors():
                self.policy, policy = None, self.policy
                return policy.cancel() if policy is not None else None
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
                return await self._on_stream_thread(discard_unusable_connections)
            case effects.TryOnce(handler, ctx, lifecycle):
                return await self._try_once(handler, ctx, lifecycle)
            case effects.CallErrorHandler(handler, error, ctx):
                return await self._caller.acall_with(handler, error, ctx)
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
        return ChangeContext(event, stream_name=self.spec.name, event_id=event_id, **self.actions)

    def _fast_paths(self, cursor: Any) -> dict[type, Callable[[Any], Any]]:
        """The consuming loop's per-event effects on *cursor*, performed without
        ``_perform``: an event pymongo already holds is taken without a coroutine.
        Whether its events are traced is asked once, as the generation starts (a
        tracer provider is set once per process, at startup)."""
        handle = self._handle_effect if tracing.recording() else self._handle_untraced
        fast = {effects.PollCursor: buffered_poll(cursor), effects.HandleEvent: handle}
        policy = self.policy
        if type(policy) is AsyncAnchorPolicy:
            # After each event of a stream with an age threshold (the default): a
            # coroutine only when a write may be due.
            def flush_if_due(effect: effects.FlushAnchorIfDue) -> Any:
                return False if policy.age_flush_ruled_out() else policy.flush_if_due()

            fast[effects.FlushAnchorIfDue] = flush_if_due
        return fast

    # No eager start of an async def handler in these two (coro.send(None) and its
    # StopIteration cost more than the coroutine that awaits it: issue 52's profile).

    def _handle_effect(self, effect: effects.HandleEvent) -> Awaitable[Any]:
        if tracing.recording():
            return self._handle_traced(effect.event, effect.operation, effect.event_id)
        return self._handle_event(effect.event, effect.operation, effect.event_id)

    def _handle_untraced(self, effect: effects.HandleEvent) -> Awaitable[Any]:
        return self._handle_event(effect.event, effect.operation, effect.event_id)

    async def _handle(self, event: Mapping[str, Any], operation: str, event_id: str | None) -> Any:
        """Handle one event, in a ``flowwarden.stream.event`` span when OpenTelemetry
        records (the windows' way in; ``_perform`` makes the same choice inline)."""
        if tracing.recording():
            return await self._handle_traced(event, operation, event_id)
        return await self._handle_event(event, operation, event_id)

    async def _handle_traced(
        self, event: Mapping[str, Any], operation: str, event_id: str | None
    ) -> Any:
        """Handle one event (``effects.HandleEvent``) in a ``flowwarden.stream.event``
        span (OpenTelemetry records)."""
        with tracing.span("flowwarden.stream.event", event_attributes(self.spec, operation)):
            return await self._handle_event(event, operation, event_id)

    async def _handle_event(
        self, event: Mapping[str, Any], operation: str, event_id: str | None
    ) -> Any:
        side = self._thread_side
        plan = side._plans.get(operation) or side._plan(operation)
        if not plan.plain:
            ctx = self._context(event, event_id)
            return await self._attempt_loop(plan.handler, ctx, operation in LIFECYCLE_OPERATIONS)
        # A document handler, no filter, no transaction: no context unless it fails.
        handler = plan.handler
        try:
            if plan.awaitable:
                await handler(event.get("fullDocument"))  # type: ignore[misc]
            else:
                await self._caller.acall_with(handler, event.get("fullDocument"))  # type: ignore[arg-type]
        except Exception as exc:
            ctx = self._context(event, event_id)
            return await self._attempt_loop(handler, ctx, False, failed=exc)
        if self.window is None:  # else the window records it
            policy = self.policy
            if type(policy) is AsyncAnchorPolicy:
                # Recorded on the loop; awaited only when a write is due.
                if policy.record(event["_id"], event_anchor_at(event)):
                    await policy.write_recorded()
            else:
                await policy.on_settled(event["_id"], event_anchor_at(event))  # type: ignore[union-attr]
        return True

    async def _try_once(
        self, handler: Callable[..., Any] | None, ctx: ChangeContext, lifecycle: bool
    ) -> Exception | None:
        if self.spec.transactional and not lifecycle:
            # The handler and the anchor write in one transaction, on the stream's thread.
            return await self._caller._to_async(self._thread_side._try_once)(
                handler, ctx, lifecycle
            )
        if handler is None:
            await self._settle(ctx, lifecycle)  # no handler for this operation: settled
            return None
        if self.spec.filter is not None:
            try:
                accepted = await self._caller.acall(self.spec.filter, ctx.full_document, ctx)
            except Exception as exc:
                raise FilterError(f"stream {self.spec.name!r}: the filter raised {exc!r}") from exc
            if not accepted:
                await self._settle(ctx, lifecycle)
                return None
        try:
            await self._caller.acall(handler, ctx.full_document, ctx)
        except Exception as exc:
            return exc
        await self._settle(ctx, lifecycle)
        return None

    async def _settle(self, ctx: ChangeContext, lifecycle: bool) -> None:
        if lifecycle or ctx.saved_manually:
            return
        if self.spec.transactional:
            await self._caller._to_async(self._thread_side._settle)(ctx, lifecycle)
            return
        await self.policy.on_settled(ctx.resume_token, event_anchor_at(ctx.event))  # type: ignore[union-attr]

    async def _attempt_loop(
        self, handler: Any, ctx: ChangeContext, lifecycle: bool, failed: Any = None
    ) -> Any:
        """``core.events.attempt_loop``, performed on the loop (the reader of a
        parallel stream that awaits quick events itself hands it to a task)."""
        if self.window is not None and reader_inline.get():
            raise HandOff(handler, ctx, lifecycle, failed)
        return await adrive(
            attempt_loop(self.spec, handler, ctx, lifecycle, self, failed=failed), self._perform
        )

    def attempt_failed(self) -> None:
        """An attempt at the event in hand failed (``core.events``): in a parallel
        stream its key is parked behind it while it retries."""
        entry = current_entry.get()
        if entry is not None:
            entry.failing = True

    async def _dead_letter(self, effect: effects.ParkFailedEvent) -> None:
        if self.spec.transactional:
            # The dead letter and the anchor in one transaction, as the threaded consumer.
            await self._caller._to_async(self._thread_side._dead_letter)(effect)
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
        if self.window is not None:  # the window's watermark, in its own write
            if refuses_manual_save(self.spec.name, ctx, self.policy):
                return False
            return await self.policy.save_now(ctx.resume_token, event_anchor_at(ctx.event))  # type: ignore[union-attr]
        if self.spec.transactional:
            # Back to the stream's thread: the attempt's transaction is open there.
            return await sync_to_async(self._thread_side._save_now, thread_sensitive=True)(ctx)
        policy = (
            self.policy
            if isinstance(self.policy, AsyncAnchorPolicy | AsyncWindowedAnchors)
            else None
        )
        if refuses_manual_save(self.spec.name, ctx, policy):
            return False
        return await policy.save_now(ctx.resume_token, event_anchor_at(ctx.event))  # type: ignore[union-attr]

    def _send_to_dlq(self, ctx: ChangeContext, reason: str) -> None:
        """``ctx.send_to_dlq(reason)`` from a sync handler (on the stream's thread)."""
        self._refuse_on_loop("send_to_dlq")
        self._thread_side._send_to_dlq(ctx, reason)

    async def _asend_to_dlq(self, ctx: ChangeContext, reason: str) -> None:
        failures = self._thread_side._dlq_failures
        await adrive(park_on_request(self.spec, ctx, reason, self, failures), self._perform)


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
