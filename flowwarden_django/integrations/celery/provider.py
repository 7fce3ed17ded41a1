"""Workflows on Celery: each step is one short task.

``FLOWWARDEN = {"WORKFLOW_EXECUTION": "celery"}`` selects :class:`CeleryExecutionProvider`.
``Workflow.run()`` / ``resume()`` then persist the seed (``workflow.seed``), queue the
task ``flowwarden_django.run_workflow_step`` once the caller's transaction commits,
and return ``Running``. The task rebuilds the workflow from the registry
(``Workflow.define`` in a module the worker imports) and executes ONE step
(``run_local(max_steps=1)``); when more steps remain, it queues the next step's task
once that step's snapshot has committed. A hibernated (or waiting, completed, failed)
run holds no task.

Crashes: the task is ``acks_late`` and ``reject_on_worker_lost``, so a step whose
pool child dies is delivered again at once; its task, meeting the dead child's claim,
retries once that claim has run out (nobody renews it: ``workflows.claim_keeper``).
A whole worker that dies leaves its message with the broker (until the Redis
``visibility_timeout``, say), but every worker runs the recovery sweep
(``WorkflowSweepBootstep``, every ``WORKFLOW_SWEEP_INTERVAL``), which queues the next
step of every running run whose claim ran out, or that has no claim and has not moved
for ``WORKFLOW_RECOVER_AFTER`` (10 s): a message the broker lost or a publish that
failed. The beat task ``flowwarden_django.recover_workflows`` runs the same sweep.
Steps must be idempotent: a killed step runs again.

Versions: each task also carries the version of the run's workflow. A worker that
does not define that version (a rolling deploy: old and new workers on one queue)
never runs the step: it sends the task on to the queue of that version
(``version_queue``: ``<its queue>.<workflow>.v<version>``), which only workers that
define the version consume, and acknowledges it. A step whose version no running
worker defines waits in that queue until one starts (``manage.py check`` and
``flowwarden_workflows versions`` name such runs).

Each task carries the head snapshot it continues from and where it came from. It
checks both *under its claim on the run* and does nothing when the run has moved on,
so a duplicate (a redelivery, a sweep, a retry) never runs a step twice in a row and
never resumes a paused run; only the task queued by ``run()`` / ``resume()`` may
continue a paused or failed run. A task already stale when it starts does not even
claim the run, so it leaves its ``updated_at`` (what the sweep goes by) alone.

Hand-off (``workflows.handoff``): a step that leaves the run running keeps it held
for the next step's task, which carries the hold and the new head; the first
delivery of that task runs without claiming (its save is conditional on the hold and
the head's ``seq``, so anything that moved the run meanwhile discards it). A
redelivery or a retry claims as above, taking the run from the hold.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from celery import Celery, current_app
from django.db import transaction
from django.utils import timezone

from ...common.failure_log import FailureLog
from ...workflows.definition.metadata import LAST_STEP, NEXT_STEP
from ...workflows.definition.registry import VersionNotDefinedError, workflow_registry
from ...workflows.definition.results import Running, WorkflowResult
from ...workflows.definition.steps import WorkflowStep, step_after
from ...workflows.engine.workflow import Workflow
from ...workflows.execution.handoff import Handoff, taken_from
from ...workflows.execution.providers import RemoteExecutionProvider
from ...workflows.operations.recovery import (
    position_of,
    recover_in_every_database,
    recover_stalled_runs,
)
from ...workflows.runs.records import (
    ClaimTerms,
    ConcurrentRunError,
    LeaseLostError,
    RunRecords,
    RunVersionError,
    UnknownRunError,
    new_handoff_token,
    run_lease,
)
from ..remote_steps import RemoteStepWorkflow
from .silence import MAX_SILENT_HANDBACKS, silent_database

if TYPE_CHECKING:
    from ...models import WorkflowRun
    from ...workflows.engine.workflow import WorkflowDefinition

logger = logging.getLogger("flowwarden_django.celery")

STEP_TASK = "flowwarden_django.run_workflow_step"
RECOVER_TASK = "flowwarden_django.recover_workflows"

#: Seconds added to a step's own time budget for its task's hard ``time_limit``
#: (claiming the run, writing the snapshot, queueing the next step).
TIME_LIMIT_MARGIN = 30
#: How many times a step task waits for another runner's claim to expire.
CONFLICT_RETRIES = 3


class Origin:
    """Who queued a step task: it decides which runs the task may continue."""

    #: ``Workflow.run()`` / ``resume()``: may continue a paused or failed run.
    RUN = "run"
    #: The previous step's task: continues a ``running`` run only.
    NEXT = "next"
    #: The recovery sweep: continues a ``running`` run only.
    RECOVER = "recover"

    ALL = (RUN, NEXT, RECOVER)


class BrokerUnavailableError(ConnectionError):
    """The Celery broker did not answer the provider's health check."""


