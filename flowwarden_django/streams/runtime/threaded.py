"""The threaded driver of one stream's consumer: it performs, with plain calls on one
thread, what the consumer core (``streams.core``) decides.

The core holds the decisions (the restart loop, the resume cascade, the generation's
poll-handle-idle loop, the heartbeat, retries and the dead-letter queue, the
anchors' bookkeeping). What stays here is what a thread does: the handler calls and
their fast path, the transaction of a transactional stream's attempt, the flusher
thread and the database connections' housekeeping.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connections, transaction

from ...common import tracing
from ...common.connections import closed_when_lost, discard_unusable_connections
from ...common.failure_log import FailureLog
from ...common.stream_attempts import in_transactional_attempt
from ...common.tracing import event_attributes
from .. import initial_sync
from ..checkpoint import CheckpointStore
from ..context import ChangeContext
from ..core import effects
from ..core.anchors import event_anchor_at, refuses_manual_save
from ..core.driving import drive
from ..core.effects import poll_cursor
from ..core.events import FilterError, attempt_loop, dead_letter, park_on_request
from ..core.generation import consume
from ..core.heartbeat import Heartbeat
from ..core.lifecycle import StreamInvalidatedError, StreamState, failing, supervise
from ..core.resume import HistoryLostError, open_arguments, open_stream
from ..dispatch import HandlerCaller, is_async
from ..dlq import DlqStore
from ..locks import LeaseLostError
from ..source import ChangeCursor, ChangeSource
from ..spec import LIFECYCLE_OPERATIONS, SNAPSHOT_OPERATION, StreamSpec
from .buffered import buffered_poll
from .observed_store import ObservedCheckpointStore
from .parallel import ThreadedWindow, WindowedAnchors
from .policy import ProcessedAnchorPolicy, anchor_failure_log
from .settled_marks import SettledMarks, anchor_policy_class

__all__ = ["HistoryLostError", "StreamConsumer", "StreamInvalidatedError", "StreamState"]

logger = logging.getLogger("flowwarden_django.streams")


class StreamConsumer:
    """Consumes one declared stream until stopped, on the calling thread.

    ``run()`` blocks. ``burst=True`` returns once the stream has caught up. A
    cursor that dies is reopened through the full resume cascade with the
    stream's restart backoff; lost history under ``FAIL``, a rename, or running
    out of restart attempts stops it for good (``state`` is then ``CRASHED``).
    """

    #: How often the flusher thread looks for a dirty anchor past its age threshold.
    flush_tick_seconds = 1.0
    #: Seconds between two ``close_old_connections()`` calls while the stream idles.
    housekeeping_interval_seconds = 60.0

    def __init__(
        self,
        spec: StreamSpec,
        store: CheckpointStore,
        source_factory: Callable[[StreamSpec], ChangeSource],
        *,
        monotonic: Callable[[], float] = time.monotonic,
        dlq_store: DlqStore | None = None,
        sleep: Callable[[float], bool] | None = None,
        lease_valid: Callable[[], bool] | None = None,
    ) -> None:
        self.spec = spec
        self.store = (
            store
            if isinstance(store, ObservedCheckpointStore)
            else ObservedCheckpointStore(store, spec.name)
        )
        #: SINGLE_LEADER: asked before every event; False stops the consumer at once.
        self.lease_valid = lease_valid
        self.source_factory = source_factory
        self._monotonic = monotonic
        self._dlq_store = dlq_store
        # Retry backoff waits here; it returns True when a stop interrupts the wait.
        self._sleep = sleep
        self._stop = threading.Event()
        self._caller = HandlerCaller()
        #: Per operation type, how this generation handles its events (``_plan``).
        self._plans: dict[str, _Plan] = {}
        self.state = StreamState.STOPPED
        self.last_error: BaseException | None = None
        #: ``time.time()`` of the last handled event (``last_event_at`` converts it).
        self.last_event_stamp: float | None = None
        self.events_handled = 0
        self.heartbeats = 0
        #: Documents an initial sync handed to the stream (settled), in this process.
        self.documents_copied = 0
        self.restarts = 0
        self.errors = 0
        self.retries = 0
        self.dead_lettered = 0
        self.started_at: datetime | None = None
        #: Set after each dead-letter write; whoever reports the backlog clears it.
        self.dlq_dirty = threading.Event()
        self.policy: ProcessedAnchorPolicy | WindowedAnchors | None = None
        #: A parallel stream's window (``parallelism`` > 1), while a generation runs.
        self.window: ThreadedWindow | None = None
        #: On each handler thread of the window, the event it handles (``entry``).
        self.window_entries = threading.local()
        #: When the stream started restarting (``None`` while it runs), the type of
        #: the error it restarts after and (attempt, error) for ``stream_restarted``.
        self.restarting_since: datetime | None = None
        self.restart_error: type[BaseException] | None = None
        self.restart_cause: tuple[int, BaseException] | None = None
        self._last_housekeeping = float("-inf")
        #: What a handler's context may ask of this consumer.
        self.actions = {"save_now": self._save_now, "send_to_dlq": self._send_to_dlq}
        self._dlq_failures = FailureLog(logger, f"stream {spec.name!r}: writing a dead letter")
        # These outlive a generation's policy and heartbeat: a failure that ends a
        # generation (an outage) is logged once, and its recovery in the next one.
        self._anchor_failures = anchor_failure_log(spec.name)
        self._heartbeat_failures = FailureLog(logger, f"stream {spec.name!r}: the heartbeat write")

    @property
    def last_event_at(self) -> datetime | None:
        """When the last event was handled (``timezone.now()`` of that moment)."""
        stamp = getattr(self, "last_event_stamp", None)  # None also before __init__ ran
        if stamp is None:
            return None
        return datetime.fromtimestamp(stamp, UTC if settings.USE_TZ else None)

    @last_event_at.setter
    def last_event_at(self, value: datetime | None) -> None:
        self.last_event_stamp = None if value is None else value.timestamp()

    # -- control ---------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the consumer to stop after the event in hand (it flushes its anchor)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def counts(self) -> StreamConsumer:
        """Where the counters are kept: this consumer (the core adds to them)."""
        return self

    def check_lease(self) -> None:
        """Raise ``LeaseLostError`` when this process no longer leads the stream."""
        if self.lease_valid is not None and not self.lease_valid():
            raise LeaseLostError(f"stream {self.spec.name!r}: the lease was lost")

    def run(self, *, burst: bool = False) -> None:
        """Consume until stopped (or caught up, with *burst*); raise when terminal."""
        # No _stop.clear(): a stop() that arrives before this thread runs must hold.
        try:
            drive(supervise(self, burst=burst), self._perform)
        finally:
            self._caller.close()
            close_old_connections()

    # -- one generation: open, consume, close ----------------------------------------

    def _run_generation(self, *, burst: bool) -> None:
        source = self.source_factory(self.spec)
        perform = partial(self._perform, source=source)
        opened = drive(open_stream(self.spec), perform)
        checkpoint = self.spec.checkpoint
        self._plans = {}
        self.policy = anchor_policy_class(self.spec)(
            self.store,
            self.spec.name,
            save_every_n=checkpoint.save_every_n,
            save_interval_seconds=checkpoint.save_interval_seconds,
            confirmed_token=opened.confirmed_processed,
            monotonic=self._monotonic,
            failure_log=self._anchor_failures,
        )
        heartbeat = Heartbeat.of_generation(
            self.spec, opened, self._monotonic, self._heartbeat_failures
        )
        flusher = self._start_flusher()
        window = self._open_window()
        try:
            drive(
                consume(self, opened, heartbeat, burst=burst),
                perform,
                fast=self._fast_paths(opened.cursor),
            )
        except Exception as exc:
            failing(self, exc)
            raise
        finally:
            if window is not None:
                window.close()  # the running events finish first: their anchors count
            if flusher is not None:
                flusher.set()
            self._close(opened.cursor)
            self.window = None

    def _open_window(self) -> ThreadedWindow | None:
        """A parallel stream's window on its handler threads; the event path's anchor
        calls then go through it (``WindowedAnchors``)."""
        if not self.spec.windowed or self.policy is None:
            return None
        marks = SettledMarks(self.store.inner, self.spec.name) if self.spec.transactional else None
        window = self.window = ThreadedWindow(self, self.policy, marks)
        self.policy = WindowedAnchors(self.policy, marks)
        window.start()
        return window

    def _start_flusher(self) -> threading.Event | None:
        """Flush an aged dirty anchor even while a slow handler holds the stream's thread.

        Transactional streams handled one event at a time write every anchor inside
        the handler's transaction, so they need none.
        """
        interval = self.spec.checkpoint.save_interval_seconds
        serial_transactions = self.spec.transactional and not self.spec.windowed
        if not interval or serial_transactions or self.policy is None:
            return None
        done, policy = threading.Event(), self.policy
        tick = min(float(interval), self.flush_tick_seconds)

        def flush_loop() -> None:
            try:
                while not done.wait(tick):
                    policy.flush_if_due()
            finally:
                connections.close_all()

        threading.Thread(target=flush_loop, name=f"fw-flush-{self.spec.name}", daemon=True).start()
        return done

    def _database_housekeeping(self) -> None:
        """Drop broken or expired database connections now and then, as each request
        does in a web process; not after every poll, which would reconnect for every
        anchor write under ``CONN_MAX_AGE=0``."""
        now = self._monotonic()
        if now - self._last_housekeeping >= self.housekeeping_interval_seconds:
            self._last_housekeeping = now
            close_old_connections()

    def _close(self, cursor: ChangeCursor) -> None:
        lost = self.lease_valid is not None and not self.lease_valid()
        if lost and self.policy is not None:
            self.policy.cancel()  # the fence would refuse it: the new leader owns the anchors
        elif self.policy is not None and not self.policy.flush():
            logger.warning("stream %r: the processed anchor could not be flushed", self.spec.name)
        try:
            cursor.close()
        except Exception:  # closing a dead cursor must not hide why it died
            logger.debug("stream %r: closing the cursor failed", self.spec.name, exc_info=True)

    # -- the core's effects -----------------------------------------------------------

    def _perform(self, effect: effects.Effect, source: ChangeSource | None = None) -> Any:
        """Do what the core asks (see ``core.effects``), with plain calls."""
        store, name = self.store, self.spec.name
        match effect:
            case effects.PollCursor():
                return poll_cursor(effect)
            case effects.HandleEvent():
                return self._handle_effect(effect)
            case effects.Submit(event, operation, event_id):
                return self.window.submit(event, operation, event_id)  # type: ignore[union-attr]
            case effects.WindowBusy():
                return self.window.busy()  # type: ignore[union-attr]
            case effects.AwaitWindow(seconds):
                return self.window.wait(seconds)  # type: ignore[union-attr]
            case effects.DrainWindow():
                return self.window.drain()  # type: ignore[union-attr]
            case effects.FlushAnchorIfDue():
                return self.policy.flush_if_due()  # type: ignore[union-attr]
            case effects.Idle():
                return self._database_housekeeping()
            case effects.RunGeneration(burst):
                return self._run_generation(burst=burst)
            case effects.PauseBeforeRestart(seconds):
                return self._stop.wait(seconds)
            case effects.CancelAnchors():
                # The flusher holds the policy too: cancelled, it writes nothing more.
                self.policy, policy = None, self.policy
                return policy.cancel() if policy is not None else None
            case effects.OpenCursor():
                return source.open(**open_arguments(effect))  # type: ignore[union-attr]
            case effects.FindCheckpoint():
                return store.find(name)
            case effects.SaveSeen(position, at):
                return store.save_seen(name, position, at, heartbeat_at=at)
            case effects.SaveHeartbeat(at):
                return store.save_heartbeat(name, at)
            case effects.ResetAfterHistoryLost(position, expected, at):
                return store.reset_after_history_lost(name, position, expected, at)
            case effects.CloseCursor(cursor):
                return cursor.close()
            case effects.InitialPosition():
                return source.initial_position()  # type: ignore[union-attr]
            case effects.OldestOplogTime():
                return source.oldest_oplog_time()  # type: ignore[union-attr]
            case effects.CopyCollection(saved, reason):
                self.state = StreamState.COPYING
                return initial_sync.InitialSync(self, source).run(saved, reason)  # type: ignore[arg-type]
            case effects.DiscardUnusableConnections():
                return discard_unusable_connections()
            case effects.TryOnce(handler, ctx, lifecycle):
                return self._try_once(handler, ctx, lifecycle)
            case effects.CallErrorHandler(handler, error, ctx):
                return handler(error, ctx)
            case effects.Backoff(seconds):
                return self._wait(seconds)
            case effects.Settle(ctx, lifecycle):
                return self._settle(ctx, lifecycle)
            case effects.ParkFailedEvent():
                return self._dead_letter(effect)
            case effects.SaveDeadLetter(entry, policy):
                return self.dlq_store.save(entry, policy)
        raise TypeError(f"not an effect of the consumer core: {effect!r}")

    # -- one event --------------------------------------------------------------------

    def _fast_paths(self, cursor: Any) -> dict[type, Callable[[Any], Any]]:
        """The consuming loop's per-event effects, performed without ``_perform``
        (``FlushAnchorIfDue`` too: it follows each event of a stream with an age
        threshold, the default).

        Whether its events are traced is asked once, as the generation starts (a
        tracer provider is set once per process, at startup).
        """
        handle = self._handle_effect if tracing.recording() else self._handle_untraced
        policy = self.policy  # this generation's (replaced only by CancelAnchors' None)

        def flush_if_due(effect: effects.FlushAnchorIfDue) -> bool:
            return policy.flush_if_due()  # type: ignore[union-attr]

        return {
            effects.PollCursor: buffered_poll(cursor),
            effects.HandleEvent: handle,
            effects.FlushAnchorIfDue: flush_if_due,
        }

    def _handle_effect(self, effect: effects.HandleEvent) -> Any:
        return self._handle(effect.event, effect.operation, effect.event_id)

    def _handle_untraced(self, effect: effects.HandleEvent) -> Any:
        return self._handle_event(effect.event, effect.operation, effect.event_id)

    def _handle(self, event: Mapping[str, Any], operation: str, event_id: str | None) -> Any:
        """Handle one event (``effects.HandleEvent``), in a ``flowwarden.stream.event``
        span when OpenTelemetry records."""
        if not tracing.recording():
            return self._handle_event(event, operation, event_id)
        with tracing.span("flowwarden.stream.event", event_attributes(self.spec, operation)):
            return self._handle_event(event, operation, event_id)

    def _handle_event(self, event: Mapping[str, Any], operation: str, event_id: str | None) -> Any:
        plan = self._plans.get(operation) or self._plan(operation)
        handler = plan.handler
        if plan.plain:
            # The common case, inlined: a document handler, no filter, no transaction.
            try:
                result = handler(event.get("fullDocument"))  # type: ignore[misc]
                if result is not None and inspect.isawaitable(result):  # async def
                    self._caller.run(result)
            except Exception as exc:
                ctx = self._context(event, event_id)
                return self._attempt_loop(handler, ctx, False, failed=exc)
            if self.window is None:  # else the window records it
                self.policy.on_settled(event["_id"], event_anchor_at(event))  # type: ignore[union-attr]
            return True
        if plan.direct:
            return self._first_attempt(handler, event, event_id)
        ctx = self._context(event, event_id)
        return self._attempt_loop(handler, ctx, operation in LIFECYCLE_OPERATIONS)

    def _plan(self, operation: str) -> _Plan:
        """How this generation handles events of *operation* (made on its first event)."""
        spec = self.spec
        handler = spec.handler_for(operation)
        # A change event of a stream without a filter or a transaction: no context unless
        # the handler takes one (or its first attempt fails).
        direct = (
            operation not in LIFECYCLE_OPERATIONS
            and operation != SNAPSHOT_OPERATION
            and not spec.transactional
            and spec.filter is None
        )
        plain = False
        # An unreadable signature: not plain; each attempt fails with it (_first_attempt).
        if direct and handler is not None:
            with contextlib.suppress(TypeError):
                plain = self._caller.shape(handler) == "doc"
        plan = self._plans[operation] = _Plan(handler, direct, plain)
        return plan

    def _context(self, event: Mapping[str, Any], event_id: str | None) -> ChangeContext:
        # The actions get the context as an argument: a closure over ctx would make a
        # reference cycle per event for the garbage collector to find.
        return ChangeContext(event, stream_name=self.spec.name, event_id=event_id, **self.actions)

    def _first_attempt(
        self, handler: Callable[..., Any] | None, event: Mapping[str, Any], event_id: str | None
    ) -> bool | None:
        """``_attempt_loop`` for a change event of a stream without a filter or a
        transaction (the common case): the context is made only when the handler takes
        one, or when this first attempt fails and the error policy takes over."""
        ctx: ChangeContext | None = None
        if handler is not None:
            caller = self._caller
            try:
                # (An unreadable signature fails the attempt, as in _dispatch.)
                if caller.shape(handler) == "doc":
                    result = handler(event.get("fullDocument"))
                    if result is not None and inspect.isawaitable(result):  # async def
                        caller.run(result)
                else:
                    ctx = self._context(event, event_id)
                    caller.call(handler, event.get("fullDocument"), ctx)
            except Exception as exc:
                if ctx is None:
                    ctx = self._context(event, event_id)
                return self._attempt_loop(handler, ctx, False, failed=exc)
        if ctx is None or not ctx.saved_manually:
            self.policy.on_settled(event["_id"], event_anchor_at(event))  # type: ignore[union-attr]
        return True

    def _attempt_loop(
        self, handler: Any, ctx: ChangeContext, lifecycle: bool, failed: Any = None
    ) -> Any:
        """``core.events.attempt_loop``, performed on this thread (the reader of a
        parallel stream that runs quick events itself hands it to a handler thread:
        retries must not hold the reader)."""
        if self.window is not None:
            self.window.hand_off_from_reader(handler, ctx, lifecycle, failed)
        return drive(
            attempt_loop(self.spec, handler, ctx, lifecycle, self, failed=failed), self._perform
        )

    def attempt_failed(self) -> None:
        """An attempt at the event in hand failed (``core.events``): in a parallel
        stream its key is parked behind it while it retries."""
        entry = getattr(self.window_entries, "entry", None)
        if entry is not None:
            entry.failing = True

    def _interrupted(self) -> bool:
        """A stop was asked for, this process no longer holds the stream's lease, or the
        window of a parallel stream is closing (another event failed for good)."""
        return (
            self._stop.is_set()
            or (self.lease_valid is not None and not self.lease_valid())
            or (self.window is not None and self.window.closing)
        )

    def _wait(self, seconds: float) -> bool:
        """Sleep the retry backoff; True if a stop or a lost lease cut it short."""
        if self._sleep is not None:
            return self._sleep(seconds) or self._interrupted()
        deadline = time.monotonic() + seconds  # real time, whatever clock the policy uses
        while not self._interrupted():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._stop.wait(min(left, 0.25))
        return True

    def _try_once(
        self, handler: Callable[..., Any] | None, ctx: ChangeContext, lifecycle: bool
    ) -> Exception | None:
        """One attempt; the handler's exception, or None once the event is settled.

        A transactional stream runs the handler and the anchor write in one
        transaction, so a failed attempt leaves no effects behind.
        """
        # A copied document (initial sync) has no anchor: its batch's progress write
        # records it. In a transactional stream its attempt is a savepoint inside the
        # batch's transaction.
        anchored = not ctx.is_snapshot
        if self.spec.transactional and not lifecycle:
            confirmed = self.policy.confirmed_token if anchored else None
            try:
                using = self.spec.transaction_using
                # The mark inside the transaction: what runs on its commit is not in it.
                with (
                    transaction.atomic(using=using),
                    closed_when_lost(using),
                    in_transactional_attempt(self.spec.name, using),
                ):
                    self._dispatch(handler, ctx)
                    if anchored and not ctx.saved_manually:
                        self.policy.on_settled(
                            ctx.resume_token, event_anchor_at(ctx.event), strict=True
                        )
            except _HandlerFailed as failed:
                # A save_checkpoint_now() of this attempt rolled back with it: the next
                # attempt (or the DLQ decision) must write the anchor again.
                ctx.saved_manually = False
                if anchored:
                    self.policy.confirmed_token = confirmed
                return failed.error
            return None
        try:
            self._dispatch(handler, ctx)
        except _HandlerFailed as failed:
            return failed.error
        if anchored and not lifecycle and not ctx.saved_manually:
            self.policy.on_settled(ctx.resume_token, event_anchor_at(ctx.event))
        return None

    def _dispatch(self, handler: Callable[..., Any] | None, ctx: ChangeContext) -> None:
        if handler is None:
            return  # no handler for this operation: settled
        if self.spec.filter is not None:
            try:
                accepted = self._caller.call(self.spec.filter, ctx.full_document, ctx)
            except Exception as exc:
                raise FilterError(f"stream {self.spec.name!r}: the filter raised {exc!r}") from exc
            if not accepted:
                return  # rejected by the filter: settled
        try:
            self._caller.call(handler, ctx.full_document, ctx)
        except Exception as exc:
            raise _HandlerFailed(exc) from exc

    def _settle(self, ctx: ChangeContext, lifecycle: bool) -> None:
        if lifecycle or ctx.saved_manually or ctx.is_snapshot:
            return
        strict = self.spec.transactional
        self.policy.on_settled(ctx.resume_token, event_anchor_at(ctx.event), strict=strict)

    # -- the dead-letter queue ---------------------------------------------------------

    @property
    def dlq_store(self) -> DlqStore:
        if self._dlq_store is None:
            from ..stores import dlq_stores

            queue = self.spec.dead_letter_queue
            self._dlq_store = dlq_stores[queue.store if queue is not None else "default"]
        return self._dlq_store

    def _dead_letter(self, effect: effects.ParkFailedEvent) -> None:
        """``core.events.dead_letter``: the entry and the anchor in one transaction
        for transactional streams."""
        decision = dead_letter(
            self.spec, effect.error, effect.ctx, effect.lifecycle, self, self._dlq_failures
        )
        queue = self.spec.dead_letter_queue
        if not self.spec.transactional or queue is None or not queue.enabled:
            # Without a queue the decision writes nothing (it restarts the stream): no
            # transaction, so a database that went silent is not waited for again.
            return drive(decision, self._perform)
        with transaction.atomic(using=self.spec.transaction_using):
            return drive(decision, self._perform)

    def _send_to_dlq(self, ctx: ChangeContext, reason: str) -> None:
        """``ctx.send_to_dlq(reason)``: park now; a failed write raises into the handler."""
        drive(park_on_request(self.spec, ctx, reason, self, self._dlq_failures), self._perform)

    def _save_now(self, ctx: ChangeContext) -> bool:
        if refuses_manual_save(self.spec.name, ctx, self.policy):
            return False
        return self.policy.save_now(
            ctx.resume_token, event_anchor_at(ctx.event), strict=self.spec.transactional
        )


class _Plan:
    """How a generation handles the events of one operation type: the handler, whether
    they take the path without a context first (``direct``: a change event, no filter,
    no transaction), whether the handler takes the document alone (``plain``) and
    whether it is an ``async def`` (``awaitable``, for the asyncio runtime)."""

    __slots__ = ("awaitable", "direct", "handler", "plain")

    def __init__(self, handler: Callable[..., Any] | None, direct: bool, plain: bool) -> None:
        self.handler = handler
        self.direct = direct
        self.plain = plain
        self.awaitable = handler is not None and is_async(handler)


class _HandlerFailed(Exception):
    """Carries a handler's exception out of ``_dispatch`` (and its atomic block)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error
