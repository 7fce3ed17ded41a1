"""The activities of the Temporal workflow: one engine step, an approval's expiry, and
a run's status. They run in ``flowwarden_temporal_worker`` processes, in a thread pool,
against the Django database; each returns a ``RunReport`` of where the run stands."""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import close_old_connections
from django.utils import timezone
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from ...common.app_models import models
from ...common.user_input import UserJSONError, check_resume_input
from ...workflows.definition.registry import (
    RegisteredWorkflow,
    VersionNotDefinedError,
    workflow_registry,
)
from ...workflows.definition.results import Running, WaitingForSlot, WorkflowResult
from ...workflows.definition.steps import step_after
from ...workflows.engine.calling import StepAttemptFailed
from ...workflows.execution.handoff import Handoff, taken_from
from ...workflows.operations.recovery import position_of, wake_due_run
from ...workflows.operations.schedule_ticks import interval_tick, late, start_for_tick
from ...workflows.runs.records import (
    ConcurrentRunError,
    LeaseLostError,
    RunRecords,
    RunStatus,
    RunVersionError,
    new_handoff_token,
    run_lease,
)
from ...workflows.waiting.approvals.reminders import next_due_at, remind_and_escalate_due
from ...workflows.waiting.approvals.sweep import expire_due_approvals
from ..remote_steps import RemoteStepWorkflow
from .config import TemporalConfig
from .handback import LapseWatch, refuse_while_silent
from .messages import (
    EXPIRE_ACTIVITY,
    INPUT_REFUSED,
    SCHEDULED_START_ACTIVITY,
    STATUS_ACTIVITY,
    STEP_ACTIVITY,
    VERSION_HANDBACK,
    RunReport,
    ScheduledStart,
    StepPolicy,
    StepRequest,
)
from .policies import policy_of

logger = logging.getLogger("flowwarden_django.temporal")

#: Paused statuses whose ``wake_at`` the workflow waits for on a durable timer: a
#: sleep, and a wait for a message with a timeout (``expire_approval`` wakes them).
TIMED = (RunStatus.SLEEPING, RunStatus.WAITING_MESSAGE)
#: Seconds between two looks of a step's heartbeat thread at its run's claim.
WATCH_EVERY = 0.25


class StaleStep(Exception):
    """The run is not ``running`` and the step was not asked for by ``run()``: a paused
    or finished run is continued only by a wake."""


class _ActivityWorkflow(RemoteStepWorkflow):
    """The workflow a step activity runs: its claim also checks that the step is wanted."""

    executed_by = "temporal"
    stale_error = StaleStep

    def run(self, initial_state: Any = None) -> WorkflowResult:
        """The run was woken while this activity ran its step: a wait for a message
        found one in the mailbox (``waiting.messages``: the runner looks once the wait
        is persisted). The wake made the run ``running``, and this activity's report
        says so, so the Temporal workflow runs the next step at once: no signal to the
        run's own workflow, no second activity. Runs nothing here."""
        return self.current_result() or Running(initial_state, self.coordination_id, "")


def _local_activity_timeout() -> float:
    return TemporalConfig.from_settings().local_activity_timeout


def next_policy(
    definition: RegisteredWorkflow, last_step: str, next_step: str = ""
) -> StepPolicy | None:
    """How the step after *last_step* (or *next_step*, when *last_step* jumped there)
    is scheduled (``policies``)."""
    step = step_after(definition.steps, last_step, next_step)
    return policy_of(step, _local_activity_timeout())


