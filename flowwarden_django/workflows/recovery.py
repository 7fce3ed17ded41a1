"""The recovery sweep: find running workflow runs that nothing is advancing.

An asynchronous execution provider (Celery) keeps a run moving by queueing one task
per step. A run stalls when that chain breaks: the worker running a step died (its
claim on the run is left behind until the lease ends), or the next step's task was
never published or was lost by the broker (the run is ``running`` and unclaimed). A
stalled run is one with status ``running``, no live claim (no runner, or a lease that
has ended) and no change for *older_than* (by default ``WORKFLOW_RECOVER_AFTER``,
10 s: a queued step usually starts much sooner, and a duplicate of a step that was
only slow to start does nothing). The run's state says it, not the lease alone: a
runner that lost its database lets go of its claim as soon as the database answers
again (``workflows.releases``), without touching ``updated_at``, so the next sweep
takes the run. Only a runner that died holding its claim keeps the run until the
claim's lease (``WORKFLOW_RUN_LEASE``) ends.

``recover_stalled_runs(enqueue)`` hands each stalled run to *enqueue* (which queues
its next step) and returns their coordination ids. It is idempotent: before queueing,
it moves the run's ``updated_at`` with one conditional ``UPDATE``, so a concurrent or
repeated sweep skips it for another *older_than*; and a step task that finds the run
already moved on does nothing, so a run that was not stalled after all loses nothing.
When queueing fails (the broker is still down), the run gets its ``updated_at`` back,
so the next sweep takes it again at once, not after another *older_than*.
Hibernated, waiting, completed and failed runs are never touched.

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

from ..common.app_models import models
from .metadata import LAST_STEP
from .registry import workflow_registry
from .runs import RunRecords, RunStatus, recover_after
from .snapshot import CheckpointQuery

if TYPE_CHECKING:
    from ..models import WorkflowRun

logger = logging.getLogger("flowwarden_django.workflows")


def stalled_runs(
    *, older_than: timedelta | None = None, using: str | None = None, limit: int | None = 100
) -> list[WorkflowRun]:
    """Running runs without a live claim and unchanged for *older_than*, oldest first
    (at most *limit*)."""
    age = recover_after() if older_than is None else older_than
    if age < timedelta(0):
        raise ValueError(f"older_than must be >= 0, not {age!r}")
    unclaimed = Q(runner="") | Q(claimed_until__isnull=True) | Q(claimed_until__lt=Now())
    rows = (
        models.WorkflowRun.objects.using(RunRecords(using).db)
        .filter(unclaimed, status=RunStatus.RUNNING, updated_at__lte=timezone.now() - age)
        .order_by("updated_at", "coordination_id")
    )
    return list(rows if limit is None else rows[:limit])


def last_step_of(run: WorkflowRun) -> str:
    """The last completed step of *run*, from its newest snapshot: the run record
    catches up with plain steps only now and then (see the engine's ``_save_step``)."""
    # The newest snapshot's position and metadata only: its state is not needed here.
    query = CheckpointQuery.for_coordination(run.pk, newest_first=True, limit=1, with_state=False)
    try:
        heads = workflow_registry.get(run.workflow_name).workflow(run.pk).store.list(query)
    except Exception:  # an unknown workflow or an unreadable store: the record's word
        return run.last_step
    return heads[0].metadata.get(LAST_STEP, run.last_step) if heads else run.last_step


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
    recovered: list[str] = []
    for run in stalled_runs(older_than=older_than, using=using, limit=limit):
        if run.workflow_name not in workflow_registry:
            logger.warning(
                "workflow run %s is stalled, but its workflow %r is not defined in this "
                "process; not recovering it",
                run.coordination_id,
                run.workflow_name,
            )
            continue
        unchanged = {"pk": run.pk, "status": RunStatus.RUNNING, "runner": run.runner}
        taken_at = timezone.now()
        claimed = models.WorkflowRun.objects.using(db).filter(
            **unchanged, updated_at=run.updated_at
        )
        if claimed.update(updated_at=taken_at, attempts=F("attempts") + 1) != 1:
            continue
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
            _give_back(db, unchanged, taken_at, run.updated_at)
            raise
        recovered.append(run.coordination_id)
    return recovered


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
