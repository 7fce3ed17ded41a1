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
from collections.abc import Mapping
from typing import Any

from django.db import connections

from ..core.anchors import At, event_anchor_at
from ..core.generation import announce_processed, counted
from ..core.window import KeyedWindow, WindowEntry, event_key

logger = logging.getLogger("flowwarden_django.streams")


class UnsettledEventError(ConnectionError):
    """An event of a parallel stream ended unsettled (a stop or a lost lease cut its
    retries short): nothing after it may be anchored, so the generation ends and the
    stream resubscribes from its anchor."""


class WindowedAnchors:
    """The consumer's ``policy`` while a window decides the anchor: settlements made
    by the event path are ignored (the window reports them in order), a manual save
    writes the watermark; everything else is the generation's anchor policy's."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def on_settled(self, token: Mapping[str, Any], at: At, *, strict: bool = False) -> None:
        """Ignored: the window passes settled events to the policy in stream order."""

    def save_now(self, token: Mapping[str, Any], at: At, *, strict: bool = False) -> bool:
        """``ctx.save_checkpoint_now()``: write the watermark now (this event may
        still be ahead of an unsettled one, whose anchor it must not take)."""
        return self.policy.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)


class ThreadedWindow:
    """The window of one parallel generation of a threaded consumer (see the module)."""

    #: Seconds between two looks at a stop while the reader waits for room.
    wait_tick_seconds = 0.25

    def __init__(self, consumer: Any, policy: Any) -> None:
        spec = consumer.spec
        self.consumer = consumer
        self.policy = policy
        self.key = spec.key
        self.window = KeyedWindow(spec.parallelism, spec.window)
        self._changed = threading.Condition()
        self._failure: BaseException | None = None
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._work, name=f"fw-{spec.name}-{number}", daemon=True)
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
        with self._changed:
            while self.window.full and not self._failure and not self.consumer.stopping:
                self._changed.wait(self.wait_tick_seconds)
            if self.consumer.stopping:
                return
            self._raise_failure()
            self.window.admit(key, event, operation, event_id)
            self._changed.notify_all()

    def busy(self) -> bool:
        """Whether an admitted event is not yet behind the watermark."""
        with self._changed:
            self._raise_failure()
            return not self.window.empty

    def wait(self, seconds: float) -> None:
        """Wait up to *seconds* for a settlement (or a failure)."""
        with self._changed:
            if not self.window.empty and not self._failure:
                self._changed.wait(seconds)
            self._raise_failure()

    def drain(self) -> None:
        """Wait until every admitted event is settled and behind the watermark."""
        with self._changed:
            while not self.window.empty and not self._failure and not self.consumer.stopping:
                self._changed.wait(self.wait_tick_seconds)
            self._raise_failure()

    def close(self) -> None:
        """End the generation's window: hand out nothing more, let the running
        events finish (a stop interrupts their retry backoffs), stop the threads."""
        with self._changed:
            self._stopping = True
            self.window.close()
            self._changed.notify_all()
            while not self.window.idle:
                self._changed.wait(self.wait_tick_seconds)
        for thread in self._threads:
            thread.join()

    @property
    def closing(self) -> bool:
        """Whether the window is being closed or failed: running retries stop waiting."""
        return self._stopping or self._failure is not None

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    # -- the handler threads -------------------------------------------------------------

    def _work(self) -> None:
        try:
            while True:
                entry = self._next()
                if entry is None:
                    return
                self._run(entry)
        finally:
            connections.close_all()  # this thread's own connections

    def _next(self) -> WindowEntry | None:
        with self._changed:
            while True:
                entry = self.window.take()
                if entry is not None:
                    return entry
                if self._stopping or self.window.closed:
                    return None
                self._changed.wait()

    def _run(self, entry: WindowEntry) -> None:
        consumer = self.consumer
        entry.began = time.perf_counter()
        consumer.window_entries.entry = entry
        try:
            outcome = consumer._handle(entry.event, entry.operation, entry.event_id)
        except BaseException as exc:  # the event failed for good: the generation ends
            self._failed(entry, exc)
            return
        finally:
            consumer.window_entries.entry = None
        announce_processed(consumer.spec.name, entry.began, outcome)
        if outcome is None:
            # A stop closes the window anyway; anything else (a lost lease, a window
            # closed by another event's failure) ends the generation.
            error = (
                None
                if consumer.stopping
                else UnsettledEventError(
                    f"stream {consumer.spec.name!r}: an event was left unsettled; resubscribing"
                )
            )
            self._failed(entry, error)
            return
        with self._changed:
            passed = self.window.settle(entry)
            counted(consumer)
            for settled in passed:
                # Under the lock: the policy sees the settled prefix in stream order.
                self.policy.on_settled(settled.event["_id"], event_anchor_at(settled.event))
            self._changed.notify_all()

    def _failed(self, entry: WindowEntry, error: BaseException | None) -> None:
        with self._changed:
            self.window.release(entry)
            if self._failure is None and error is not None:
                self._failure = error
            self._changed.notify_all()
