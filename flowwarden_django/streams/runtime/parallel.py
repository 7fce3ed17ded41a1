"""A stream handled in parallel on the threaded runtime: its window on N threads.

``ThreadedWindow`` performs the window effects of the consumer core (``Submit``,
``WindowBusy``, ``AwaitWindow``, ``DrainWindow``) for a :class:`~.threaded.StreamConsumer`
whose stream declares ``parallelism`` > 1. The reader (the stream's thread) admits
events; N handler threads of the stream's own take them in the order
:class:`~..core.window.KeyedWindow` allows and run the consumer's usual event path
(the handler, its retries, the DLQ). The thread that settles an event records it in
the window and, under the same lock, hands the events the watermark passed to the
anchor policy in stream order, so the processed anchor only ever moves forward over
settled events.

During a parallel generation the consumer's ``policy`` is a :class:`WindowedAnchors`:
the event path's own "settled" calls go nowhere (the window decides what the anchor
may pass), and ``ctx.save_checkpoint_now()`` writes the watermark.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Hashable, Mapping
from typing import Any

from django.db import connections

from ..core.anchors import At, event_anchor_at
from ..core.generation import announce_processed, counted
from ..core.window import KeyedWindow, WindowEntry, event_key
from ..remote_events import remote_executor
from .settled_marks import SettledMarks

logger = logging.getLogger("flowwarden_django.streams")


class UnsettledEventError(ConnectionError):
    """An event of a parallel stream ended unsettled (a stop or a lost lease cut its
    retries short): nothing after it may be anchored, so the generation ends and the
    stream resubscribes from its anchor."""


class HandOff(Exception):
    """Raised on the reader's thread when an event it runs itself needs its retry loop
    (or its whole attempt loop): a handler thread continues it (``ThreadedWindow``)."""

    def __init__(self, handler: Any, ctx: Any, lifecycle: bool, failed: Any) -> None:
        super().__init__()
        self.handler = handler
        self.ctx = ctx
        self.lifecycle = lifecycle
        self.failed = failed


class WindowedAnchors:
    """The consumer's ``policy`` while a window decides the anchor: settlements made
    by the event path are left to the window (it reports them in order), a manual
    save writes the watermark; everything else is the generation's anchor policy's.

    A transactional stream's settlement (``strict``, inside the event's transaction)
    writes the event's settled mark (``settled_marks``) there instead.
    """

    def __init__(self, policy: Any, marks: SettledMarks | None = None) -> None:
        self.policy = policy
        self.marks = marks

    def on_settled(self, token: Mapping[str, Any], at: At, *, strict: bool = False) -> None:
        """Mark a transactional event settled in its transaction; else nothing (the
        window passes settled events to the policy in stream order)."""
        if strict and self.marks is not None:
            self.marks.mark(token)

    @property
    def confirmed_token(self) -> Mapping[str, Any] | None:
        return self.policy.confirmed_token

    @confirmed_token.setter
    def confirmed_token(self, value: Mapping[str, Any] | None) -> None:
        """Ignored: a transactional attempt that rolled back wrote only its mark,
        which rolled back with it; the anchor is the window's."""

    def save_now(self, token: Mapping[str, Any], at: At, *, strict: bool = False) -> bool:
        """``ctx.save_checkpoint_now()``: write the watermark now (this event may
        still be ahead of an unsettled one, whose anchor it must not take)."""
        return self.policy.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)