class StaleStepError(Exception):
    """A step task found the run moved on (another task advanced it, or it paused or
    ended) and did nothing."""


# -- queueing a step ---------------------------------------------------------------------


def step_time_limit(current: WorkflowStep | None) -> int | None:
    """The hard ``time_limit`` of *current*'s task: every attempt's ``timeout`` and the
    delays between them, plus :data:`TIME_LIMIT_MARGIN`; ``None`` without a timeout.

    The engine times out an attempt by itself; this limit only ends a task stuck
    outside the step (the process is killed and the run recovered after its lease).
    """
    if current is None or current.timeout is None:
        return None
    attempts = current.max_retries + 1
    budget = attempts * current.timeout + current.max_retries * current.retry_delay
    return math.ceil(budget) + TIME_LIMIT_MARGIN


def send_step(
    app: Celery,
    definition: WorkflowDefinition,
    coordination_id: str,
    *,
    head: str | None,
    last_step: str,
    origin: str,
    input: Any = None,
    handoff: dict[str, Any] | None = None,
    next_step: str = "",
) -> None:
    """Publish the task that executes the step after *last_step*, or *next_step* when
    *last_step* jumped there (now, not on commit); *handoff*: where the previous step
    left the run held (``workflows.handoff``).

    A broker that does not answer is retried with kombu's retry policy
    (``PUBLISH_RETRY_POLICY``: about 3 s in all) before the error is raised; the
    recovery sweep queues what could not be published.
    """
    options: dict[str, Any] = {"retry": True, "retry_policy": PUBLISH_RETRY_POLICY}
    limit = step_time_limit(step_after(definition.steps, last_step, next_step))
    if limit is not None:
        options["time_limit"] = limit
    if handoff is not None:
        # A header, not an argument: a worker of an earlier release ignores it.
        options["headers"] = {HANDOFF_HEADER: handoff}
    kwargs = _step_fields(coordination_id, definition.name, definition.version, head, origin, input)
    app.send_task(STEP_TASK, kwargs=kwargs, kwargsrepr=_kwargs_repr(kwargs), **options)


def _step_fields(
    coordination_id: str,
    workflow: str,
    version: int,
    head: str | None,
    origin: str,
    input: Any,
    handbacks: int | None = None,
) -> dict[str, Any]:
    """The step task's keyword arguments (``handbacks`` only when given: a first
    publication leaves it to the task's default)."""
    fields = {
        "coordination_id": coordination_id,
        "workflow": workflow,
        "version": version,
        "head": head,
        "origin": origin,
        "input": input,
    }
    if handbacks is not None:
        fields["handbacks"] = handbacks
    return fields


def _kwargs_repr(kwargs: dict[str, Any]) -> str:
    """What the worker's logs and task events show of a step task's arguments: not the
    input, nor the snapshot its hand-off carries (a state does not belong in logs, and
    Celery would format all of it for every task)."""
    shown = ("coordination_id", "workflow", "version", "head", "origin")
    return repr({name: kwargs.get(name) for name in shown})


