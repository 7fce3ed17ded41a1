"""Handing free slots to the runs that wait for them (``dispatch``), and the timer
that does it when time frees one (``timer``).

``dispatch`` takes the first waiting run of a queue's partition (lowest priority
number first on a queue with priorities, then longest waiting), gives it a
concurrency slot (``next:``) and a rate slot (``paid:``) when the queue has those
limits, makes it ``running`` with one conditional ``UPDATE`` (so of two dispatchers
one wakes it) and continues it through the execution provider: in-process on this
process's dispatch threads, Celery as its next step's task, Temporal as a signal.
It goes on while slots and waiting runs remain.

It runs when a step gives a slot back, when a run starts waiting (it may have
missed the slot given back meanwhile), when a rate slot or a dead holder's lease
runs out (``timer``: the time is known from the rows), and in every recovery sweep
(``dispatch_waiting``), which covers a process that died with a timer set.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import threading
import time
from datetime import datetime, timedelta

from django.utils import timezone

from ...common.app_models import models
from ...common.connections import discard_unusable_connections
from ...common.failure_log import FailureLog
from ..runs.status import RunStatus
from . import local, slots
from .settings import QueueConfig, UnknownQueueError, queue_config
from .terms import PAY_AHEAD, paid_hold, waiting_in
from .threads import IDLE_SECONDS, DispatchThreads

logger = logging.getLogger("flowwarden_django.workflows")

#: The most runs one call hands slots to (the rest: the next call).
BATCH = 100
#: When to look again for a slot that looked free and was not taken.
RETRY_SOON = timedelta(milliseconds=20)


def dispatch(config: QueueConfig, partition: str, using: str) -> datetime | None:
    """Hand free slots of *config*'s queue (in *partition*) to its waiting runs and
    continue them; when runs still wait for a slot that time frees (a rate, a lease
    that runs out), when to try again, else ``None``."""
    if not slots.others_wait(using, config.name, partition, ""):
        return None  # the common case, in one small query
    runs = models.WorkflowRun.objects.using(using).filter(waiting_in(config, partition), runner="")
    order = ("queue_priority", "queued_at", "coordination_id")
    if not config.priority:
        order = order[1:]
    limits = {}
    if config.concurrency:
        limits[slots.CONCURRENCY] = config.concurrency
    if config.rate:
        limits[slots.RATE] = config.rate.limit
    # With a worker_concurrency, at most as many runs as this process has room for:
    # a step of this process ends first, and dispatches then (every process's sweep
    # too). Through a broker (Celery) a run may land on another worker; one that
    # lands on a full worker waits again, so this bounds the runs sent round.
    room = _room(config)
    # The waiters and the slot rows are read once for the batch (the dispatcher is one
    # thread per queue partition: each query it saves per admission is throughput).
    waiters = list(runs.order_by(*order).values_list("coordination_id", flat=True)[:BATCH])
    if not waiters:
        return None
    for kind, limit in limits.items():
        slots.ensure(using, config.name, partition, kind, limit)
    free = FreeSlots(using, config.name, partition, limits)
    for waiter in waiters:
        if room is not None and room <= 0:
            return None
        slot = paid = None
        if config.concurrency:
            slot = free.take(slots.CONCURRENCY, waiter, slots.DISPATCHED, _lease())
            if slot is None:
                return free.retry_at(slots.CONCURRENCY)
        if config.rate:
            paid = free.take(slots.RATE, waiter, slots.PAID, paid_hold(config), ahead=PAY_AHEAD)
            if paid is None:
                if slot is not None:
                    slots.release(using, slot)
                return free.retry_at(slots.RATE, ahead=PAY_AHEAD)
        woken = runs.filter(pk=waiter).update(status=RunStatus.RUNNING, updated_at=timezone.now())
        if woken != 1:  # another dispatcher woke it, or it was cancelled
            if slot is not None:
                slots.release(using, slot)
            if paid is not None:
                slots.release_paid(using, paid, paid_hold(config))
            continue
        continue_run(waiter, using)
        if room is not None:
            room -= 1
    return timezone.now()


class FreeSlots:
    """A queue partition's slot rows as last read, less the ones taken through it: a
    take tries those first, and reads the rows again before it gives up."""

    def __init__(self, using: str, queue: str, partition: str, limits: dict[str, int]) -> None:
        self.using, self.queue, self.partition, self.limits = using, queue, partition, limits
        self.rows: list[slots.SlotRow] = []
        self.fresh = False

    def read(self) -> None:
        self.rows, _ = slots.read(self.using, self.queue, self.partition, self.limits)
        self.fresh = True

    def take(
        self, kind: str, holder: str, prefix: str, hold_for: float, *, ahead: float = 0.0
    ) -> slots.SlotRow | None:
        """A slot of *kind* taken for *holder* (``slots.take``), or ``None``."""
        if not self.rows:
            self.read()
        while True:
            candidates = [row for row in self.rows if row.kind == kind]
            taken = slots.take(self.using, candidates, holder, prefix, hold_for, ahead=ahead)
            if taken is not None:
                self.rows = [row for row in self.rows if row.pk != taken.pk]
                self.fresh = False
                return taken
            if self.fresh:
                return None
            self.read()

    def retry_at(self, kind: str, *, ahead: float = 0.0) -> datetime:
        """When to try again for a slot of *kind*, after ``take`` found none."""
        return _retry_at([row for row in self.rows if row.kind == kind], ahead=ahead)


def _retry_at(rows: list[slots.SlotRow], *, ahead: float = 0.0) -> datetime:
    """When to try again for *rows*, none of which could be taken: when the first
    frees (*ahead* seconds before), or soon when one looked free (another taker won
    it, or the database's clock had not reached its end yet)."""
    frees = slots.next_free(rows)
    if frees is None:
        return timezone.now() + RETRY_SOON
    return max(frees - timedelta(seconds=ahead), timezone.now() + RETRY_SOON)


def _room(config: QueueConfig) -> int | None:
    """Steps of *config*'s queue this process may still start (``None``: no bound)."""
    if config.worker_concurrency is None:
        return None
    return config.worker_concurrency - local.running(config.name)


#: The queue partitions this process dispatches now, each with whether it is to go
#: round again (another caller asked meanwhile).
_dispatching: dict[tuple[str, str, str], bool] = {}
_dispatching_lock = threading.Lock()


def dispatch_quietly(config: QueueConfig, partition: str, using: str) -> None:
    """``dispatch``, its retry time given to the ``timer``; an error is logged (the
    timer and the recovery sweep try again).

    One call at a time per queue partition in this process: a call that comes while
    another dispatches the same partition only asks it to go round once more. Every
    run that parks or gives a slot back calls this; racing each other for the same
    waiters, the calls would mostly undo each other's work (a loaded machine then
    admitted a fraction of a 20/s rate).
    """
    key = (using, config.name, partition)
    with _dispatching_lock:
        if key in _dispatching:
            _dispatching[key] = True
            return
        _dispatching[key] = False
    try:
        while True:
            retry_at = dispatch(config, partition, using)
            if retry_at is not None:
                timer.nudge(using, config, partition, retry_at)
            with _dispatching_lock:
                if not _dispatching[key]:
                    del _dispatching[key]  # with the lock: no request falls between
                    return
                _dispatching[key] = False
    except BaseException as exc:
        with _dispatching_lock:
            del _dispatching[key]
        if not isinstance(exc, Exception):
            raise
        logger.exception(
            "queue %s: handing out slots failed; the recovery sweep tries again", config.name
        )
        discard_unusable_connections()


def dispatch_waiting(using: str) -> int:
    """Dispatch every queue partition of database *using* in which runs wait (the
    recovery sweep); the number of partitions tried."""
    waiting = (
        models.WorkflowRun.objects.using(using)
        .filter(status=RunStatus.WAITING_SLOT, runner="")
        .values_list("queue", "queue_partition")
        .distinct()
    )
    tried = 0
    for name, partition in list(waiting[:1000]):
        try:
            config = queue_config(name)
        except UnknownQueueError:
            continue  # `manage.py check` reports it (W-code); nothing can admit it here
        tried += 1
        dispatch_quietly(config, partition, using)
    return tried


# -- continuing a dispatched run -------------------------------------------------------

#: Threads that continue dispatched runs in-process (each runs one step at a time).
POOL_THREADS = 16
_pool = DispatchThreads(POOL_THREADS)


def _in_process() -> bool:
    from ..execution.providers import InProcessProvider, configured_provider

    try:
        return isinstance(configured_provider(), InProcessProvider)
    except Exception:
        return True


def continue_run(coordination_id: str, using: str) -> None:
    """Continue a dispatched run through the execution provider: with the in-process
    one (configured, or fallen back to) on a dispatch thread, never inside the step
    that gave the slot back; else at once (a Celery task is queued, a Temporal signal
    sent)."""
    from ..execution.providers import InProcessProvider, resolve_provider

    try:
        here = isinstance(resolve_provider(), InProcessProvider)
    except Exception:  # unavailable, and no fallback: the recovery sweep continues it
        logger.warning("run %s got a slot, and its provider is unavailable", coordination_id)
        return
    if here:
        _pool.submit(lambda: _continue(coordination_id, using))
    else:
        _continue(coordination_id, using)


def _continue(coordination_id: str, using: str) -> None:
    from ..definition.registry import workflow_for
    from ..execution.providers import resolve_provider
    from ..runs.records import ConcurrentRunError

    try:
        workflow = workflow_for(coordination_id, using=using, mark=False)
        resolve_provider().continue_running(workflow)
    except ConcurrentRunError:
        logger.info("run %s got a slot, and is being run elsewhere", coordination_id)
    except Exception:
        logger.exception(
            "run %s got a slot, but continuing it failed; the recovery sweep continues it",
            coordination_id,
        )


def _lease() -> float:
    from ..runs.leases import run_lease

    return run_lease().total_seconds()


# -- the timer -------------------------------------------------------------------------


class QueueTimer:
    """Dispatches a queue partition at a given time (a rate slot or a lease frees
    then): one daemon thread per process, started with the first ``nudge``."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._due: list[tuple[float, str, str, str]] = []  # (monotonic, using, queue, partition)
        self._thread: threading.Thread | None = None
        #: Set while the thread waits with nothing due (its connections closed).
        self._idle = threading.Event()
        self.failure_log = FailureLog(logger, "workflows: the queue timer")

    def nudge(self, using: str, config: QueueConfig, partition: str, at: datetime) -> None:
        """Dispatch *config*'s *partition* at *at* (wall clock)."""
        delay = max((at - timezone.now()).total_seconds(), 0.0)
        entry = (time.monotonic() + delay, using, config.name, partition)
        with self._lock:
            if any(due[1:] == entry[1:] and due[0] <= entry[0] for due in self._due):
                return
            heapq.heappush(self._due, entry)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._work, name="fw-queue-timer", daemon=True
                )
                self._thread.start()
            self._lock.notify()

    def __len__(self) -> int:
        with self._lock:
            return len(self._due)

    def clear(self, timeout: float = 30.0) -> None:
        """Forget what is due and wait until the thread is idle, its connections
        closed (tests, before the test databases go)."""
        with self._lock:
            self._due.clear()
            thread = self._thread
            self._lock.notify()
        if thread is not None and thread.is_alive():
            self._idle.wait(timeout)

    def _work(self) -> None:
        from django.db import connections

        while True:
            with self._lock:
                while not self._due:
                    connections.close_all()
                    self._idle.set()
                    self._lock.wait()
                self._idle.clear()
                wait = self._due[0][0] - time.monotonic()
                if wait > 0:
                    if wait > IDLE_SECONDS:  # a long wait: no connection kept meanwhile
                        connections.close_all()
                    self._lock.wait(timeout=wait)
                    continue
                _, using, name, partition = heapq.heappop(self._due)
                self._due = [due for due in self._due if due[1:] != (using, name, partition)]
                heapq.heapify(self._due)
            with contextlib.suppress(UnknownQueueError):  # no longer configured
                dispatch_quietly(queue_config(name), partition, using)


#: This process's queue timer.
timer = QueueTimer()
