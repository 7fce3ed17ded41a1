"""A stream handled in parallel on the asyncio runtime: its window as tasks.

``AsyncWindow`` performs the window effects of the consumer core for an
:class:`~.event_loop.AsyncStreamConsumer` whose stream declares ``parallelism`` > 1.
Each event :class:`~..core.window.KeyedWindow` lets run becomes a task on the loop
(at most N at once) running the consumer's usual event path; ``async def``
handlers run on the loop, sync ones on a pool of N threads of the stream's own
(``AsyncHandlerCaller.executor``) instead of its single thread, so they run at once
too.

Events settle in any order; the events the watermark passes are queued and fed to
the anchor policy by one task at a time, so the processed anchor only moves forward.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
from collections import deque
from collections.abc import Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import connections

from ..core.anchors import At, event_anchor_at
from ..core.generation import announce_processed, counted
from ..core.window import WindowEntry, event_key
from .parallel import HandOff, WindowDriver
from .settled_marks import SettledMarks

logger = logging.getLogger("flowwarden_django.streams")

#: The window event the current task handles (its retries mark its key parked).
current_entry: contextvars.ContextVar[WindowEntry | None] = contextvars.ContextVar(
    "flowwarden_window_entry", default=None
)
#: Whether the current task is the reader running an event itself (``AsyncWindow``).
reader_inline: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "flowwarden_reader_inline", default=False
)


class AsyncWindowedAnchors:
    """``WindowedAnchors`` for the asyncio runtime: the event path's settlements are
    ignored (the window feeds them in order), a manual save writes the watermark."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    async def on_settled(self, token: Mapping[str, Any], at: At) -> None:
        """Ignored: the window passes settled events to the policy in stream order."""

    async def save_now(self, token: Mapping[str, Any], at: At) -> bool:
        """``ctx.asave_checkpoint_now()``: write the watermark now."""
        return await self.policy.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)