#: The message header a step task carries its hand-off in (``workflows.handoff``).
HANDOFF_HEADER = "flowwarden_handoff"

#: kombu's retry policy for publishing a step: 4 tries over about 3 s.
PUBLISH_RETRY_POLICY = {
    "max_retries": 3,
    "interval_start": 0.25,
    "interval_step": 0.5,
    "interval_max": 1.5,
}

#: Step publications that failed in this process (logged once per outage).
publish_failures = FailureLog(
    logger,
    "workflows on Celery: queueing a step (the recovery sweep, "
    "flowwarden_django.recover_workflows, queues what could not be)",
    level=logging.ERROR,
)


def _send_or_log(app: Celery, definition: WorkflowDefinition, cid: str, **fields: Any) -> None:
    """``send_step`` for a running run; a failure is logged (the sweep recovers it)."""
    try:
        send_step(app, definition, cid, **fields)
    except Exception as exc:
        publish_failures.failed(exc)
    else:
        publish_failures.succeeded()


def _on_commit(using: str, callback: Any) -> None:
    # Outside a transaction this runs the callback at once.
    transaction.on_commit(callback, using=using)


# -- the provider ------------------------------------------------------------------------


class CeleryExecutionProvider(RemoteExecutionProvider):
    """Runs each step of a workflow as one Celery task (see the module docstring).

    *app* is the Celery app to publish with (default: ``celery.current_app``, the
    project's app). ``is_available()`` connects to the app's broker (cached, see
    ``RemoteExecutionProvider``). Only workflows declared with ``Workflow.define`` can
    run here: the worker rebuilds them by name. Inputs (``resume(input=...)``) must be
    JSON-serialisable.
    """

    name = "celery"
    unavailable_error = BrokerUnavailableError
    #: Seconds the broker check may take.
    probe_timeout: float = 2.0

    def __init__(self, app: Celery | None = None) -> None:
        super().__init__()
        self._app = app

    @property
    def app(self) -> Celery:
        return self._app if self._app is not None else current_app._get_current_object()

    def probe(self) -> str:
        timeout = self.probe_timeout
        connection = self.app.connection_for_write(
            connect_timeout=timeout,
            # Redis: a broker that drops packets would otherwise block the probe.
            transport_options={"socket_connect_timeout": timeout, "socket_timeout": timeout},
        )
        try:
            connection.ensure_connection(
                max_retries=1, interval_start=0, interval_step=0, timeout=timeout
            )
        except Exception as exc:
            return f"broker {connection.as_uri()} is unreachable: {exc}"
        finally:
            connection.release()
        return ""

    def run(
        self, workflow: Workflow, initial_state: Any = None, input: Any = None
    ) -> WorkflowResult:
        """Seed the run, queue its next step on commit, return ``Running`` (or the
        current result of a completed run, or of a waiting run resumed without input,
        without queueing anything)."""
        definition = workflow_registry.get(workflow.name, workflow.version)
        head, record, settled = self.handover(workflow, initial_state, input)
        if settled is not None:
            return settled
        last_step = head.metadata.get(LAST_STEP, "")
        send = partial(
            send_step,
            self.app,
            definition,
            workflow.coordination_id,
            head=record.head_snapshot_id,
            last_step=last_step,
            origin=Origin.RUN,
            input=input,
            next_step=head.metadata.get(NEXT_STEP, ""),
        )
        db = workflow.runs.db
        # Published once the caller's transaction commits (at once outside one). A
        # broker error never reaches the caller: the run is seeded and ``running``, so
        # the recovery sweep queues its step once the broker answers again.
        _on_commit(db, partial(self._send_after_commit, send))
        return Running(head.state, workflow.coordination_id, last_step)

    def _send_after_commit(self, send: Callable[[], None]) -> None:
        try:
            send()
        except Exception as exc:
            self._publish_failed(exc)
            publish_failures.failed(exc)
        else:
            publish_failures.succeeded()

    def _publish_failed(self, exc: Exception) -> None:
        # The next runs go in-process until the broker answers a check again.
        self.remember(f"publishing a workflow step failed: {exc}")


