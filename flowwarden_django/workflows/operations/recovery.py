"""The recovery sweep: find running workflow runs that nothing is advancing.

A run stalls when the chain that moves it breaks: the process running a step died
(its claim is left behind, and no longer renewed: ``workflows.claim_keeper``), or the
next step's task was never published or was lost by the broker (the run is
``running`` and unclaimed). A stalled run is one with status ``running`` and either

* a claim whose lease has run out: its runner stopped renewing it, so it is dead
  (or has lost its database); taken at once, or
* no claim, and no change for *older_than* (by default ``WORKFLOW_RECOVER_AFTER``,
  10 s: a queued step usually starts much sooner, and a duplicate of a step that was
  only slow to start does nothing). A runner that lost its database lets go of its
  claim as soon as the database answers again (``workflows.releases``), without
  touching ``updated_at``, so the next sweep takes the run.

``recover_stalled_runs(enqueue)`` hands each stalled run to *enqueue* (which queues
its next step, or runs it) and returns their coordination ids. It is idempotent:
before handing a run over, it moves the run's ``updated_at`` with one conditional
``UPDATE`` (which also checks that the claim is still expired), so a concurrent or
repeated sweep skips it for another *older_than*; and a step task that finds the run
already moved on does nothing, so a run that was not stalled after all loses nothing.
When queueing fails (the broker is still down), the run gets its ``updated_at`` back,
so the next sweep takes it again at once, not after another *older_than*.
Each sweep also sends the approvals' due reminders and escalations
(``waiting.approvals.reminders``). It also wakes paused runs whose wait is over: a
sleeping run at its ``wake_at``, a run waiting for a message past its deadline
(``wake_at``) or whose mailbox holds one (its wake after the send was lost), a
parent whose children have all finished.
Hibernated, waiting (for an approval), completed and failed runs are never touched.

Where it runs: every Celery worker runs it every ``WORKFLOW_SWEEP_INTERVAL`` (2 s)
when the provider is Celery, ``flowwarden_temporal_worker`` does too, and
``manage.py flowwarden_workflows recover --every 2s`` does it for in-process runs.
The workers, and the command without ``--database``, sweep every database a defined
workflow keeps its runs in (``recover_in_every_database``), not only the router's
default; so does the approval sweep (``approvals.sweep``), through
``definition.databases``.
This module knows nothing of Celery: ``flowwarden_django.integrations.celery`` passes
the function that queues a step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils import timezone

from ...common.app_models import models
from ...conf import fw_settings
from ..definition.databases import in_every_workflow_database
from ..definition.metadata import LAST_STEP, NEXT_STEP
from ..definition.registry import workflow_registry
from ..runs.records import RunRecords, RunStatus, recover_after, unclaimed
from ..storage.snapshot import CheckpointQuery
from ..waiting.approvals.notifications import deliver_pending
from ..waiting.approvals.reminders import remind_and_escalate_due
from ..waiting.children import parents_ready
from ..waiting.messages.mailbox import runs_with_mail

if TYPE_CHECKING:
    from ...models import WorkflowRun

logger = logging.getLogger("flowwarden_django.workflows")


def stalled_runs(
    *, older_than: timedelta | None = None, using: str | None = None, limit: int | None = 100
) -> list[WorkflowRun]:
    """Running runs without a live claim and unchanged for *older_than*, oldest first
    (at most *limit*)."""
    age = recover_after() if older_than is None else older_than
    if age < timedelta(0):
        raise ValueError(f"older_than must be >= 0, not {age!r}")
    idle = (Q(runner="") | Q(claimed_until__isnull=True)) & Q(updated_at__lte=timezone.now() - age)
    rows = (
        models.WorkflowRun.objects.using(RunRecords(using).db)
        .filter(idle | _expired_claim(), status=RunStatus.RUNNING)
        .order_by("updated_at", "coordination_id")
    )
    stalled = list(rows if limit is None else rows[:limit])
    room = None if limit is None else limit - len(stalled)
    if room != 0:
        stalled += due_sleepers(using=using, limit=room)
    room = None if limit is None else limit - len(stalled)
    if room != 0:
        stalled += parents_ready(using=using, limit=room)
    room = None if limit is None else limit - len(stalled)
    if room != 0:
        stalled += runs_with_mail(using=using, limit=room)
    return stalled


def due_sleepers(*, using: str | None = None, limit: int | None = 100) -> list[WorkflowRun]:
    """Sleeping runs whose wake time has come (by the database's clock), and runs
    waiting for a message past their deadline, earliest first (at most *limit*): the
    sweep continues them as it does stalled runs."""
    rows = (
        models.WorkflowRun.objects.using(RunRecords(using).db)
        .filter(status__in=WAKING, wake_at__lte=Now(), runner="")
        .order_by("wake_at", "coordination_id")
    )
    return list(rows if limit is None else rows[:limit])


#: Paused statuses the sweep wakes at ``wake_at`` (``due_sleepers``).
WAKING = (RunStatus.SLEEPING, RunStatus.WAITING_MESSAGE)
#: Paused statuses the sweep wakes (``stalled_runs``).
WOKEN = (RunStatus.SLEEPING, RunStatus.WAITING_CHILDREN, RunStatus.WAITING_MESSAGE)


def _why_woken(run: WorkflowRun) -> str:
    if run.status == RunStatus.WAITING_CHILDREN:
        return "its children have finished"
    due = run.wake_at is not None and run.wake_at <= timezone.now()
    if run.status == RunStatus.SLEEPING or due:
        return f"due at {run.wake_at.isoformat() if run.wake_at else '?'}"
    return f"a message on {run.waiting_topic!r} came"


def _expired_claim() -> Q:
    """A claim its runner stopped renewing: the runner is dead (or has no database)."""
    return ~Q(runner="") & Q(claimed_until__lt=Now())


def wake_due_run(coordination_id: str, *, using: str | None = None) -> bool:
    """Make run *coordination_id* ``running`` if it sleeps (or waits for a message),
    unclaimed, and its wake time (deadline) has come, by the database's clock: one
    conditional ``UPDATE``; True if it did. Whoever called continues it (Temporal's
    timer: the workflow's next step, which finds no message after a wait that timed
    out)."""
    rows = models.WorkflowRun.objects.using(RunRecords(using).db).filter(
        pk=coordination_id, status__in=WAKING, wake_at__lte=Now(), runner=""
    )
    return rows.update(status=RunStatus.RUNNING, wake_at=None, updated_at=timezone.now()) == 1


class _UndefinedWorkflowLog:
    """Logs a stalled run whose workflow this process does not define once per run
    and state (its head and claim), not on every sweep."""

    #: How many (run, state) pairs are remembered (the oldest are forgotten first).
    size = 1000

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str | None, str], None] = {}

    def warn(self, run: WorkflowRun) -> None:
        key = (run.coordination_id, run.head_snapshot_id, run.runner)
        if key in self._seen:
            return
        self._seen[key] = None
        while len(self._seen) > self.size:
            self._seen.pop(next(iter(self._seen)))
        logger.warning(
            "workflow run %s is stalled, but version %d of its workflow %r is not defined "
            "in this process; not recovering it here (logged once for this run and state)",
            run.coordination_id,
            run.workflow_version,
            run.workflow_name,
        )


_undefined = _UndefinedWorkflowLog()


def last_step_of(run: WorkflowRun) -> str:
    """The last completed step of *run*, from its newest snapshot: the run record
    catches up with plain steps only now and then (see the engine's ``_save_step``)."""
    return position_of(run)[0]


def position_of(run: WorkflowRun) -> tuple[str, str]:
    """Where *run* stands, from its newest snapshot: its last completed step, and the
    step that step jumped to (``""``: none, the run continues at the step after it;
    see ``definition.graph``). The run record knows only the first, and catches up
    with plain steps only now and then (see the engine's ``_save_step``)."""
    # The newest snapshot's position and metadata only: its state is not needed here.
    cid = run.coordination_id
    query = CheckpointQuery.for_coordination(cid, newest_first=True, limit=1, with_state=False)
    try:
        definition = workflow_registry.get(run.workflow_name, run.workflow_version)
        heads = definition.workflow(cid).store.list(query)
    except Exception:  # an unknown workflow or an unreadable store: the record's word
        return run.last_step, ""
    if not heads:
        return run.last_step, ""
    return heads[0].metadata.get(LAST_STEP, run.last_step), heads[0].metadata.get(NEXT_STEP, "")


def recover_in_every_database(
    enqueue: Callable[[WorkflowRun], None],
    *,
    older_than: timedelta | None = None,
    limit: int | None = 100,
) -> list[str]:
    """``recover_stalled_runs`` in each of ``workflow_databases()`` (at most *limit*
    runs from each); the coordination ids handed over. A database that fails (is
    down, say) does not keep the others from being swept: its error is raised once
    they were."""
    swept = in_every_workflow_database(
        lambda db: recover_stalled_runs(enqueue, older_than=older_than, using=db, limit=limit)
    )
    return [cid for recovered in swept for cid in recovered]


def recover_stalled_runs(
    enqueue: Callable[[WorkflowRun], None],
    *,
    older_than: timedelta | None = None,
    using: str | None = None,
    limit: int | None = 100,
) -> list[str]:
    """Call *enqueue(run)* for each stalled run of a workflow this process knows
    (``workflow_registry``); the coordination ids handed over, in order.

    A run another sweep (or a runner) touched since it was read is skipped. An
    exception from *enqueue* propagates, and the run gets its ``updated_at`` back (if
    nothing touched it meanwhile), so the next sweep tries it again at once.
    """
    db = RunRecords(using).db
    if fw_settings.WORKFLOW_QUEUES:
        # Runs waiting for a slot a dead process's timer would have handed them.
        from ..queues.dispatch import dispatch_waiting

        dispatch_waiting(db)
    _remind_and_escalate(db)
    recovered: list[str] = []
    for run in stalled_runs(older_than=older_than, using=using, limit=limit):
        if not workflow_registry.defines(run.workflow_name, run.workflow_version):
            _undefined.warn(run)
            continue
        # A due sleeper, a parent whose children have all finished, or a run whose
        # message came (or whose wait for one timed out): woken.
        sleeping = run.status in WOKEN
        unchanged = {"pk": run.pk, "status": run.status, "runner": run.runner}
        taken_at = timezone.now()
        # Still unclaimed, or its claim still expired: a runner that renewed it meanwhile
        # (it had only lost its database for a while) keeps its run.
        claimed = models.WorkflowRun.objects.using(db).filter(
            unclaimed(), **unchanged, updated_at=run.updated_at
        )
        # A dead runner's claim is ended here: the run is unclaimed from now on, so the
        # next sweep leaves it for another older_than (and the runner, were it alive
        # after all, gets LeaseLostError at its next write).
        taken = {"updated_at": taken_at, "runner": "", "claimed_until": None}
        if sleeping:
            # Woken: a running run from now on, which the sweep recovers as any other
            # (a step task of its own that never came is queued again).
            moved = claimed.filter(head_snapshot_id=run.head_snapshot_id).update(
                **taken, status=RunStatus.RUNNING, wake_at=None
            )
        else:
            moved = claimed.update(**taken, attempts=F("attempts") + 1)
        if moved != 1:
            continue
        if sleeping:
            logger.info(
                "workflow %s (%s) woke after step %r (%s); queueing its next step",
                run.workflow_name,
                run.coordination_id,
                run.last_step,
                _why_woken(run),
            )
            run.status = RunStatus.RUNNING
        else:
            logger.warning(
                "workflow %s (%s) stalled after step %r%s; queueing its next step",
                run.workflow_name,
                run.coordination_id,
                last_step_of(run),
                f" (runner {run.runner} did not finish it)" if run.runner else "",
            )
        try:
            enqueue(run)
        except Exception:
            back = {**unchanged, "runner": "", "status": RunStatus.RUNNING}
            _give_back(db, back, taken_at, run.updated_at)
            raise
        recovered.append(run.coordination_id)
    return recovered


def _remind_and_escalate(db: str) -> None:
    """The approvals' due reminders and escalations, and notifications left
    undelivered (``waiting.approvals.reminders``); a failure is logged, and the
    recovery goes on."""
    try:
        remind_and_escalate_due(db)
        deliver_pending(using=db)
    except Exception:
        logger.exception("workflow recovery: approval reminders and escalations failed")


def _give_back(
    db: str, unchanged: dict[str, Any], taken_at: datetime, updated_at: datetime
) -> None:
    """Put back the ``updated_at`` of a run the sweep took but could not hand over (the
    broker or the database is down), if nothing touched the run since: the next sweep
    then takes it at once instead of after another *older_than*. Never raises."""
    try:
        models.WorkflowRun.objects.using(db).filter(**unchanged, updated_at=taken_at).update(
            updated_at=updated_at
        )
    except Exception:  # the database is down too: the run waits for another older_than
        logger.debug("workflow recovery: giving back a run failed", exc_info=True)
