"""Handing a step's activity back to Temporal when its worker's database falls silent.

A step's activity heartbeats while the step runs (``activities._Heartbeats``), so
that Temporal retries it elsewhere once its worker dies. A worker cut off from
PostgreSQL alone, the Temporal server still reachable, keeps heartbeating: Temporal
would never retry the step, while the step is stuck and nobody renews its run's claim
(``workflows.execution.claim_keeper``). So the heartbeat thread also watches the
claim: once no renewal of it has held for half the lease (:data:`LAPSE_FRACTION`),
the database has not answered for that long and the run passes to another runner
when the lease is out. The thread then fails the attempt itself, through the
worker's client (``RespondActivityTaskFailed`` by its task token), with a retry
delay that brings the retry just after the lease runs out (:data:`MARGIN` later),
and stops heartbeating. Temporal's retry (on any worker) meets the old claim until
then, and runs the step once it is free (``ConcurrentRunError`` in ``_run_step``).

The step's own thread runs on: its late save is refused by the fence (its claim was
taken over) or on its dead connection, and the SDK's report of the attempt is
refused by the server (the attempt was failed already). The SDK learns that the
attempt is gone when it next sends a heartbeat (one it had held back, throttled)
and then cancels the attempt, raising ``CancelledError`` in the step's thread; a
step handed back is shielded from that (:func:`shield_step`): interrupted after
its database came back, a step would record a failed attempt, and one without a
retry left would fail its run. When the database was only
slow (its renewals hold again before the lease is out), the retry meets the live
claim and waits for it; the first attempt's save hands the run to the step's
hand-off token, and the retry takes it from there and runs the next step: no step
runs twice, no ``seq`` gets two snapshots.

While its database is silent, the worker also refuses the steps Temporal offers it
(:func:`refuse_while_silent`; it still polls, the server being reachable): each would
wait for a connection that cannot come. A first attempt is handed back as a worker
that lacks the run's version hands a step back (``VERSION_HANDBACK``: the workflow
offers it again at once, as a fresh activity). A retry is not refused at its start:
it may come just after the link healed, when a new connection works at once while
the old claim's renewal still waits for its retransmission, and taking the run over
then is what lets it go on; once its heartbeat thread sees the database still
silent (a claim of this process in it lapsing, its run's or another's), it hands
the retry back like any step, :data:`MARGIN` after the lapsing claim's lease (or at
once). The database counts as silent while a claim of this process on it lapses
(no renewal held for half its lease). Meanwhile the worker reserves no
slot for a step (:class:`StepSlots`), so it stops polling for steps once the polls
it had pending are answered, and takes none eagerly: the steps go to the workers
that can run them.

Sync activities get no client (``temporalio.activity.client()`` is for ``async def``
ones only), so the worker installs its own (:data:`completer`) and its event loop.
Without one (a worker built by other code), the thread only stops heartbeating, and
Temporal retries after ``HEARTBEAT_TIMEOUT``. A step on its activity's last attempt
is not handed back: a failure there would fail the step for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.worker import CustomSlotSupplier, SlotPermit

from ...workflows.execution.claim_keeper import claim_keeper
from .messages import VERSION_HANDBACK

logger = logging.getLogger("flowwarden_django.temporal")

#: The ``ApplicationError`` type of an attempt handed back (retried, like any other).
CLAIM_LAPSED = "ClaimLapsed"
#: The share of the lease without a renewal that held after which a step is handed back.
LAPSE_FRACTION = 0.5
#: Seconds after the claim's lease runs out at which Temporal retries a handed-back step.
MARGIN = 0.5
#: Seconds between two looks of a waiting slot reservation at the database's silence.
RECHECK_EVERY = 0.25
#: Seconds the server may take to answer the hand-back (it is reachable, or it is moot).
RPC_TIMEOUT = 5.0


class ActivityCompleter:
    """The worker's Temporal client and event loop, through which a step's thread fails
    its own attempt (installed by ``worker.serve``; thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._target: tuple[Any, asyncio.AbstractEventLoop] | None = None

    def install(self, client: Any, loop: asyncio.AbstractEventLoop) -> None:
        """Fail attempts through *client*, on *loop* (the worker's)."""
        with self._lock:
            self._target = (client, loop)

    def uninstall(self) -> None:
        """Stop: later hand-backs only stop heartbeating."""
        with self._lock:
            self._target = None

    def fail(self, task_token: bytes, error: ApplicationError) -> Future | None:
        """Fail the attempt of *task_token* with *error*, on the worker's loop; the
        call's future (it logs its own outcome), or ``None`` with no client installed."""
        with self._lock:
            target = self._target
        if target is None:
            return None
        client, loop = target
        handle = client.get_async_activity_handle(task_token=task_token)
        call = handle.fail(error, rpc_timeout=timedelta(seconds=RPC_TIMEOUT))
        try:
            future = asyncio.run_coroutine_threadsafe(call, loop)
        except RuntimeError:  # the loop is closed: the worker is gone
            call.close()
            return None
        future.add_done_callback(_log_outcome)
        return future


def _log_outcome(future: Future) -> None:
    if future.cancelled():
        return
    error = future.exception()
    if error is not None:
        # Not found: the attempt ended first (its report reached the server).
        logger.info("handing a step back to Temporal failed: %s", error)


#: This process's completer (one Temporal worker per process).
completer = ActivityCompleter()


class LapseWatch:
    """Watches the claim of run *coordination_id* (in database *using*, leased for
    *lease*) from the heartbeat thread of the step's activity, and hands the attempt
    back once the claim lapses (see the module docstring). Called on every tick of the
    thread; true once the attempt was handed back (stop heartbeating)."""

    def __init__(self, using: str, coordination_id: str, lease: timedelta) -> None:
        self.using = using
        self.coordination_id = coordination_id
        self.lease = lease.total_seconds()
        self.info = activity.info()
        self._last_attempt_said = False

    def __call__(self) -> bool:
        silent = claim_keeper.unrenewed_for(self.using, self.coordination_id)
        held = silent > 0.0
        if not held:  # no claim of its own (yet): is the database silent for others?
            silent = silent_for(self.using)
        if silent < LAPSE_FRACTION * self.lease:
            return False
        if last_attempt(self.info):
            if not self._last_attempt_said:
                self._last_attempt_said = True
                logger.warning(
                    "workflow run %s: its claim has not been renewed for %.1f s, but the "
                    "step is on its last attempt: it is not handed back",
                    self.coordination_id,
                    silent,
                )
            return False
        delay = (max(self.lease - silent, 0.0) if held else 0.0) + MARGIN
        error = ApplicationError(
            f"the run's claim has not been renewed for {silent:.1f} s (the database does "
            "not answer): the step is handed back",
            type=CLAIM_LAPSED,
            next_retry_delay=timedelta(seconds=delay),
        )
        shield_step()
        sent = completer.fail(self.info.task_token, error)
        logger.warning(
            "workflow run %s: its claim has not been renewed for %.1f s (the database does "
            "not answer); step attempt %d %s",
            self.coordination_id,
            silent,
            self.info.attempt,
            f"handed back to Temporal, retried in {delay:.1f} s"
            if sent is not None
            else "stops heartbeating (no client to hand it back through)",
        )
        return True


#: The cancellation shields of the attempts handed back. Each stays up after its
#: activity has returned (the SDK then forgets the attempt's thread): lowered while
#: the activity runs, it would raise the cancellation it held in the step's thread.
_SHIELDS: deque[Any] = deque(maxlen=256)


def shield_step() -> None:
    """Keep the SDK's cancellation of the current attempt out of the step's thread for
    the rest of the attempt (called from the heartbeat thread, which shares the
    activity's context: the shield is the attempt's, not a thread's)."""
    shield = activity.shield_thread_cancel_exception()
    shield.__enter__()
    _SHIELDS.append(shield)


def last_attempt(info: activity.Info) -> bool:
    """Whether *info*'s attempt is its activity's last (its failure is final)."""
    policy = info.retry_policy
    most = 0 if policy is None else policy.maximum_attempts
    return most > 0 and info.attempt >= most


def silent_for(using: str) -> float:
    """Seconds the longest-lapsing claim this process holds in database *using* has not
    been renewed, when one lapses (:data:`LAPSE_FRACTION`); else 0.0."""
    ages = [c.unrenewed_for() for c in claim_keeper.lapsing(LAPSE_FRACTION) if c.using == using]
    return max(ages, default=0.0)


def refuse_while_silent(using: str, coordination_id: str) -> None:
    """Refuse the current step's first attempt (``ApplicationError``) while this
    worker's database *using* is silent (see the module)."""
    silent = silent_for(using)
    info = activity.info()
    if not silent or info.attempt != 1 or last_attempt(info):
        return
    logger.warning(
        "workflow run %s: step refused: this worker's database has not answered for "
        "%.1f s; handed back to another worker",
        coordination_id,
        silent,
    )
    raise ApplicationError(
        f"this worker's database has not answered for {silent:.1f} s",
        type=VERSION_HANDBACK,
        non_retryable=True,
        category=ApplicationErrorCategory.BENIGN,
    )


def any_silent() -> bool:
    """Whether a claim of this process lapses, in any database."""
    return bool(claim_keeper.lapsing(LAPSE_FRACTION))


class StepSlots(CustomSlotSupplier):
    """The worker's *slots* activity slots, of which none is reserved while a claim of
    this process lapses (*silent*): the worker then neither polls for steps nor takes
    one eagerly. Reservations come on the worker's event loop, releases from any
    thread."""

    def __init__(self, slots: int, silent: Any = any_silent) -> None:
        self.slots = slots
        self._silent = silent
        self._lock = threading.Lock()
        self._free = slots
        self._freed: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _take(self) -> SlotPermit | None:
        if self._silent():
            return None
        with self._lock:
            if self._free <= 0:
                return None
            self._free -= 1
        return SlotPermit()

    async def reserve_slot(self, ctx: Any) -> SlotPermit:
        if self._freed is None:
            self._freed, self._loop = asyncio.Event(), asyncio.get_running_loop()
        while True:
            permit = self._take()
            if permit is not None:
                return permit
            self._freed.clear()
            # A release between _take and clear() is seen at the next look.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._freed.wait(), RECHECK_EVERY)

    def try_reserve_slot(self, ctx: Any) -> SlotPermit | None:
        return self._take()

    def mark_slot_used(self, ctx: Any) -> None:
        pass

    def release_slot(self, ctx: Any) -> None:
        with self._lock:
            self._free += 1
        freed, loop = self._freed, self._loop
        if freed is not None and loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(freed.set)