# -- the step task's body ----------------------------------------------------------------


class _StepWorkflow(RemoteStepWorkflow):
    """The workflow a step task runs: its claim also checks that the task is still
    wanted (at snapshot *head*), so the check and the step cannot be separated by
    another runner."""

    executed_by = "celery"
    stale_error = StaleStepError

    def __init__(self, *args: Any, head: str | None, **options: Any) -> None:
        super().__init__(*args, **options)
        self.expected_head = head

    def _claim_terms(self) -> ClaimTerms:
        # The claim is taken only while the task is current (the head it continues
        # from, and a running run unless run()/resume() queued it), in one statement
        # with the input and (ORM store) the read of the head. It never creates the
        # run, and a stale task (a redelivery, a duplicate) leaves the run untouched:
        # claiming it would move its ``updated_at`` and hide a stalled run from the
        # recovery sweep for another WORKFLOW_RECOVER_AFTER.
        # A run handed on is taken from its hand-off tokens (``run_step``).
        return ClaimTerms(
            head=self.expected_head,
            check_head=True,
            running_only=self.origin != Origin.RUN,
            held_by=self.held_by,
        )

    def _stale(self, current: WorkflowRun, terms: ClaimTerms) -> None:
        head = self.expected_head
        if current.head_snapshot_id != head:
            raise StaleStepError(
                f"the run moved on from snapshot {head} to {current.head_snapshot_id}"
            )
        super()._stale(current, terms)


def _definition(
    workflow: str | None, version: int | None, coordination_id: str
) -> WorkflowDefinition:
    """The definition a step task names; a task of an older release names no
    version (or no workflow): the run's record says."""
    if workflow is None or version is None:
        record = RunRecords().get(coordination_id)
        if record is None:
            raise UnknownRunError(f"no workflow run {coordination_id!r}")
        workflow, version = record.workflow_name, record.workflow_version
    return workflow_registry.get(workflow, version)


def version_queue(queue: str, workflow: str, version: int) -> str:
    """The queue of the step tasks of version *version* of *workflow* that a worker
    without that version received from *queue*: every worker consumes, beside each
    of its queues, the queues of the versions it defines
    (``bootstep.consume_version_queues``)."""
    return f"{queue}.{workflow}.v{version}"


def _queue_of(task: Any) -> str:
    """The name of the queue *task* was delivered from: the declared queue its
    routing key leads to (a queue's name and its routing key may differ)."""
    delivery = getattr(task.request, "delivery_info", None) or {}
    key = delivery.get("routing_key")
    for queue in task.app.amqp.queues.values():
        if key is not None and key in (queue.routing_key, queue.name):
            return queue.name
    return key or task.app.conf.task_default_queue


#: ``_send_on``'s default: the hand-off header of the task's own message.
_SAME: Any = object()


def _send_on(task: Any, fields: dict[str, Any], queue: str, handoff: Any = _SAME) -> None:
    """Publish *task*'s message again on *queue*: the same arguments (*fields*, its
    ``handbacks`` one more), hard time limit and hand-off (or *handoff*, a hand-off's
    ``as_dict()`` or ``None``), so whoever takes it runs the step as this worker would
    have. The caller then returns, which acknowledges the message it holds: the copy is
    published first, so none is lost."""
    options: dict[str, Any] = {
        "retry": True,
        "retry_policy": PUBLISH_RETRY_POLICY,
        "queue": queue,
    }
    hard_limit = (getattr(task.request, "timelimit", None) or (None, None))[0]
    if hard_limit:
        options["time_limit"] = hard_limit
    if handoff is _SAME:
        handoff = getattr(task.request, HANDOFF_HEADER, None)
    if handoff is not None:
        options["headers"] = {HANDOFF_HEADER: handoff}
    kwargs = {**fields, "handbacks": fields["handbacks"] + 1}
    task.app.send_task(STEP_TASK, kwargs=kwargs, kwargsrepr=_kwargs_repr(kwargs), **options)


