"""The admission of each step of a queued run (``StepGate``).

Before a step of a run on a queue executes, the engine asks the gate: the step needs
a concurrency slot (when the queue has a ``concurrency``), a rate slot (``rate``) and
room in this process (``worker_concurrency``). When it gets them it runs; when it
does not, the run is let go in status ``waiting_slot`` at its head (holding no
thread, task or claim) and ``dispatch`` hands it a slot, in priority then arrival
order, when one frees up. A step that arrives while others wait joins the back of
the queue, even when a slot is free: waiting runs go first.

A concurrency slot is held while the step runs, its lease renewed with the run's
claim, and given back once the step's snapshot is saved. Between two steps the run
keeps it unless another run waits, which saves the statements of giving it back and
taking it again: within one execution (in-process), and from a step that leaves its
run running to the next step's execution (a Celery task, a Temporal activity), which
uses it without a statement when it runs in the same process while its lease has long
to run (``_kept``), and takes it again with one statement otherwise; a next step that
never comes leaves it held until its lease ends. With ``scope: "runs"`` it is held
until the run pauses or ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db import connections, transaction
from django.db.models import Q
from django.utils import timezone

from ..definition.metadata import LAST_STEP
from ..definition.results import WaitingForSlot
from ..runs.status import RunStatus
from . import local, slots
from .settings import QueueConfig, UnknownQueueError, queue_config
from .terms import PAY_AHEAD, paid_hold, rate_guard, rate_hold, waiting_in

if TYPE_CHECKING:
    from ..engine.saving import RunWriter
    from ..storage.snapshot import WorkflowSnapshot

logger = logging.getLogger("flowwarden_django.workflows")

#: When a run refused for want of room in this process is offered again.
_LOCAL_RETRY = timedelta(seconds=0.5)
_warned: set[str] = set()
#: The slots this process's executions kept for their runs' next steps, by (database,
#: run): a hint that saves that step taking its slot again when it runs here (a
#: Celery worker's next task of the run, say); elsewhere it takes it by a statement.
_kept: dict[tuple[str, str], tuple[slots.SlotRow, float]] = {}
KEPT_HINTS = 10_000
_kept_lock = threading.Lock()
#: The runs whose executions in this process hold a concurrency slot now, and how many.
_live: Counter[tuple[str, str]] = Counter()


def gate_for(execution: RunWriter) -> StepGate | None:
    """The gate of *execution*'s run, ``None`` when it is on no queue (nothing to do,
    no statement). A run on a queue no longer configured runs unlimited (logged once)."""
    name = execution.record.queue or getattr(execution.workflow, "queue", None) or ""
    if not name:
        return None
    try:
        config = queue_config(name)
    except UnknownQueueError as exc:
        if name not in _warned:
            _warned.add(name)
            logger.warning("workflow %s: %s; its steps run without limits", execution.name, exc)
        return None
    return StepGate(config, execution)


def _continued_here() -> bool:
    """Whether ``dispatch`` continues runs in this process (the in-process provider),
    where it hands a run a slot only when this process has room for its step."""
    from .dispatch import _in_process

    return _in_process()


class StepGate:
    """Admits the steps of one execution of a queued run (see the module)."""

    def __init__(self, config: QueueConfig, execution: RunWriter) -> None:
        self.config = config
        self.execution = execution
        record = execution.record
        self.partition = config.partition_of(record.queue_partition)
        self.priority = record.queue_priority if config.priority else 0
        self.using = execution.runs.db
        self.cid = execution.cid
        #: The concurrency slot this execution holds, and whether it counts locally.
        self.slot: slots.SlotRow | None = None
        self.counted = False
        #: Whether the run was parked (it then holds nothing, and dispatch ran).
        self.parked = False
        self.lease = execution.lease_seconds
        #: When the current admission began, and when the slot's lease ends (monotonic).
        self.admitted = self.slot_until = 0.0
        #: The rate slot the current admission spent, and when (monotonic), until the
        #: step begins (``step_begins``).
        self.spent: slots.SlotRow | None = None
        self.spent_at = 0.0
        self.limits: dict[str, int] = {}
        if config.concurrency:
            self.limits[slots.CONCURRENCY] = config.concurrency
        if config.rate:
            self.limits[slots.RATE] = config.rate.limit

    # -- the engine's calls ---------------------------------------------------------

    def before_step(self, head: WorkflowSnapshot) -> WaitingForSlot | None:
        """Admit the next step, or park the run and return its ``WaitingForSlot``."""
        config, using = self.config, self.using
        self.admitted = time.monotonic()
        for kind, limit in self.limits.items():
            slots.ensure(using, config.name, self.partition, kind, limit)
        holding = self.counted
        if not holding and not local.enter(config.name, config.worker_concurrency):
            if self.limits:
                # What dispatch gave the run goes back (a Celery task lands on any
                # worker, this one full): kept, it would be held idle until its lease ends.
                hold = paid_hold(config) if config.rate else None
                slots.release_dispatched(using, config.name, self.partition, self.cid, hold)
            return self._park(head, None, dispatch=False, local_full=True)
        self.counted = True
        if not self.limits:
            # Only worker_concurrency: room in this process is all there is to take
            # (runs that wait get it as this process's steps end, in no set order).
            return None
        if holding and not config.rate and (self.slot is not None or not config.concurrency):
            # Between two steps, holding what it needs: it only makes way for a waiting
            # run. One small query, not a read of every slot row.
            if not config.holds_runs and self._others_wait():
                return self._park(head, None)
            return None
        if config.concurrency and not config.rate and not config.holds_runs and self.slot is None:
            # The slot this process's previous execution of the run kept for this step
            # (``close``, which saw nobody waiting): while its lease has long to run (the
            # claim keeper renews it from a third of the lease on), it is still its own.
            with _kept_lock:
                kept = _kept.pop((using, self.cid), None)
                nested = _live[using, self.cid] > 0
            if kept is not None and time.monotonic() < kept[1] - self.lease / 2:
                self._hold(*kept)
                return None
            # The common admission in one statement (PostgreSQL); else read and decide.
            slot = slots.take_first(
                using,
                config.name,
                self.partition,
                config.concurrency,
                self.cid,
                self.lease,
                adopt_kept=not nested,
            )
            if slot is not None:
                self._hold(slot)
                return None
        rows, waits = slots.read(
            using,
            config.name,
            self.partition,
            self.limits,
            waiting_in(config, self.partition) & ~Q(pk=self.cid),
        )
        now = timezone.now()
        conc = [row for row in rows if row.kind == slots.CONCURRENCY]
        rate = [row for row in rows if row.kind == slots.RATE]
        paid = next((row for row in rate if row.held_by(self.cid, slots.PAID, now)), None)
        kept = None
        with _kept_lock:
            nested = _live[using, self.cid] > 0
        # (An execution of the run open in this thread's stack, a parent its children
        # continued in-process, holds its own slot: this one takes another.)
        if not config.holds_runs and self.slot is None and not nested:
            # The slot its previous step kept for it (``close``): it makes way for a
            # waiting run, else it is this step's.
            kept = next((row for row in conc if row.held_by(self.cid, slots.RUNNING, now)), None)
            if kept is not None and waits:
                slots.release(using, kept)
                kept = None
        given = (
            self.slot
            or next((row for row in conc if row.held_by(self.cid, self._own_prefix(), now)), None)
            or kept
        )
        if waits and not holding and given is None and paid is None:
            return self._park(head, None)
        if holding and waits and not config.holds_runs:
            return self._park(head, None)  # between two steps: a waiting run goes first
        if config.concurrency and self.slot is None:
            slot = None
            if given is not None:
                hold = slots.Hold(self.cid, slots.RUNNING, self.lease)
                slot = slots.claim(using, given, hold, must_be_free=False)
            if slot is None:
                slot = slots.take(using, conc, self.cid, slots.RUNNING, self.lease)
            if slot is None:
                return self._park(head, slots.next_free(conc, now))
            self._hold(slot)
        if config.rate:
            spent = None
            if paid is not None:
                # Paid ahead: its use begins when the slot freed (a short pause, at
                # most terms.PAY_AHEAD, when this run got going sooner).
                begins = slots.paid_from(paid, paid_hold(config))
                early = 0.0 if begins is None else (begins - timezone.now()).total_seconds()
                if 0 < early <= PAY_AHEAD:
                    time.sleep(early)
                hold = slots.Hold(self.cid, slots.USED, rate_hold(config))
                spent_at = time.monotonic()
                spent = slots.claim(using, paid, hold, must_be_free=False, no_sooner=True)
            if spent is None:
                spent_at = time.monotonic()
                spent = slots.take(using, rate, self.cid, slots.USED, rate_hold(config))
            if spent is None:
                return self._park(head, slots.next_free(rate, now))
            # Measured from before the statement that held it (by the database's clock).
            self.spent, self.spent_at = spent, spent_at
        return None

    def step_begins(self) -> None:
        """The admitted step's code begins now. Its rate slot was held from the
        admission for the period and a guard; when the step got going later than the
        guard (a loaded process), the slot is held for the period from now instead, so
        that the slot's next step cannot begin within a period of this one."""
        spent, self.spent = self.spent, None
        if spent is None:
            return
        if time.monotonic() - self.spent_at > rate_guard(self.config):
            slots.hold_from_now(self.using, spent, rate_hold(self.config))

    def close(self, status: str) -> None:
        """The execution ends with the run in *status*: give back what it holds (with
        ``scope: "runs"``, the slot only once the run leaves ``running``), then hand
        free slots to waiting runs. Never raises."""
        if self.parked:
            return
        keep = self.config.holds_runs and status == RunStatus.RUNNING
        try:
            if not keep and status == RunStatus.RUNNING and self.slot is not None:
                # Left running, it continues in its next execution at once (the next
                # step's task or activity): it keeps its slot for it unless a run waits
                # (then that run goes first), which saves this step giving it back and
                # dispatching, and the next taking one. A next step that never comes
                # leaves it held until its lease ends.
                keep = not self._others_wait()
            self._let_go(keep=keep)
        except Exception:
            logger.exception(
                "queue %s: giving back a slot failed; its lease frees it", self.config.name
            )
        if not keep:
            self._dispatch_later()

    # -- parts ----------------------------------------------------------------------

    def _others_wait(self) -> bool:
        return slots.others_wait(self.using, self.config.name, self.partition, self.cid)

    def _own_prefix(self) -> str:
        # A slot dispatch gave this run, or (scope "runs") the one its last step held.
        return slots.DISPATCHED if not self.config.holds_runs else ""

    def _hold(self, slot: slots.SlotRow, until: float | None = None) -> None:
        if self.slot is None:
            with _kept_lock:
                _live[self.using, self.cid] += 1
        self.slot = slot
        # When its lease ends at the latest (monotonic): measured from before the
        # statement that took it, which set it from the database's clock.
        self.slot_until = self.admitted + self.lease if until is None else until
        claim = self.execution.claim
        claim.also_renew = self._renew

    def _renew(self) -> None:
        slot = self.slot
        sent = time.monotonic()
        if slot is not None and slots.renew(self.using, slot, self.lease):
            self.slot_until = sent + self.lease
        elif slot is not None:
            logger.warning(
                "queue %s: run %s lost its slot (its lease ran out)", self.config.name, self.cid
            )
            self.slot = None
            self._unlive()

    def _unlive(self) -> None:
        with _kept_lock:
            _live[self.using, self.cid] -= 1
            if _live[self.using, self.cid] <= 0:
                del _live[self.using, self.cid]

    def _let_go(self, *, keep: bool = False) -> None:
        slot, self.slot = self.slot, None
        if slot is not None:
            self._unlive()
        self.execution.claim.also_renew = None
        if self.counted:
            self.counted = False
            local.leave(self.config.name)
        if slot is not None and keep and not self.config.holds_runs:
            with _kept_lock:
                if len(_kept) >= KEPT_HINTS:  # runs that never came back: the oldest go
                    del _kept[next(iter(_kept))]
                _kept[self.using, self.cid] = (slot, self.slot_until)
        if slot is not None and not keep:
            slots.release(self.using, slot)

    def _park(
        self,
        head: WorkflowSnapshot,
        retry_at: datetime | None,
        *,
        dispatch: bool = True,
        local_full: bool = False,
    ) -> WaitingForSlot:
        """Let go of the run in ``waiting_slot`` and of the slots it holds."""
        from .dispatch import timer

        self.parked = True
        self._let_go()
        record, config = self.execution.record, self.config
        # A run keeps its place from the first time it waited in this queue.
        waited = record.queued_at if record.queue == config.name else None
        queued_at = waited or timezone.now()
        self.execution.finish(
            status=RunStatus.WAITING_SLOT,
            head_snapshot_id=head.id,
            queue=config.name,
            queue_partition=self.partition,
            queue_priority=self.priority,
            queued_at=queued_at,
        )
        record.status, record.queued_at = RunStatus.WAITING_SLOT, queued_at
        if local_full and _continued_here():
            # Room in this process comes back when one of its steps ends (which hands
            # slots out); another process may have room now. (A run continued through
            # a broker lands on any worker: a timer here would send it round and round
            # while the workers are full; the next step end or sweep dispatches it.)
            retry_at = timezone.now() + _LOCAL_RETRY
        if dispatch:
            self._dispatch_later()
        if retry_at is not None:
            timer.nudge(self.using, config, self.partition, retry_at)
        return WaitingForSlot(
            head.state, self.cid, head.metadata.get(LAST_STEP, ""), queue=config.name
        )

    def _dispatch_later(self) -> None:
        """Hand free slots to waiting runs once what this execution wrote commits."""
        from .dispatch import dispatch_quietly

        args = (self.config, self.partition, self.using)
        if connections[self.using].in_atomic_block:
            transaction.on_commit(lambda: dispatch_quietly(*args), using=self.using)
        else:
            dispatch_quietly(*args)
