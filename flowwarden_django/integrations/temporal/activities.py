"""The activities of the Temporal workflow: one engine step, an approval's expiry, and
a run's status. They run in ``flowwarden_temporal_worker`` processes, in a thread pool,
against the Django database; each returns a ``RunReport`` of where the run stands."""

from __future__ import annotations

import contextvars
import logging
import threading
from datetime import timedelta
from typing import Any

from django.db import close_old_connections
from django.db.models import Q
from django.utils import timezone
from temporalio import activity
from temporalio.exceptions import ApplicationError

from ...common.app_models import models
from ...workflows.approvals.sweep import expire_due_approvals
from ...workflows.engine import StepAttemptFailed, Workflow
from ...workflows.registry import RegisteredWorkflow, workflow_registry
from ...workflows.runs import ConcurrentRunError, LeaseLostError, RunRecords, RunStatus, run_lease
from ...workflows.steps import WorkflowStep
from .messages import (
    EXPIRE_ACTIVITY,
    STATUS_ACTIVITY,
    STEP_ACTIVITY,
    RunReport,
    StepPolicy,
    StepRequest,
)

logger = logging.getLogger("flowwarden_django.temporal")


class StaleStep(Exception):
    """The run is not ``running`` and the step was not asked for by ``run()``: a paused
    or finished run is continued only by a wake."""


class _ActivityWorkflow(Workflow):
    """The workflow a step activity runs: its claim also checks that the step is wanted."""

    def __init__(self, definition: RegisteredWorkflow, coordination_id: str, origin: str):
        super().__init__(
            definition.name,
            coordination_id,
            definition.steps,
            definition.store,
            using=definition.using,
        )
        self.origin = origin

    def _claim(self, runs: RunRecords, token: str, lease: Any, input: Any) -> Any:
        # One statement: a paused or finished run is claimed only by a "run" wake, and
        # the input is stored with the claim.
        cid = self.coordination_id
        wanted = None if self.origin == "run" else Q(status=RunStatus.RUNNING)
        try:
            return runs.claim(
                cid, token, lease, resume_input=input, workflow_name=self.name, where=wanted
            )
        except ConcurrentRunError:
            current = runs.get(cid)  # refused: say why
            if wanted is not None and current is not None and current.status != RunStatus.RUNNING:
                raise StaleStep(f"the run is {current.status}") from None
            raise


def next_step(steps: tuple[WorkflowStep, ...], last_step: str) -> WorkflowStep | None:
    """The step after *last_step* (the first when it is ``""`` or unknown)."""
    names = [s.name for s in steps]
    if last_step not in names:
        return steps[0] if steps else None
    index = names.index(last_step) + 1
    return steps[index] if index < len(steps) else None


def policy_of(current: WorkflowStep | None) -> StepPolicy | None:
    """The activity options of *current*: its retries, their delay and its timeout."""
    if current is None:
        return None
    return StepPolicy(current.max_retries, float(current.retry_delay or 0), current.timeout)


def report(definition: RegisteredWorkflow, coordination_id: str, detail: str = "") -> RunReport:
    """Where run *coordination_id* stands now, read from its record."""
    record = RunRecords(definition.using).get(coordination_id)
    if record is None:
        return RunReport(status="failed", detail=f"no workflow run {coordination_id!r}")
    expires_at = None
    if record.status == RunStatus.WAITING:
        approval = (
            models.Approval.objects.using(RunRecords(definition.using).db)
            .filter(
                coordination_id=coordination_id,
                status=models.Approval.Status.PENDING,
                expires_at__isnull=False,
            )
            .order_by("expires_at")
            .first()
        )
        if approval is not None:
            expires_at = approval.expires_at.isoformat()
    last_step = record.last_step or ""
    return RunReport(
        status=record.status,
        last_step=last_step,
        next_policy=policy_of(next_step(definition.steps, last_step)),
        expires_at=expires_at,
        detail=detail,
    )


class _Heartbeats:
    """Heartbeats the current activity every *interval* seconds while the step runs,
    so that Temporal notices a dead worker within the heartbeat timeout."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        context = contextvars.copy_context()  # the activity's context, for heartbeat()
        self._thread = threading.Thread(
            target=context.run, args=(self._beat,), name="flowwarden-heartbeat", daemon=True
        )

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            activity.heartbeat()

    def __enter__(self) -> _Heartbeats:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _definition(name: str) -> RegisteredWorkflow:
    try:
        return workflow_registry.get(name)
    except LookupError as exc:
        raise ApplicationError(str(exc), type="LookupError", non_retryable=True) from exc


@activity.defn(name=STEP_ACTIVITY)
def run_step(request: StepRequest) -> RunReport:
    """Execute one step of the run (one attempt of it: Temporal schedules the retries)."""
    close_old_connections()
    try:
        return _run_step(request)
    finally:
        close_old_connections()


def _run_step(request: StepRequest) -> RunReport:
    definition = _definition(request.workflow)
    cid = request.coordination_id
    wf = _ActivityWorkflow(definition, cid, request.origin)
    info = activity.info()
    heartbeat = (info.heartbeat_timeout or timedelta(seconds=10)).total_seconds() / 3
    try:
        with _Heartbeats(max(heartbeat, 0.2)):
            result = wf.run_local(input=request.input, max_steps=1, attempt=info.attempt)
    except StaleStep as exc:
        logger.info("workflow %s (%s): step not run: %s", wf.name, cid, exc)
        return report(definition, cid, str(exc))
    except StepAttemptFailed as exc:
        raise ApplicationError(
            str(exc),
            type="StepAttemptFailed",
            next_retry_delay=timedelta(seconds=exc.retry_delay) if exc.retry_delay else None,
        ) from exc
    except ConcurrentRunError as exc:
        if isinstance(exc, LeaseLostError) or exc.claimed_until is None:
            return report(definition, cid, str(exc))
        # The holder may be a killed worker: try again once its claim is over.
        remaining = (exc.claimed_until - timezone.now()).total_seconds()
        delay = min(max(remaining, 0.0), run_lease().total_seconds()) + 0.5
        raise ApplicationError(
            str(exc), type="ConcurrentRunError", next_retry_delay=timedelta(seconds=delay)
        ) from exc
    outcome = report(definition, cid)
    logger.info(
        "workflow %s (%s): step %s done (attempt %d), run %s",
        wf.name,
        cid,
        outcome.last_step or "-",
        info.attempt,
        result.status,
    )
    return outcome


@activity.defn(name=EXPIRE_ACTIVITY)
def expire_approval(request: StepRequest) -> RunReport:
    """Expire the run's approval once it is due (the timer fired); idempotent, like the
    sweep it stands in for. The expiry continues the run through the provider."""
    close_old_connections()
    try:
        definition = _definition(request.workflow)
        db = RunRecords(definition.using).db
        expired = expire_due_approvals(using=db, coordination_id=request.coordination_id)
        if expired:
            logger.info("workflow run %s: approval %s expired", request.coordination_id, expired[0])
        return report(definition, request.coordination_id)
    finally:
        close_old_connections()


@activity.defn(name=STATUS_ACTIVITY)
def run_status(request: StepRequest) -> RunReport:
    """Where the run stands (after a fork, say)."""
    close_old_connections()
    try:
        return report(_definition(request.workflow), request.coordination_id)
    finally:
        close_old_connections()


ACTIVITIES = (run_step, expire_approval, run_status)