def _hand_back(
    task: Any, coordination_id: str, error: VersionNotDefinedError, fields: dict[str, Any]
) -> dict[str, Any]:
    """Send the task on to the queue of its version (a worker that defines it takes
    it there) instead of running it here."""
    queue = version_queue(_queue_of(task), error.workflow_name, error.version)
    _send_on(task, fields, queue)
    logger.info(
        "workflow %s (%s): this worker does not define version %d; step sent on to %s",
        error.workflow_name,
        coordination_id,
        error.version,
        queue,
    )
    return {
        "coordination_id": coordination_id,
        "workflow": error.workflow_name,
        "status": "handed back",
        "queue": queue,
    }


def _hand_back_silent(
    task: Any,
    definition: WorkflowDefinition,
    using: str,
    fields: dict[str, Any],
    handed: Handoff | None,
) -> dict[str, Any]:
    """Publish the task again on its own queue instead of running it on a worker whose
    database *using* is silent (``silence``): another worker takes it. The copy
    carries *handed*, the hand-off this delivery would have run from: a redelivery's
    copy has no head either, so it too claims the run and reads the head."""
    queue = _queue_of(task)
    _send_on(task, fields, queue, handoff=None if handed is None else handed.as_dict())
    logger.warning(
        "workflow %s (%s): database %s silent (run claims not renewed); step handed back to %s",
        definition.name,
        fields["coordination_id"],
        using,
        queue,
    )
    return {
        "coordination_id": fields["coordination_id"],
        "workflow": definition.name,
        "status": "handed back",
        "queue": queue,
    }


def _handed(task: Any, coordination_id: str, head: str | None) -> tuple[Handoff | None, bool]:
    """The hand-off a step task carries, and whether this is a redelivery or a retry;
    its head only for the first delivery of a task of the previous step (a copy may
    find its step saved)."""
    data = getattr(task.request, HANDOFF_HEADER, None)
    delivery = getattr(task.request, "delivery_info", None) or {}
    again = bool(delivery.get("redelivered") or task.request.retries)
    handed = Handoff.from_dict(data, coordination_id) if data is not None else None
    if handed is None:
        return None, again
    if again or handed.head is None or handed.head.get("id") != head:
        return handed.without_head(), again
    return handed, again


def _retry_countdown(exc: ConcurrentRunError) -> float | None:
    """Seconds until the holder's claim ends, or ``None`` when waiting is pointless
    (the claim was taken from us, or a snapshot conflict: someone advanced the run)."""
    if isinstance(exc, LeaseLostError) or exc.claimed_until is None:
        return None
    remaining = (exc.claimed_until - timezone.now()).total_seconds()
    return min(max(remaining, 0.0), run_lease().total_seconds()) + 1.0


