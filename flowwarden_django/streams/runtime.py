"""One stream's consumer: the resume cascade, sequential dispatch, the checkpoint
policy, the idle heartbeat, history-lost recovery, invalidation and the managed
restart.

A ``StreamConsumer`` runs on one thread and handles events strictly in order. The
heartbeat needs no second cursor: events are settled before the next poll, so
when a poll comes back empty every event up to the cursor's postBatchResumeToken
is settled, and that token is a position the server certified.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import inspect
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connections, transaction
from django.utils import timezone

from ..common.connections import discard_unusable_connections
from ..common.failure_log import FailureLog
from ..common.outages import error_summary, is_outage, short_message
from . import initial_sync, metrics
from .checkpoint import CheckpointStore
from .context import ChangeContext, aware_datetime, new_event_id
from .core import effects
from .core.driving import drive
from .core.events import (
    FilterError,
    attempt_loop,
    dead_letter,
    park_on_request,
)
from .core.heartbeat import Heartbeat
from .core.resume import (
    HistoryLostError,
    Opened,
    open_arguments,
    open_stream,
)
from .dispatch import HandlerCaller
from .dlq import DlqStore
from .locks import LeaseLostError
from .observed_store import ObservedCheckpointStore
from .policy import At, ProcessedAnchorPolicy, anchor_failure_log
from .source import ChangeCursor, ChangeSource
from .spec import (
    LIFECYCLE_OPERATIONS,
    SNAPSHOT_OPERATION,
    StreamSpec,
)

logger = logging.getLogger("flowwarden_django.streams")


class StreamState(enum.StrEnum):
    """Where a consumer is in its life."""

    STARTING = "starting"
    #: Copying the collection's existing documents (an initial sync) before streaming.
    COPYING = "copying"
    RUNNING = "running"
    RESTARTING = "restarting"
    STOPPED = "stopped"
    CRASHED = "crashed"


class StreamInvalidatedError(RuntimeError):
    """The watched collection was renamed (or dropped under FAIL): the stream stops."""


class _RestartNow(Exception):
    """End this generation and resubscribe at once (after a self-healed invalidate)."""


def announce_received(name: str, event: Mapping[str, Any], operation: str) -> str | None:
    """Send ``event_received`` for *event* when someone listens; the event id it gave
    (``None`` when nobody needed one: the context makes its own when asked)."""
    received = metrics.listeners(metrics.event_received, name)
    if not received:
        return None
    # What the context's properties would say, without making the context; the id and
    # the wall time only for receivers that read them (metrics.reads).
    lean = received.lean if type(received) is metrics.Receivers else False
    event_id = None if lean else new_event_id()
    metrics.send_event_received(
        name,
        received,
        event_id,
        operation,
        (event.get("ns") or {}).get("coll"),
        event.get("documentKey"),
        event.get("clusterTime"),
        None if lean else aware_datetime(event.get("wallTime")),
    )
    return event_id


def _anchor_at(ctx: ChangeContext) -> At:
    """The processed anchor's timestamp: the event's cluster time, else now."""
    return _event_anchor_at(ctx.event)


def _event_anchor_at(event: Mapping[str, Any]) -> At:
    """The processed anchor's timestamp of *event*: its cluster time, else now.

    The cluster time is converted when the anchor is written (once per
    ``save_every_n`` events), not for every event.
    """
    cluster_time = event.get("clusterTime")
    if cluster_time is None:
        return timezone.now()
    as_datetime = getattr(cluster_time, "as_datetime", None)
    if as_datetime is not None:
        return as_datetime  # a bson.Timestamp: its aware UTC datetime, when called
    return functools.partial(_cluster_anchor_at, cluster_time)


def _cluster_anchor_at(cluster_time: Any) -> datetime:
    return aware_datetime(cluster_time) or timezone.now()


class StreamConsumer:
    """Consumes one declared stream until stopped.

    ``run()`` blocks. ``burst=True`` returns once the stream has caught up. A
    cursor that dies is reopened through the full resume cascade with the
    stream's restart backoff; lost history under ``FAIL``, a rename, or running
    out of restart attempts stops it for good (``state`` is then ``CRASHED``).
    """

    #: How often the flusher thread looks for a dirty anchor past its age threshold.
    flush_tick_seconds = 1.0
    #: The longest wait between two restarts while a server does not answer (an
    #: outage, see ``common.outages``), whatever the restart policy's ``max_delay``:
    #: the stream notices the server's return within this many seconds.
    outage_restart_max_seconds = 2.0

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
        self._last_event_time: float | None = None
        self.events_handled = 0
        #: Documents an initial sync handed to the stream (settled), in this process.
        self.documents_copied = 0
        self.restarts = 0
        self.errors = 0
        self.retries = 0
        self.dead_lettered = 0
        self.started_at: datetime | None = None
        #: Set after each dead-letter write; whoever reports the backlog clears it.
        self.dlq_dirty = threading.Event()
        self.policy: ProcessedAnchorPolicy | None = None
        self._restart_cause: tuple[int, BaseException] | None = None
        #: When the stream started restarting (``None`` while it runs).
        self.restarting_since: datetime | None = None
        self._restart_error: type[BaseException] | None = None
        self._dlq_failures = FailureLog(logger, f"stream {spec.name!r}: writing a dead letter")
        # These outlive a generation's policy and heartbeat: a failure that ends a
        # generation (an outage) is logged once, and its recovery in the next one.
        self._anchor_failures = anchor_failure_log(spec.name)
        self._heartbeat_failures = FailureLog(logger, f"stream {spec.name!r}: the heartbeat write")

    @property
    def last_event_at(self) -> datetime | None:
        """When the last event was handled (``timezone.now()`` of that moment)."""
        stamp = getattr(self, "_last_event_time", None)  # None also before __init__ ran
        if stamp is None:
            return None
        return datetime.fromtimestamp(stamp, UTC if settings.USE_TZ else None)

    @last_event_at.setter
    def last_event_at(self, value: datetime | None) -> None:
        self._last_event_time = None if value is None else value.timestamp()

    # -- control ---------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the consumer to stop after the event in hand (it flushes its anchor)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self, *, burst: bool = False) -> None:
        """Consume until stopped (or caught up, with *burst*); raise when terminal."""
        # No _stop.clear(): a stop() that arrives before this thread runs must hold.
        attempt = 0
        try:
            while not self._stop.is_set():
                self.state = StreamState.STARTING
                handled_before = self.events_handled + self.documents_copied
                try:
                    self._run_generation(burst=burst)
                    self._stopped_gracefully()
                    return
                except initial_sync.CopyInterrupted:
                    # A stop during the copy: it resumes after its last committed batch.
                    self._stopped_gracefully()
                    return
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
                    # Another process leads now: stop here, without another write.
                    self.last_error = exc
                    logger.warning("stream %r: %s; stopping", self.spec.name, exc)
                    self._stopped_gracefully()
                    return
                except Exception as exc:
                    # Attempts count restarts without progress: a generation that handled
                    # events resets them, one that dies on the same event does not.
                    progressed = self.events_handled + self.documents_copied > handled_before
                    attempt = 0 if progressed else attempt
                    attempt += 1
                    policy = self.spec.restart_policy
                    if policy.max_attempts and attempt > policy.max_attempts:
                        self._crash(exc)
                        raise
                    # Django drops broken connections only around requests: without
                    # this, every restart would fail again on the dead connection.
                    discard_unusable_connections()
                    delay = self._restarting(attempt, exc)
                    if self._stop.wait(delay):
                        break
            self._stopped_gracefully()
        finally:
            self._caller.close()
            close_old_connections()

    def _restarting(self, attempt: int, exc: BaseException) -> float:
        """Record that *exc* stopped the stream and it restarts (attempt *attempt*);
        the delay before it does."""
        self.last_error = exc
        if self.restarting_since is None:
            self.restarting_since = timezone.now()
        self.state = StreamState.RESTARTING
        delay = self._restart_delay(attempt, exc)
        # One traceback when the trouble starts or changes, not one a restart.
        changed = type(exc) is not self._restart_error
        self._restart_error = type(exc)
        logger.warning(
            "stream %r: stopped by %s (%s); restart %d in %.1fs",
            self.spec.name,
            error_summary(exc),
            short_message(exc),
            attempt,
            delay,
            exc_info=changed,
        )
        self.restarts += 1
        self._restart_cause = (attempt, exc)
        return delay

    def _crash(self, exc: BaseException) -> None:
        self.state = StreamState.CRASHED
        self.last_error = exc
        logger.error("stream %r stopped: %s", self.spec.name, exc)
        metrics.emit(metrics.stream_stopped, self.spec.name, reason="CRASHED", cause=exc)

    def _stopped_gracefully(self) -> None:
        self.state = StreamState.STOPPED
        metrics.emit(metrics.stream_stopped, self.spec.name, reason="GRACEFUL", cause=None)

    def _restart_delay(self, attempt: int, exc: BaseException | None = None) -> float:
        policy = self.spec.restart_policy
        delay = policy.delay(attempt)
        if policy.jitter:
            delay *= random.uniform(0.8, 1.2)
        if exc is not None and is_outage(exc):
            delay = min(delay, self.outage_restart_max_seconds)
        return delay

    # -- one generation: open, consume, close ----------------------------------------

    def _run_generation(self, *, burst: bool) -> None:
        source = self.source_factory(self.spec)
        opened = self._open(source)
        self.state = StreamState.RUNNING
        self.started_at = timezone.now()
        if self.restarting_since is not None:
            logger.info(
                "stream %r: running again (restarting since %s)",
                self.spec.name,
                self.restarting_since.isoformat(timespec="seconds"),
            )
            self.restarting_since, self._restart_error = None, None
        metrics.emit(metrics.stream_started, self.spec.name, config=self.configuration())
        if self._restart_cause is not None:
            attempt, cause = self._restart_cause
            self._restart_cause = None
            metrics.emit(metrics.stream_restarted, self.spec.name, attempt=attempt, cause=cause)
        checkpoint = self.spec.checkpoint
        self._plans = {}
        self.policy = ProcessedAnchorPolicy(
            self.store,
            self.spec.name,
            save_every_n=checkpoint.save_every_n,
            save_interval_seconds=checkpoint.save_interval_seconds,
            confirmed_token=opened.confirmed_processed,
            monotonic=self._monotonic,
            failure_log=self._anchor_failures,
        )
        self._heartbeat = Heartbeat(
            self.spec.name,
            checkpoint.idle_heartbeat_interval_seconds,
            self._monotonic,
            self._heartbeat_failures,
            certified=opened.certified,
            recovery_expected=opened.recovery_expected,
        )
        self._invalidate_cause: str | None = None
        cursor, event = opened.cursor, opened.first_event
        flusher = self._start_flusher()
        # Without an age threshold flush_if_due() never writes: not asked per event.
        by_age = bool(checkpoint.save_interval_seconds)
        try:
            while not self._stop.is_set():
                if event is None:
                    event = cursor.try_next()
                if event is None:
                    if not cursor.alive:
                        raise ConnectionError("the change stream closed")
                    self.policy.flush_if_due()
                    drive(self._heartbeat.on_idle(cursor.resume_token), self._perform)
                    self._database_housekeeping()
                    if burst:
                        break
                    continue
                if self.lease_valid is not None:
                    self._check_lease()
                if not self._handle(event, source):
                    # Unsettled (a stop or a lost lease cut its retries short): nothing
                    # after it may be handled in this generation.
                    self._check_lease()
                    if self._stop.is_set():
                        break
                    raise ConnectionError("an event was left unsettled; resubscribing")
                event = None
                if by_age:
                    self.policy.flush_if_due()
        finally:
            if flusher is not None:
                flusher.set()
            self._close(cursor)

    def _start_flusher(self) -> threading.Event | None:
        """Flush an aged dirty anchor even while a slow handler holds the stream's thread.

        Transactional streams write every anchor inside the handler's transaction,
        so they need none.
        """
        interval = self.spec.checkpoint.save_interval_seconds
        if not interval or self.spec.transactional or self.policy is None:
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

    #: Seconds between two ``close_old_connections()`` calls while the stream idles.
    housekeeping_interval_seconds = 60.0

    def _database_housekeeping(self) -> None:
        """Drop broken or expired database connections now and then, as each request
        does in a web process; not after every poll, which would reconnect for every
        anchor write under ``CONN_MAX_AGE=0``."""
        now = self._monotonic()
        if now - getattr(self, "_last_housekeeping", float("-inf")) >= (
            self.housekeeping_interval_seconds
        ):
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

    def _open(self, source: ChangeSource) -> Opened:
        """The resume cascade (``core.resume``), performed on this thread."""
        return drive(open_stream(self.spec), partial(self._perform, source=source))

    def _perform(self, effect: effects.Effect, source: ChangeSource | None = None) -> Any:
        """Do what the core asks (see ``core.effects``), with plain calls."""
        store, name = self.store, self.spec.name
        match effect:
            case effects.PollCursor(cursor):
                return cursor.try_next()
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

    def _check_lease(self) -> None:
        if self.lease_valid is not None and not self.lease_valid():
            raise LeaseLostError(f"stream {self.spec.name!r}: the lease was lost")

    def _handle(self, event: Mapping[str, Any], source: ChangeSource) -> bool:
        """Handle one event; False when it was left unsettled."""
        operation = event.get("operationType", "")
        if operation == "invalidate":
            self._invalidated(event, source)
        assert self.policy is not None
        spec = self.spec
        name = spec.name
        event_id = announce_received(name, event, operation)
        plan = self._plans.get(operation) or self._plan(operation)
        handler = plan.handler
        started = time.perf_counter()
        if plan.plain:
            # The common case, inlined: a document handler, no filter, no transaction.
            try:
                result = handler(event.get("fullDocument"))  # type: ignore[misc]
                if result is not None and inspect.isawaitable(result):  # async def
                    self._caller.run(result)
            except Exception as exc:
                ctx = self._context(event, event_id)
                success = self._attempt_loop(handler, ctx, False, failed=exc)
            else:
                self.policy.on_settled(event["_id"], _event_anchor_at(event))
                success = True
        elif plan.direct:
            success = self._first_attempt(handler, event, event_id)
        else:
            ctx = self._context(event, event_id)
            lifecycle = operation in LIFECYCLE_OPERATIONS
            if lifecycle:
                self._invalidate_cause = operation
            success = self._attempt_loop(handler, ctx, lifecycle)
        processed = metrics.listeners(metrics.event_processed, name)
        if processed:
            metrics.send_event_processed(name, processed, time.perf_counter() - started, success)
        if success is None:
            return False  # a stop interrupted the retries: unsettled, redelivered later
        self.events_handled += 1
        self._last_event_time = time.time()
        heartbeat = self._heartbeat
        if heartbeat.interval:  # the idle heartbeat's clock (nothing else reads it)
            heartbeat.last_activity = self._monotonic()
        return True

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
        # save_now gets the context as an argument: a closure over ctx would make a
        # reference cycle per event for the garbage collector to find.
        return ChangeContext(
            event,
            stream_name=self.spec.name,
            save_now=self._save_now,
            send_to_dlq=self._send_to_dlq,
            event_id=event_id,
        )

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
            self.policy.on_settled(event["_id"], _event_anchor_at(event))  # type: ignore[union-attr]
        return True

    def _attempt_loop(
        self,
        handler: Callable[..., Any] | None,
        ctx: ChangeContext,
        lifecycle: bool,
        *,
        failed: Exception | None = None,
    ) -> bool | None:
        """``core.events.attempt_loop``, performed on this thread."""
        decision = attempt_loop(self.spec, handler, ctx, lifecycle, self, failed=failed)
        return drive(decision, self._perform)

    def _interrupted(self) -> bool:
        """A stop was asked for, or this process no longer holds the stream's lease."""
        return self._stop.is_set() or (self.lease_valid is not None and not self.lease_valid())

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
                with transaction.atomic(using=self.spec.transaction_using):
                    self._dispatch(handler, ctx)
                    if anchored and not ctx.saved_manually:
                        self.policy.on_settled(ctx.resume_token, _anchor_at(ctx), strict=True)
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
            self.policy.on_settled(ctx.resume_token, _anchor_at(ctx))
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
        self.policy.on_settled(ctx.resume_token, _anchor_at(ctx), strict=strict)

    # -- the dead-letter queue ---------------------------------------------------------

    @property
    def dlq_store(self) -> DlqStore:
        if self._dlq_store is None:
            from .stores import dlq_stores

            queue = self.spec.dead_letter_queue
            self._dlq_store = dlq_stores[queue.store if queue is not None else "default"]
        return self._dlq_store

    def _dead_letter(self, effect: effects.ParkFailedEvent) -> None:
        """``core.events.dead_letter``: the entry and the anchor in one transaction
        for transactional streams."""
        decision = dead_letter(
            self.spec, effect.error, effect.ctx, effect.lifecycle, self, self._dlq_failures
        )
        if not self.spec.transactional:
            return drive(decision, self._perform)
        with transaction.atomic(using=self.spec.transaction_using):
            return drive(decision, self._perform)

    def _send_to_dlq(self, ctx: ChangeContext, reason: str) -> None:
        """``ctx.send_to_dlq(reason)``: park now; a failed write raises into the handler."""
        drive(park_on_request(self.spec, ctx, reason, self, self._dlq_failures), self._perform)

    def configuration(self) -> dict[str, Any]:
        """The stream's settings as ``stream_started`` reports them."""
        spec = self.spec
        return {
            "stream": spec.name,
            "collection": spec.collection,
            "database": spec.database,
            "deployment_mode": spec.deployment_mode,
            "checkpoint": dataclasses.asdict(spec.checkpoint),
            "retry": None
            if spec.retry_policy is None
            else {
                "max_attempts": spec.retry_policy.max_attempts,
                "initial_delay": spec.retry_policy.initial_delay,
                "max_delay": spec.retry_policy.max_delay,
                "multiplier": spec.retry_policy.multiplier,
                "jitter": spec.retry_policy.jitter,
            },
            "dlq": None
            if spec.dead_letter_queue is None
            else dataclasses.asdict(spec.dead_letter_queue),
            "handlers": sorted(spec.handlers) + (["change"] if spec.on_change else []),
        }

    def _save_now(self, ctx: ChangeContext) -> bool:
        operation = ctx.operation_type
        if operation in LIFECYCLE_OPERATIONS or self.policy is None:
            logger.warning(
                "stream %r: save_checkpoint_now() ignored for a %s event", self.spec.name, operation
            )
            return False
        return self.policy.save_now(
            ctx.resume_token, _anchor_at(ctx), strict=self.spec.transactional
        )

    def _invalidated(self, event: Mapping[str, Any], source: ChangeSource) -> None:
        cause = self._invalidate_cause or "drop"
        name = self.spec.name
        metrics.emit(metrics.stream_invalidated, name, cause=cause)
        # No anchor write may land between reading the dead anchor and the guarded
        # reset below: the flusher would defeat the guard.
        if self.policy is not None:
            self.policy.cancel()
        saved = self.store.find(name)
        dead = saved.last_processed_token if saved else None
        terminal = cause == "rename" or self.spec.checkpoint.on_history_lost == "FAIL"
        if not terminal:
            try:
                fresh = source.initial_position()
                self.store.reset_after_history_lost(name, fresh, dead, timezone.now())
            except Exception:
                logger.exception("stream %r: repairing after invalidate failed", name)
                terminal = True
            else:
                logger.warning("stream %r: collection %s; restarting from now", name, cause)
                self.policy = None  # nothing to flush: the anchor was just replaced
                raise _RestartNow
        # Durable marker: the unusable invalidate token as seen, processed cleared, so
        # every later start reaches the history-lost strategy and fails loudly.
        self.store.reset_after_history_lost(name, event["_id"], dead, timezone.now())
        self.policy = None
        raise StreamInvalidatedError(
            f"stream {name!r}: the collection was {'renamed' if cause == 'rename' else 'dropped'}"
            " (invalidate); the stream stopped. Reset its checkpoint to start it again."
        )


class _Plan:
    """How a generation handles the events of one operation type: the handler, whether
    they take the path without a context first (``direct``: a change event, no filter,
    no transaction) and whether the handler takes the document alone (``plain``)."""

    __slots__ = ("direct", "handler", "plain")

    def __init__(self, handler: Callable[..., Any] | None, direct: bool, plain: bool) -> None:
        self.handler = handler
        self.direct = direct
        self.plain = plain


class _HandlerFailed(Exception):
    """Carries a handler's exception out of ``_dispatch`` (and its atomic block)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error