def report(
    definition: RegisteredWorkflow,
    coordination_id: str,
    detail: str = "",
    hands_to: str | None = None,
) -> RunReport:
    """Where run *coordination_id* stands now, read from its record; with the
    hand-off (its token only) when the run is held under *hands_to*: an earlier copy
    of the step saved and handed it on."""
    record = RunRecords(definition.using).get(coordination_id)
    if record is None:
        return RunReport(status="failed", detail=f"no workflow run {coordination_id!r}")
    handoff = None
    if hands_to is not None and record.runner == hands_to:
        held = Handoff(coordination_id, hands_to, record.workflow_version, time.time())
        handoff = held.as_dict()
    expires_at = None
    if record.status == RunStatus.WAITING:
        # The approval's next due time: its expiry, next reminder or escalation (the
        # workflow's durable timer; the timer's activity does what is due).
        pending = models.Approval.objects.using(RunRecords(definition.using).db).filter(
            coordination_id=coordination_id, status=models.Approval.Status.PENDING
        )
        due = [at for approval in pending[:5] if (at := next_due_at(approval)) is not None]
        if due:
            expires_at = min(due).isoformat()
    wake_at = None
    if record.status in TIMED and record.wake_at is not None:
        # A sleep's end, or the deadline of a wait for a message: the workflow's timer.
        wake_at = record.wake_at.isoformat()
    last_step, next_step = record.last_step or "", ""
    if record.status not in (*RunStatus.FINAL, RunStatus.FAILED):
        # Its newest snapshot says which step comes next (a jump's target, say).
        last_step, next_step = position_of(record)
    if record.workflow_version != definition.version:  # upgraded: its new version's
        if not workflow_registry.defines(record.workflow_name, record.workflow_version):
            return RunReport(
                record.status,
                last_step,
                None,
                expires_at,
                detail,
                record.workflow_version,
                wake_at,
                handoff,
            )
        definition = workflow_registry.get(record.workflow_name, record.workflow_version)
    return RunReport(
        status=record.status,
        last_step=last_step,
        next_policy=next_policy(definition, last_step, next_step),
        expires_at=expires_at,
        detail=detail,
        version=record.workflow_version,
        wake_at=wake_at,
        handoff=handoff,
    )


class _Heartbeats:
    """Heartbeats the current activity every *interval* seconds while the step runs,
    so that Temporal notices a dead worker within the heartbeat timeout; and, every
    tick of at most ``WATCH_EVERY`` seconds, asks *watch* (``handback.LapseWatch``)
    whether the attempt was handed back (its run's claim lapsed while the server is
    still reachable): then it stops heartbeating."""

    def __init__(self, interval: float, watch: Callable[[], bool] | None = None) -> None:
        self.interval = interval
        self.watch = watch
        self._stop = threading.Event()
        context = contextvars.copy_context()  # the activity's context, for heartbeat()
        self._thread = threading.Thread(
            target=context.run, args=(self._beat,), name="flowwarden-heartbeat", daemon=True
        )

    def _beat(self) -> None:
        tick = self.interval if self.watch is None else min(self.interval, WATCH_EVERY)
        due = time.monotonic() + self.interval
        while not self._stop.wait(tick):
            if self.watch is not None and self.watch():
                return
            if time.monotonic() >= due:
                due = time.monotonic() + self.interval
                activity.heartbeat()

    def __enter__(self) -> _Heartbeats:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _definition(request: StepRequest, *, strict: bool = True) -> RegisteredWorkflow:
    """The definition of the request's workflow, at the run's version (the request's,
    else the run record's). A worker that does not define that version hands the
    step back (``VERSION_HANDBACK``): the workflow offers it to another worker;
    not *strict* (a status read, an expiry, which run no step): the newest version,
    whose database holds the run."""
    version = request.version
    try:
        if version is None:
            # The run's database is where this worker's definitions keep their runs.
            using = workflow_registry.get(request.workflow).using
            record = RunRecords(using).get(request.coordination_id)
            version = None if record is None else record.workflow_version
        return workflow_registry.get(request.workflow, version)
    except VersionNotDefinedError as exc:
        if not strict:
            return workflow_registry.get(request.workflow)
        logger.info(
            "workflow %s (%s): this worker does not define version %s; handing the step back",
            request.workflow,
            request.coordination_id,
            version,
        )
        raise ApplicationError(str(exc), type=VERSION_HANDBACK, non_retryable=True) from exc
    except LookupError as exc:
        raise ApplicationError(str(exc), type="LookupError", non_retryable=True) from exc