def run_step(
    task: Any,
    coordination_id: str,
    *,
    workflow: str | None = None,
    head: str | None = None,
    origin: str = Origin.RUN,
    input: Any = None,
    version: int | None = None,
    handbacks: int = 0,
) -> dict[str, Any]:
    """The body of ``flowwarden_django.run_workflow_step`` (*task* is the bound task):
    execute one step, queue the next one on commit. Returns what happened. A task
    of a version this worker does not define is handed back (see the module).

    The task's ``HANDOFF_HEADER`` says where the previous step left the run held
    (``workflows.handoff``). A first delivery of the task runs from it without
    claiming the run; a redelivery or a retry claims it once the hold is over (a
    first delivery may still run from it), so its check of the head keeps a step
    that already saved from running twice."""
    if origin not in Origin.ALL:
        raise ValueError(f"unknown step task origin {origin!r}")
    try:
        definition = _definition(workflow, version, coordination_id)
    except UnknownRunError as exc:
        logger.info("workflow %s (%s): step task dropped: %s", workflow, coordination_id, exc)
        return {"coordination_id": coordination_id, "status": "dropped", "reason": str(exc)}
    except VersionNotDefinedError as exc:
        fields = _step_fields(
            coordination_id, exc.workflow_name, exc.version, head, origin, input, handbacks
        )
        return _hand_back(task, coordination_id, exc, fields)
    handed, again = _handed(task, coordination_id, head)
    # The token this step hands the run on to: the same for a redelivery or a retry of
    # this task.
    task_id = getattr(task.request, "id", None) or coordination_id
    hands_to = new_handoff_token(task_id, str(head))
    held_by = taken_from(handed, hands_to, copy=again)
    wf = definition.workflow(
        coordination_id, kind=_StepWorkflow, head=head, origin=origin, held_by=held_by
    )
    using = wf.runs.db
    if handbacks < MAX_SILENT_HANDBACKS and silent_database(using):
        # Reserved before this worker's consumer was paused (``silence``): a healthy
        # worker takes it, and nothing here has touched the database.
        fields = _step_fields(
            coordination_id, definition.name, definition.version, head, origin, input, handbacks
        )
        return _hand_back_silent(task, definition, using, fields, handed)
    outcome = {"coordination_id": coordination_id, "workflow": definition.name}
    try:
        result, handed_on = wf.run_handing_off(handed, input=input, hand_off_to=hands_to)
    except (StaleStepError, UnknownRunError, RunVersionError) as exc:
        # RunVersionError: upgraded since this task was queued (the upgrade queues the
        # step of the new version).
        logger.info("workflow %s (%s): step task dropped: %s", wf.name, coordination_id, exc)
        return {**outcome, "status": "dropped", "reason": str(exc)}
    except ConcurrentRunError as exc:
        countdown = _retry_countdown(exc)
        if countdown is None or task.request.retries >= CONFLICT_RETRIES:
            logger.info("workflow %s (%s): step task dropped: %s", wf.name, coordination_id, exc)
            return {**outcome, "status": "dropped", "reason": str(exc)}
        # The holder may be dead (a killed worker): try again once its claim is over.
        logger.info(
            "workflow %s (%s): %s; retrying in %.1f s", wf.name, coordination_id, exc, countdown
        )
        raise task.retry(countdown=countdown) from exc
    if isinstance(result, Running):
        head = result.snapshot_id
        if head is None:  # not this step's own snapshot: read where the run stands
            record = wf.run_record()
            assert record is not None
            head = record.head_snapshot_id
        send = partial(
            _send_or_log,
            task.app,
            definition,
            coordination_id,
            head=head,
            last_step=result.last_step_name,
            origin=Origin.NEXT,
            handoff=None if handed_on is None else handed_on.as_dict(),
            next_step=result.next_step_name,
        )
        _on_commit(wf.runs.db, send)
    return {**outcome, "status": result.status}


# -- the recovery sweep ------------------------------------------------------------------


def recover_workflows(
    app: Celery | None = None,
    *,
    older_than: timedelta | None = None,
    using: str | None = None,
    limit: int | None = 100,
) -> list[str]:
    """Queue the next step of every stalled run (``workflows.operations.recovery``) with *app*
    (default: the current app); the coordination ids queued. The runs of database
    *using*, by default of every database a defined workflow uses."""
    publisher = app if app is not None else current_app._get_current_object()

    def enqueue(run: WorkflowRun) -> None:
        # Its newest snapshot says which step comes next (a jump's target, say).
        last_step, next_step = position_of(run)
        send_step(
            publisher,
            workflow_registry.get(run.workflow_name, run.workflow_version),
            run.coordination_id,
            head=run.head_snapshot_id,
            last_step=last_step,
            origin=Origin.RECOVER,
            next_step=next_step,
        )

    if using is None:
        return recover_in_every_database(enqueue, older_than=older_than, limit=limit)
    return recover_stalled_runs(enqueue, older_than=older_than, using=using, limit=limit)