class WindowDriver:
    """What the threaded and the asyncio windows share: the stream's window, its
    settled marks and remote executor, the handler's moving average that decides
    when the reader runs events itself, and the generation's failure.

    A subclass performs the window effects (``submit``, ``busy``, ``wait``, ``drain``,
    ``close``) with its own means of waiting (a lock and conditions, or the loop).
    """

    #: Seconds between two looks at a stop while the reader waits for room.
    wait_tick_seconds = 0.25
    #: The handler's average time under which the reader runs events itself.
    inline_below_seconds = 50e-6
    #: The weight of the newest call in that average.
    average_weight = 0.1

    def __init__(self, consumer: Any, policy: Any, marks: SettledMarks | None = None) -> None:
        spec = consumer.spec
        self.consumer = consumer
        self.policy = policy
        #: A transactional stream's settled marks: events a crash left committed
        #: beyond the anchor are skipped.
        self.marks = marks
        #: ``execution="celery"``: what sends an event to a worker and waits for it.
        self.remote = remote_executor(spec.execution) if spec.execution != "inline" else None
        self.key = spec.key
        self.window = KeyedWindow(spec.parallelism, spec.window)
        #: The handler's moving average, in seconds; starts slow (hand events out).
        self.average_seconds = 1.0
        #: Events the reader began and another thread or task continues (``HandOff``),
        #: by ``seq``.
        self._continuations: dict[int, HandOff] = {}
        self._failure: BaseException | None = None
        self._stopping = False

    @property
    def quick(self) -> bool:
        """Whether the reader runs the ready events itself: handlers in this process
        that average under :attr:`inline_below_seconds`."""
        return self.remote is None and self.average_seconds < self.inline_below_seconds

    def _alone(self) -> bool:
        """Whether the reader may run its next event as if there were no window:
        quick handlers, nothing held (nothing to order the event behind, and the
        anchor policy has had every earlier event), no failure, no settled marks to
        consult. The window then learns of the event only if it fails
        (``KeyedWindow.admit_running``)."""
        window = self.window
        return (
            self.average_seconds < self.inline_below_seconds
            and self.remote is None
            and self.marks is None
            and window.empty
            and not window.closed
            and self._failure is None
        )

    def _timed(self, began: float) -> None:
        """Fold a call that began at *began* (``time.perf_counter()``) into the average."""
        took = time.perf_counter() - began
        self.average_seconds += self.average_weight * (took - self.average_seconds)

    def _unsettled(self) -> BaseException | None:
        """The generation's error for an event that ended unsettled: none after a stop
        (it closes the window anyway); else (a lost lease, a window closed by another
        event's failure) ``UnsettledEventError``."""
        if self.consumer.stopping:
            return None
        return UnsettledEventError(
            f"stream {self.consumer.spec.name!r}: an event was left unsettled; resubscribing"
        )

    @property
    def closing(self) -> bool:
        """Whether the window is being closed or failed: running retries stop waiting."""
        return self._stopping or self._failure is not None

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _send_remote(self, entry: WindowEntry) -> bool | None:
        """Run *entry* where the stream's ``execution`` says and wait for the answer
        (on a slot's thread); the worker's first failed attempt parks its key here."""

        def failing() -> None:
            entry.failing = True

        return self.remote(
            self.consumer.spec.name,
            entry.event,
            entry.event_id,
            self._stop_waiting,
            failing=failing,
        )

    def _stop_waiting(self) -> bool:
        """Whether a slot waiting for a worker's answer should give up: a stop only;
        read from any thread.

        After another event's failure the slot waits on, for the answer or its own
        ``STREAM_EVENT_TIMEOUT``: the task it sent may still run, and the next
        generation (which ``close`` holds back until then) would send the key's events
        again from the anchor, so that one of them could run beside it, or after it
        out of order."""
        return self.consumer.stopping