@activity.defn(name=STEP_ACTIVITY)
def run_step(request: StepRequest) -> RunReport:
    """Execute one step of the run (one attempt of it: Temporal schedules the retries).
    A worker whose database is silent refuses it; while it runs, its heartbeat thread
    hands the attempt back to Temporal once the run's claim lapses (``handback``)."""
    close_old_connections()
    try:
        if request.input is not None:
            # The wake's input, checked here as the engine checks it: only this
            # refusal drops the wake (another UserJSONError is the step's own failure).
            try:
                check_resume_input(request.input)
            except UserJSONError as exc:
                raise _input_refused(request, exc) from exc
        return _run_step(request)
    finally:
        close_old_connections()


def _input_refused(request: StepRequest, error: UserJSONError) -> ApplicationError:
    """The step's input (a ``wake`` signal's) is refused (``check_resume_input``):
    logged here, once, without the input; not retried (``INPUT_REFUSED``): the
    workflow drops the wake and the run stays as it was. Benign, so the SDK does not
    log it again with a traceback."""
    logger.warning(
        "workflow %s (%s): a wake's input was refused (%s: %s); the wake is dropped",
        request.workflow,
        request.coordination_id,
        error.code,
        error,
    )
    return ApplicationError(
        str(error),
        error.code,
        type=INPUT_REFUSED,
        non_retryable=True,
        category=ApplicationErrorCategory.BENIGN,
    )


def _handed(request: StepRequest) -> Handoff | None:
    """Where the previous step left the run held; its head is used only by the next
    step of a running run (a wake may continue a paused one: it reads the run)."""
    if request.handoff is None:
        return None
    handed = Handoff.from_dict(request.handoff, request.coordination_id)
    if handed is None or request.origin == "next":
        return handed
    return handed.without_head()