class AsyncWindow(WindowDriver):
    """The window of one parallel generation of an asyncio consumer.

    A task per event costs more than an ``async def`` handler that does not wait
    for anything, so, as the threaded window does, while the handler's calls average
    under :attr:`inline_below_seconds` the reader awaits the ready events itself; an
    event that fails there continues in a task of its own (``HandOff``), so its
    retries never hold the reader. With nothing held or queued for the anchor, the
    reader's event skips the window altogether (``_run_alone``).
    """

    def __init__(self, consumer: Any, policy: Any, marks: SettledMarks | None = None) -> None:
        super().__init__(consumer, policy, marks)
        self._progress = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        #: The events the watermark passed, for the anchor policy in stream order.
        self._to_anchor: deque[Mapping[str, Any]] = deque()
        self._feeding = False
        #: Events handed to the policy whose ``on_settled`` has not returned yet.
        self._in_feed = 0
        self.executor = ThreadPoolExecutor(
            max_workers=self.window.parallelism, thread_name_prefix=f"fw-{consumer.spec.name}"
        )

    # -- the reader's side ---------------------------------------------------------------

    async def submit(self, event: Mapping[str, Any], operation: str, event_id: str | None) -> None:
        """Admit *event*, waiting while the window is full (a stop leaves it out)."""
        key = event_key(self.key, event)
        if self._tasks and self.quick and not self._alone():
            # Tasks started before the handlers were known to be quick: let them finish
            # (nothing else may suspend the reader: its writes and its buffered events
            # do not), or each would hand the next event of its key to a task again.
            await asyncio.sleep(0)
        if self._alone() and not self._to_anchor and not self._feeding:
            await self._run_alone(key, event, operation, event_id)
            return
        while self._full() and not self._failure and not self.consumer.stopping:
            await self._wait(self.wait_tick_seconds)
        if self.consumer.stopping:
            return
        self._raise_failure()
        self.window.admit(key, event, operation, event_id)
        # Quick handlers: the reader awaits the ready events itself (see the class).
        while self.quick:
            entry = self.window.take()
            if entry is None:
                break
            await self._run(entry, inline=True)
        self._dispatch()  # what is (still) ready goes to tasks

    async def _run_alone(
        self, key: Hashable, event: Mapping[str, Any], operation: str, event_id: str | None
    ) -> None:
        """Await *event* on the reader with the window empty (``_alone``): the plain
        event path, the window entered only if the event fails or hands off."""
        consumer = self.consumer
        began = time.perf_counter()
        inline_token = reader_inline.set(True)
        handed_off: HandOff | None = None
        try:
            outcome = await consumer._handle(event, operation, event_id)
        except HandOff as hand_off:
            handed_off = hand_off
        except asyncio.CancelledError:
            self._failed(self.window.admit_running(key, event, operation, event_id, began), None)
            raise
        except BaseException as exc:
            self._failed(self.window.admit_running(key, event, operation, event_id, began), exc)
            return
        finally:
            reader_inline.reset(inline_token)
        if handed_off is not None:  # after the reset: the task is not the reader's
            self._hand_off(
                self.window.admit_running(key, event, operation, event_id, began), handed_off
            )
            return
        self._timed(began)
        announce_processed(consumer.spec.name, began, outcome)
        if outcome is None:
            entry = self.window.admit_running(key, event, operation, event_id, began)
            self._failed(entry, self._unsettled())
            return
        counted(consumer)
        self._to_anchor.append(event)
        await self._feed_anchor()

    def _hand_off(self, entry: WindowEntry, hand_off: HandOff) -> None:
        """A task continues the reader's event *entry* (running)."""
        if hand_off.failed is not None:
            entry.failing = True
        self._continuations[entry.seq] = hand_off
        self.average_seconds = 1.0  # it may be slow after all: tasks again
        self._start(entry)

    def _full(self) -> bool:
        """The window is full, counting the passed events whose anchor is not yet
        recorded, queued or in the policy's hands (a slow anchor write holds the
        reader too, so at most ``window`` events past ``save_every_n`` are unsaved)."""
        window = self.window
        return window.held + len(self._to_anchor) + self._in_feed >= window.capacity

    async def busy(self) -> bool:
        """Whether an admitted event is not yet behind the watermark."""
        self._raise_failure()
        return not self.window.empty or self._feeding

    async def wait(self, seconds: float) -> None:
        """Wait up to *seconds* for a settlement (or a failure)."""
        if not self.window.empty and not self._failure:
            await self._wait(seconds)
        self._raise_failure()

    async def drain(self) -> None:
        """Wait until every admitted event is settled and its anchor recorded."""
        while (
            (not self.window.empty or self._feeding)
            and not self._failure
            and not self.consumer.stopping
        ):
            await self._wait(self.wait_tick_seconds)
        self._raise_failure()

    async def close(self) -> None:
        """Hand out nothing more, let the running events finish (a stop interrupts
        their backoffs), then release the pool's threads and their connections."""
        self._stopping = True
        self.window.close()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        while self._feeding:
            await self._wait(self.wait_tick_seconds)
        await asyncio.get_running_loop().run_in_executor(None, self._shut_down_pool)

    def _shut_down_pool(self) -> None:
        workers = len(self.executor._threads)  # only those it started hold connections
        if not workers:
            self.executor.shutdown(wait=True)
            return
        barrier = threading.Barrier(workers)

        def close_connections() -> None:
            # Each pool thread takes one (the barrier holds it until all have one).
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=5)
            connections.close_all()

        for _ in range(workers):
            self.executor.submit(close_connections)
        self.executor.shutdown(wait=True)

    async def _wait(self, seconds: float) -> None:
        self._progress.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._progress.wait(), timeout=seconds)

    def _changed(self) -> None:
        self._progress.set()

    # -- the events' tasks ---------------------------------------------------------------

    def _dispatch(self) -> None:
        while (entry := self.window.take()) is not None:
            self._start(entry)

    def _start(self, entry: WindowEntry) -> None:
        task = asyncio.ensure_future(self._run(entry))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, entry: WindowEntry, *, inline: bool = False) -> None:
        consumer = self.consumer
        began = time.perf_counter()
        handed = self._continuations.pop(entry.seq, None) if self._continuations else None
        if handed is None:
            entry.began = began
        # The reader's own events hand off before any retry: no entry to mark there.
        entry_token = None if inline else current_entry.set(entry)
        inline_token = reader_inline.set(True) if inline else None
        handed_off: HandOff | None = None
        try:
            if handed is not None:
                outcome: bool | None = await consumer._attempt_loop(
                    handed.handler, handed.ctx, handed.lifecycle, failed=handed.failed
                )
            elif self.marks is not None and self.marks.settled_before(entry.event["_id"]):
                outcome = True  # committed before a crash: its effects are there
            elif self.remote is not None:
                outcome = await asyncio.get_running_loop().run_in_executor(
                    self.executor, self._send_remote, entry
                )
            else:
                outcome = await consumer._handle(entry.event, entry.operation, entry.event_id)
        except HandOff as hand_off:  # the reader's own event: a task continues it
            handed_off = hand_off
        except asyncio.CancelledError:
            self._failed(entry, None)
            raise
        except BaseException as exc:  # failed for good: the generation ends
            self._failed(entry, exc)
            return
        finally:
            if inline_token is not None:
                reader_inline.reset(inline_token)
            if entry_token is not None:
                current_entry.reset(entry_token)
        if handed_off is not None:
            self._hand_off(entry, handed_off)  # after the reset: the task is not the reader's
            return
        if handed is None:
            self._timed(began)
        announce_processed(consumer.spec.name, entry.began, outcome)
        if outcome is None:
            self._failed(entry, self._unsettled())
            return
        self._to_anchor.extend([passed.event for passed in self.window.settle(entry)])
        counted(consumer)
        if not inline:  # the reader takes the next ready event itself
            self._dispatch()
        await self._feed_anchor()
        self._changed()

    async def _feed_anchor(self) -> None:
        """Hand the passed events to the policy in order, one feeder at a time (a
        write may await; events settled meanwhile queue behind it and go in the next
        batch: a policy on the stream's thread takes a batch in one hop)."""
        if self._feeding:
            return
        if len(self._to_anchor) == 1 and not hasattr(self.policy, "on_settled_batch"):
            event = self._to_anchor.popleft()  # the common case: one event, nothing queued
            self._feeding, self._in_feed = True, 1
            try:
                await self.policy.on_settled(event["_id"], event_anchor_at(event))
            finally:
                self._feeding, self._in_feed = False, 0
            if not self._to_anchor:
                return
        self._feeding = True
        try:
            while self._to_anchor:
                batch = [(event["_id"], event_anchor_at(event)) for event in self._to_anchor]
                self._to_anchor.clear()
                self._in_feed = len(batch)
                settle_batch = getattr(self.policy, "on_settled_batch", None)
                if settle_batch is not None:
                    await settle_batch(batch)
                    continue
                for token, at in batch:
                    await self.policy.on_settled(token, at)
                    self._in_feed -= 1
        finally:
            self._feeding, self._in_feed = False, 0

    def _failed(self, entry: WindowEntry, error: BaseException | None) -> None:
        self.window.release(entry)
        if self._failure is None and error is not None:
            self._failure = error
        self._changed()