class ThreadedWindow(WindowDriver):
    """The window of one parallel generation of a threaded consumer (see the module).

    One lock guards the window. Idle handler threads wait on ``_work`` and are woken
    one per event made ready; the reader (and a drain) wait on ``_progress``, which a
    settlement signals. A handler thread settles its event and takes the next one in
    one hold of the lock.

    Handing an event to another thread costs a wake-up and a switch of the GIL (about
    20 us here): more than a handler that does no I/O takes. So while the handler's
    calls average under :attr:`inline_below_seconds`, the reader runs the ready events
    itself, in the order the window allows; a slower average hands them to the
    threads again. With nothing held, the reader's event skips the window altogether
    (``_run_alone``): the window's cost then is a key and a test per event.
    """

    def __init__(self, consumer: Any, policy: Any, marks: SettledMarks | None = None) -> None:
        super().__init__(consumer, policy, marks)
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._progress = threading.Condition(self._lock)
        self._idle_workers = 0
        self._progress_waiters = 0
        self._reader = threading.get_ident()
        #: Whether the reader is running an event itself (``_run_inline``).
        self._inline = False
        #: Events the reader began and handed to a handler thread (``HandOff``).
        self._handed: deque[tuple[WindowEntry, HandOff]] = deque()
        name = consumer.spec.name
        self._threads = [
            threading.Thread(target=self._serve, name=f"fw-{name}-{number}", daemon=True)
            for number in range(1, self.window.parallelism + 1)
        ]

    def start(self) -> None:
        """Start the handler threads."""
        for thread in self._threads:
            thread.start()

    # -- the reader's side (the stream's thread) ---------------------------------------

    def submit(self, event: Mapping[str, Any], operation: str, event_id: str | None) -> None:
        """Admit *event*, waiting while the window is full. A stop meanwhile leaves it
        out (it is after the anchor: the next run reads it again)."""
        key = event_key(self.key, event)
        if self._alone():  # read without the lock: only the reader admits events
            self._run_alone(key, event, operation, event_id)
            return
        window = self.window
        with self._lock:
            if window.full:
                while window.full and not self._failure and not self.consumer.stopping:
                    self._await_progress(self.wait_tick_seconds)
                if self.consumer.stopping:
                    return
            if self._failure is not None:
                raise self._failure
            window.admit(key, event, operation, event_id)
            if not self.quick:
                self._wake_workers()
                return
            entry = window.take()
        if entry is not None:
            self._run_inline(entry)

    def _run_alone(
        self, key: Hashable, event: Mapping[str, Any], operation: str, event_id: str | None
    ) -> None:
        """Run *event* on the reader with the window empty (``_alone``): the plain
        event path, the window entered only if the event fails or hands off."""
        consumer = self.consumer
        began = time.perf_counter()
        self._inline = True
        try:
            outcome = consumer._handle(event, operation, event_id)
        except HandOff as hand_off:
            self._hand_off(self._admit_running(key, event, operation, event_id, began), hand_off)
            return
        except BaseException as exc:
            self._failed(self._admit_running(key, event, operation, event_id, began), exc)
            return
        finally:
            self._inline = False
        self._timed(began)
        announce_processed(consumer.spec.name, began, outcome)
        if outcome is None:
            entry = self._admit_running(key, event, operation, event_id, began)
            self._failed(entry, self._unsettled())
            return
        with self._lock:
            counted(consumer)
            self.policy.on_settled(event["_id"], event_anchor_at(event))

    def _admit_running(
        self,
        key: Hashable,
        event: Mapping[str, Any],
        operation: str,
        event_id: str | None,
        began: float,
    ) -> WindowEntry:
        with self._lock:
            return self.window.admit_running(key, event, operation, event_id, began)

    def hand_off_from_reader(self, handler: Any, ctx: Any, lifecycle: bool, failed: Any) -> None:
        """Raise ``HandOff`` when called on the reader's thread (an event it runs
        itself has failed, or needs the full attempt loop); else do nothing."""
        if self._inline and threading.get_ident() == self._reader:
            raise HandOff(handler, ctx, lifecycle, failed)

    def _run_inline(self, entry: WindowEntry | None) -> None:
        """Run *entry* and the events it makes ready on the reader's thread (quick
        handlers: see the class)."""
        while entry is not None:
            self._inline = True
            try:
                entry = self._run(entry, inline=True)
            finally:
                self._inline = False

    def busy(self) -> bool:
        """Whether an admitted event is not yet behind the watermark."""
        with self._lock:
            self._raise_failure()
            return not self.window.empty

    def wait(self, seconds: float) -> None:
        """Wait up to *seconds* for a settlement (or a failure)."""
        with self._lock:
            if not self.window.empty and not self._failure:
                self._await_progress(seconds)
            self._raise_failure()

    def drain(self) -> None:
        """Wait until every admitted event is settled and behind the watermark."""
        with self._lock:
            while not self.window.empty and not self._failure and not self.consumer.stopping:
                self._await_progress(self.wait_tick_seconds)
            self._raise_failure()

    def close(self) -> None:
        """End the generation's window: hand out nothing more, let the running
        events finish (a stop interrupts their retry backoffs), stop the threads."""
        with self._lock:
            self._stopping = True
            self.window.close()
            self._work.notify_all()
            while not self.window.idle:
                self._await_progress(self.wait_tick_seconds)
        for thread in self._threads:
            thread.join()

    def _await_progress(self, seconds: float) -> None:
        """Wait (under the lock) until a settlement or failure signals, or *seconds*."""
        self._progress_waiters += 1
        try:
            self._progress.wait(seconds)
        finally:
            self._progress_waiters -= 1

    def _wake_workers(self) -> None:
        """Wake as many idle handler threads as events are ready (under the lock)."""
        wanted = min(self._idle_workers, self.window.ready)
        if wanted:
            self._work.notify(wanted)

    # -- the handler threads -------------------------------------------------------------

    def _serve(self) -> None:
        try:
            with self._lock:
                entry = self._next()
            while entry is not None:
                entry = self._run(entry)
        finally:
            connections.close_all()  # this thread's own connections

    def _next(self) -> WindowEntry | None:
        """The next event this thread runs, waiting for one (under the lock)."""
        while True:
            if self._handed:
                entry, hand_off = self._handed.popleft()
                self._continuations[entry.seq] = hand_off
                return entry
            entry = self.window.take()
            if entry is not None:
                return entry
            if self._stopping or self.window.closed:
                return None
            self._idle_workers += 1
            try:
                self._work.wait()
            finally:
                self._idle_workers -= 1

    def _run(self, entry: WindowEntry, *, inline: bool = False) -> WindowEntry | None:
        """Handle *entry*, settle it; the next event for this thread: for a handler
        thread, the next it may run (waiting for one); for the reader (*inline*), the
        next ready one, if any."""
        consumer = self.consumer
        began = time.perf_counter()
        handed = self._continuations.pop(entry.seq, None) if self._continuations else None
        if handed is None:
            entry.began = began
        if not inline:  # the reader's own events hand off before any retry
            consumer.window_entries.entry = entry
        try:
            if handed is not None:
                outcome = consumer._attempt_loop(
                    handed.handler, handed.ctx, handed.lifecycle, failed=handed.failed
                )
            elif self.marks is not None and self.marks.settled_before(entry.event["_id"]):
                outcome = True  # committed before a crash: its effects are there
            elif self.remote is not None:
                outcome = self._send_remote(entry)
            else:
                outcome = consumer._handle(entry.event, entry.operation, entry.event_id)
        except HandOff as hand_off:  # the reader's own event: a thread continues it
            self._hand_off(entry, hand_off)
            return None
        except BaseException as exc:  # the event failed for good: the generation ends
            return self._failed(entry, exc)
        finally:
            if not inline:
                consumer.window_entries.entry = None
        self._timed(began)
        announce_processed(consumer.spec.name, entry.began, outcome)
        if outcome is None:
            return self._failed(entry, self._unsettled())
        with self._lock:
            passed = self.window.settle(entry)
            counted(consumer)
            for settled in passed:
                # Under the lock: the policy sees the settled prefix in stream order.
                self.policy.on_settled(settled.event["_id"], event_anchor_at(settled.event))
            if self._progress_waiters:
                self._progress.notify_all()
            if inline and not self.quick:
                self._wake_workers()  # the handler got slow: the threads take over
                return None
            following = self.window.take()
            if following is None:
                return None if inline else self._next()
            self._wake_workers()  # its key's next event may be ready for another thread
            return following

    def _hand_off(self, entry: WindowEntry, hand_off: HandOff) -> None:
        """A handler thread continues the reader's event *entry* (running)."""
        with self._lock:
            if hand_off.failed is not None:
                entry.failing = True
            self._handed.append((entry, hand_off))
            self._work.notify()
        self.average_seconds = 1.0  # it may be slow after all: hand events out again

    def _failed(self, entry: WindowEntry, error: BaseException | None) -> None:
        with self._lock:
            self.window.release(entry)
            if self._failure is None and error is not None:
                self._failure = error
            self._progress.notify_all()
            self._work.notify_all()
        return None