def _run_step(request: StepRequest) -> RunReport:
    cid = request.coordination_id
    try:  # before _definition, which may read the run: not from a silent database
        db = RunRecords(workflow_registry.get(request.workflow).using).db
    except LookupError:
        db = None
    if db is not None:
        refuse_while_silent(db, cid)
    definition = _definition(request)
    db = RunRecords(definition.using).db
    handed = _handed(request)
    info = activity.info()
    # The token this step hands the run on to: the same for every copy and attempt of
    # this activity, so one that finds an earlier copy's hand-off takes the run from
    # it at once (the copy died after its save) instead of waiting out its lease.
    hands_to = new_handoff_token(info.workflow_id, info.workflow_run_id, info.activity_id)
    held_by = taken_from(handed, hands_to, copy=info.attempt > 1)
    wf = definition.workflow(cid, kind=_ActivityWorkflow, origin=request.origin, held_by=held_by)
    step = partial(
        wf.run_handing_off, handed, input=request.input, attempt=info.attempt, hand_off_to=hands_to
    )
    try:
        if info.is_local:  # a short step: local activities cannot heartbeat
            result, handoff = step()
        else:
            heartbeat = (info.heartbeat_timeout or timedelta(seconds=10)).total_seconds() / 3
            watch = LapseWatch(db, cid, run_lease())
            with _Heartbeats(max(heartbeat, 0.2), watch):
                result, handoff = step()
    except (StaleStep, RunVersionError) as exc:
        # RunVersionError: upgraded since this step was scheduled; the report carries
        # the run's new version to the workflow.
        logger.info("workflow %s (%s): step not run: %s", wf.name, cid, exc)
        return report(definition, cid, str(exc), hands_to)
    except StepAttemptFailed as exc:
        raise ApplicationError(
            str(exc),
            type="StepAttemptFailed",
            # The step's own delay (the retry policy backs off for other failures).
            next_retry_delay=timedelta(seconds=max(exc.retry_delay, 0.1)),
        ) from exc
    except ConcurrentRunError as exc:
        if isinstance(exc, LeaseLostError) or exc.claimed_until is None:
            # Taken over (a cancel, an upgrade, another worker once this one's lease ran
            # out), or an earlier copy of this step saved first: the run goes on from
            # where it stands; this attempt's result is not saved (the fence).
            logger.warning(
                "workflow %s (%s): step attempt %d not saved, the run was taken over: %s",
                wf.name,
                cid,
                info.attempt,
                exc,
            )
            return report(definition, cid, str(exc), hands_to)
        # The holder may be a killed worker: try again once its claim is over.
        remaining = (exc.claimed_until - timezone.now()).total_seconds()
        delay = min(max(remaining, 0.0), run_lease().total_seconds()) + 0.5
        raise ApplicationError(
            str(exc), type="ConcurrentRunError", next_retry_delay=timedelta(seconds=delay)
        ) from exc
    if isinstance(result, Running):
        # This very step left the run running at its snapshot: no need to read it.
        last_step = result.last_step_name
        policy = next_policy(definition, last_step, result.next_step_name)
        carried = None if handoff is None else handoff.as_dict()
        outcome = RunReport(
            "running", last_step, policy, version=definition.version, handoff=carried
        )
    else:
        outcome = report(definition, cid)
    if isinstance(result, WaitingForSlot):
        # No step ran: the run let go, and its workflow waits for a "dispatch" wake.
        logger.info("workflow %s (%s): waits for a slot of queue %s", wf.name, cid, result.queue)
        return outcome
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
    """The run's timer fired: send its approval's due reminder or escalation, expire
    its approval once it is due, or wake it when it
    sleeps, or waits for a message, and its time has come (the workflow then runs its
    next step, which gets ``ctx.message is None`` after a wait that timed out);
    idempotent, like the sweep it stands in for. The expiry continues the run through
    the provider."""
    close_old_connections()
    try:
        definition = _definition(request, strict=False)
        db = RunRecords(definition.using).db
        cid = request.coordination_id
        if wake_due_run(cid, using=db):
            logger.info("workflow run %s woke (its sleep, or its wait, is over)", cid)
        remind_and_escalate_due(db, coordination_id=cid)
        expired = expire_due_approvals(using=db, coordination_id=cid)
        if expired:
            logger.info("workflow run %s: approval %s expired", cid, expired[0])
        return report(definition, cid)
    finally:
        close_old_connections()


@activity.defn(name=STATUS_ACTIVITY)
def run_status(request: StepRequest) -> RunReport:
    """Where the run stands (after a fork, say)."""
    close_old_connections()
    try:
        return report(_definition(request, strict=False), request.coordination_id)
    finally:
        close_old_connections()


@activity.defn(name=SCHEDULED_START_ACTIVITY)
def start_scheduled(start: ScheduledStart) -> str:
    """Start the run of the action's tick (``schedules``): the latest multiple of its
    period at its scheduled time, so a repeated action starts nothing more; an action
    run a period or more after its time is late and starts the current tick's run, so
    missed ticks start one run. The run's coordination id."""
    close_old_connections()
    try:
        now = timezone.now()
        sent = datetime.fromisoformat(start.scheduled_at) if start.scheduled_at else now
        tick = interval_tick(start.every, sent)
        if late(sent, now, (now - sent).total_seconds() >= start.every):
            tick = interval_tick(start.every, now)
        started = start_for_tick(start.schedule, start.workflow, start.state, tick)
        if started.created:
            logger.info("schedule %s: started %s for tick %s", start.schedule, start.workflow, tick)
        return started.coordination_id
    finally:
        close_old_connections()


ACTIVITIES = (run_step, expire_approval, run_status, start_scheduled)
