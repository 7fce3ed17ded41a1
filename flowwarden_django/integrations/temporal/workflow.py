"""The Temporal workflow that drives one flowwarden run.

It runs one activity per step (a local activity for a short step: ``policies``)
and, while the run is paused, waits for a ``wake`` signal (``run()``,
``resume(input)``, a decision, a message sent to the run, a fork, a slot of its
queue handed to it), for the expiry of
the approval the run waits for, for the end of its sleep, or for the deadline of its
wait for a message: a durable Temporal timer, so a run waiting for days holds no
worker slot and no thread. A signal only wakes the run: a decision or a message is
read from its row by the step, never from the signal. A cancelled run's workflow is cancelled
(``Workflow.cancel``) and ends as cancelled. The snapshot chain in the Django
database stays the source of truth: the activities read and write it through the
engine, and this workflow only decides when the next one runs. Deterministic by
construction: it imports nothing but ``messages`` and reads time only through ``workflow.now()``.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime, timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from .messages import (
        EXPIRE_ACTIVITY,
        EXTRA_ATTEMPTS,
        HANDBACK_DELAYS,
        INPUT_REFUSED,
        SCHEDULED_START_ACTIVITY,
        SCHEDULED_START_TYPE,
        STATUS_ACTIVITY,
        STEP_ACTIVITY,
        VERSION_HANDBACK,
        WAKE_SIGNAL,
        WORKFLOW_TYPE,
        RunReport,
        RunStart,
        ScheduledStart,
        StepPolicy,
        StepRequest,
        Wake,
    )

#: Statuses after which the Temporal workflow ends (a later ``run()`` starts another).
FINAL = ("completed", "failed", "cancelled")
#: Statuses of a paused run: the workflow waits for a wake, the approval's expiry, the
#: end of a sleep or the deadline of a wait for a message. A run waiting for a queue's
#: slot waits for the ``dispatch`` wake of the step that hands it one.
PAUSED = (
    "hibernated",
    "waiting",
    "sleeping",
    "waiting_children",
    "waiting_message",
    "waiting_slot",
)
T = TypeVar("T")

#: Activities that only read or expire (not steps): short, retried until they work.
QUICK = timedelta(seconds=60)
#: Seconds added to a step's own ``timeout`` for its activity's start-to-close timeout:
#: the engine times the attempt out itself and records it (claiming the run, writing
#: the snapshot), so Temporal must not cut it short.
TIMEOUT_MARGIN = 30.0
#: The largest number of seconds a wake's step policy may name (a timeout, a delay).
POLICY_SECONDS = 1e9


class _WakeRefused(Exception):
    """The step a wake asked for refused the wake's input (``INPUT_REFUSED``): the
    activity logged it, and the run loop drops the wake."""


def _policy_problem(policy: StepPolicy | None) -> str:
    """Why *policy* (a wake's) cannot schedule an activity, or ``""``: a negative, huge
    or not finite number would fail every workflow task of the run, for good."""
    if policy is None:
        return ""
    if not (isinstance(policy.max_retries, int) and 0 <= policy.max_retries <= 10_000):
        return f"max_retries {policy.max_retries!r} is out of range"
    for name in ("retry_delay", "timeout"):
        seconds = getattr(policy, name)
        if seconds is None and name == "timeout":
            continue
        if not (math.isfinite(seconds) and 0 <= seconds <= POLICY_SECONDS):
            return f"{name} {seconds!r} is out of range"
    return ""


def _failure_type(error: Exception) -> str | None:
    """The ``ApplicationError`` type of a step's failure: a regular activity's comes
    wrapped in an ``ActivityError``, a local activity's can come as itself."""
    cause = error.cause if isinstance(error, ActivityError) else error
    return cause.type if isinstance(cause, ApplicationError) else None


def _start_to_close(policy: StepPolicy, start: RunStart) -> timedelta:
    if policy.timeout is None:
        return timedelta(seconds=start.step_timeout)
    return timedelta(seconds=policy.timeout + TIMEOUT_MARGIN)


@workflow.defn(name=WORKFLOW_TYPE)
class RunWorkflow:
    """One flowwarden run as a Temporal workflow (workflow id = coordination id)."""

    def __init__(self) -> None:
        self._wakes: list[Wake] = []
        #: The version of the run's workflow, as the last wake or report said.
        self._version: int | None = None
        #: Set once a step was handed back: this worker lacks the run's version, and a
        #: local activity would run here again, so every later step is a regular one.
        self._regular_only = False
        #: Where the last step left the run held for the next (``workflows.handoff``);
        #: its carried head is dropped once a step reports no hand-off of its own.
        self._handoff: dict | None = None

    @workflow.signal(name=WAKE_SIGNAL)
    def wake(self, wake: Wake) -> None:
        # flowwarden sends only wakes it made; one sent by hand to the workflow may
        # carry anything JSON holds (a wrong type is dropped by the SDK itself).
        problem = _policy_problem(wake.policy)
        if problem:
            workflow.logger.warning("wake signal dropped: its step policy's %s", problem)
            return
        self._wakes.append(wake)

    @workflow.run
    async def run(self, start: RunStart) -> str:
        report = RunReport(status="hibernated")  # nothing runs before the first wake
        while True:
            if self._wakes:
                wake = self._wakes.pop(0)
                # The wake's version is the run's only if the wake is accepted: a
                # refused one (sent by hand) leaves the version as it was.
                before = self._version
                if wake.version is not None:
                    self._version = wake.version
                if wake.origin == "refresh":
                    # The run changed outside (a fork): the next step reads its head.
                    self._drop_carried_head()
                    report = await self._quick(STATUS_ACTIVITY, start)
                else:
                    # "run": run()/resume()/a decision may continue a paused run; a
                    # "recover" wake (the worker's sweep) or a "dispatch" one (a queue
                    # handed the run a slot) continues a running one only.
                    origin = "run" if wake.origin == "run" else "next"
                    policy = wake.policy if wake.policy is not None else report.next_policy
                    try:
                        report = await self._step(start, policy, origin, wake.input)
                    except _WakeRefused:
                        # A wake with an input the engine refuses (sent by hand to
                        # the workflow, not through flowwarden): the run stays as it
                        # was, its version too, and the next wake continues it.
                        self._version = before
                        continue
            elif report.status == "running":
                report = await self._step(start, report.next_policy, "next", None)
            elif report.status in FINAL:
                return report.status
            else:
                timeout = self._sooner(self._until(report.expires_at), self._until(report.wake_at))
                try:
                    await workflow.wait_condition(lambda: bool(self._wakes), timeout=timeout)
                except TimeoutError:
                    report = await self._quick(EXPIRE_ACTIVITY, start)
            if report.version is not None:
                self._version = report.version

    def _until(self, due_at: str | None) -> timedelta | None:
        if due_at is None:
            return None
        remaining = datetime.fromisoformat(due_at) - workflow.now()
        # A little late rather than early: an approval is expired, and a sleeping run
        # woken, only once due.
        return max(remaining, timedelta(0)) + timedelta(milliseconds=100)

    @staticmethod
    def _sooner(first: timedelta | None, second: timedelta | None) -> timedelta | None:
        if first is None or second is None:
            return first if second is None else second
        return min(first, second)

    async def _step(
        self, start: RunStart, policy: StepPolicy | None, origin: str, input: object
    ) -> RunReport:
        """Run one step; a worker that lacks the run's version hands it back, and it is
        offered again as a regular activity (any worker may take that; a local
        activity would run on this worker again). A wake meanwhile (an upgrade moved
        the run, say) ends the wait: the run loop takes it, with its version."""
        policy = policy or StepPolicy()
        handbacks = 0
        while True:
            try:
                return await self._step_once(start, policy, origin, input)
            except (ActivityError, ApplicationError) as error:
                # Caught as either (``_failure_type``): a local activity's failure
                # left uncaught would fail this workflow and leave the run with
                # nobody driving it.
                failure = _failure_type(error)
                if failure == INPUT_REFUSED:
                    raise _WakeRefused from error
                if failure != VERSION_HANDBACK:
                    raise
            delay = HANDBACK_DELAYS[min(handbacks, len(HANDBACK_DELAYS) - 1)]
            handbacks += 1
            self._regular_only = True
            try:
                await workflow.wait_condition(lambda: bool(self._wakes), timeout=delay)
            except TimeoutError:
                continue
            # Not finished: the run loop reads the wake first, then the run again.
            return RunReport(status="running")

    async def _step_once(
        self, start: RunStart, policy: StepPolicy, origin: str, input: object
    ) -> RunReport:
        report = await self._step_activity(start, policy, origin, input)
        if report.handoff is not None:
            self._handoff = report.handoff
        else:
            self._drop_carried_head()
        return report

    def _drop_carried_head(self) -> None:
        if self._handoff is not None:
            self._handoff = {**self._handoff, "head": None}

    async def _step_activity(
        self, start: RunStart, policy: StepPolicy, origin: str, input: object
    ) -> RunReport:
        request = StepRequest(
            start.coordination_id,
            start.workflow,
            origin,
            input,
            start.using,
            self._version,
            self._handoff,
        )
        # The step's own retries are counted by the activity (``max_retries``; each
        # failed attempt names its ``retry_delay``); Temporal retries every attempt
        # that did not end (a killed worker, a database away) too, backing off, up to
        # EXTRA_ATTEMPTS more: then this workflow fails, and the recovery sweep
        # starts another for a run still running.
        retry_policy = RetryPolicy(
            initial_interval=timedelta(seconds=0.1),
            backoff_coefficient=2.0,
            maximum_interval=timedelta(seconds=max(policy.retry_delay, 0.1) + 30),
            maximum_attempts=max(policy.max_retries, 0) + 1 + EXTRA_ATTEMPTS,
            non_retryable_error_types=[
                "UnknownRunError",
                "LookupError",
                VERSION_HANDBACK,
                INPUT_REFUSED,
            ],
        )
        if policy.local and not self._regular_only:
            # A short step: run in this worker's workflow task, no activity task.
            # No heartbeats: a killed worker is noticed when the workflow task
            # times out, and the step runs again on the next worker.
            return await workflow.execute_local_activity(
                STEP_ACTIVITY,
                request,
                result_type=RunReport,
                start_to_close_timeout=_start_to_close(policy, start),
                retry_policy=retry_policy,
            )
        return await workflow.execute_activity(
            STEP_ACTIVITY,
            request,
            result_type=RunReport,
            start_to_close_timeout=_start_to_close(policy, start),
            heartbeat_timeout=timedelta(seconds=start.heartbeat_timeout),
            retry_policy=retry_policy,
        )

    async def _quick(self, activity: str, start: RunStart) -> RunReport:
        request = StepRequest(
            start.coordination_id, start.workflow, "refresh", None, start.using, self._version
        )
        return await _execute_quick(activity, request, RunReport)


@workflow.defn(name=SCHEDULED_START_TYPE)
class ScheduledStartWorkflow:
    """One tick of a Temporal Schedule (``schedules``): start the flowwarden run of
    that tick (one activity; the run then has a Temporal workflow of its own)."""

    @workflow.run
    async def run(self, start: ScheduledStart) -> str:
        key = SearchAttributeKey.for_datetime("TemporalScheduledStartTime")
        scheduled = workflow.info().typed_search_attributes.get(key)
        if scheduled is not None:
            start = dataclasses.replace(start, scheduled_at=scheduled.isoformat())
        return await _execute_quick(SCHEDULED_START_ACTIVITY, start, str)


async def _execute_quick(activity: str, argument: Any, result_type: type[T]) -> T:
    """Run a short activity (``QUICK``: a read, an expiry, a scheduled start), retried
    until it works."""
    return await workflow.execute_activity(
        activity,
        argument,
        result_type=result_type,
        start_to_close_timeout=QUICK,
        retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=10)),
    )
