"""``FLOWWARDEN["WORKFLOW_EXECUTION"] = "temporal"``: each run is one Temporal workflow
execution whose workflow id is the coordination id, each step one activity.

``run()``/``resume(input)`` seed the run and, once the caller's transaction commits,
*signal-with-start* the run's Temporal workflow with a ``wake``: Temporal starts it
when it is not running, or signals the one that is, so a run never has two. A decision
on an approval continues the run the same way, and so does a message sent to a run
waiting for one (``waiting.messages``: once the send commits, the run is made
``running`` and continued through this provider; the wake carries no input, and the
step reads the message from its row); a fork sends a ``refresh`` wake (the waiting
run re-reads its approval's expiry). A sleeping run waits on a durable timer until
its wake time, a run waiting for a message until its deadline; a cancel cancels the
run's workflow. A run waiting for a queue's slot (``waiting_slot``) waits for a wake
too, holding no activity: the step that hands it a slot sends a ``dispatch`` wake
(``continue_running``), and the run's next step activity finds the slot given to it.
``is_available()`` asks the server's
health; while it does not answer, runs fall back to the in-process engine.
"""

from __future__ import annotations

import contextlib
import logging
from functools import partial
from typing import Any

from django.db import transaction

from ...common.failure_log import FailureLog
from ...workflows.definition.metadata import LAST_STEP, NEXT_STEP
from ...workflows.definition.registry import workflow_registry
from ...workflows.definition.results import Running, WorkflowResult
from ...workflows.definition.steps import step_after
from ...workflows.execution.providers import ExecutableWorkflow, RemoteExecutionProvider
from ...workflows.operations.recovery import position_of
from ...workflows.runs.status import RunStatus
from .config import TemporalConfig
from .connection import TemporalConnection
from .messages import WAKE_SIGNAL, WORKFLOW_TYPE, RunStart, StepPolicy, Wake
from .policies import policy_of

logger = logging.getLogger("flowwarden_django.temporal")


class TemporalUnavailableError(ConnectionError):
    """The Temporal server did not answer the provider's health check."""


#: Wakes that could not be sent (logged once per outage).
wake_failures = FailureLog(
    logger,
    "workflows on Temporal: starting or signalling a run's workflow",
    level=logging.ERROR,
)


def run_start(config: TemporalConfig, definition: Any, coordination_id: str) -> RunStart:
    """The argument of the Temporal workflow that drives run *coordination_id*."""
    return RunStart(
        coordination_id,
        definition.name,
        definition.using,
        step_timeout=config.step_timeout,
        heartbeat_timeout=config.heartbeat_timeout,
    )


def next_policy(
    config: TemporalConfig, definition: Any, last_step: str, next_step: str = ""
) -> StepPolicy | None:
    """How the step after *last_step* of *definition* (or *next_step*, when
    *last_step* jumped there) is scheduled."""
    step = step_after(definition.steps, last_step, next_step)
    return policy_of(step, config.local_activity_timeout)


async def signal_with_start(
    client: Any, config: TemporalConfig, start: RunStart, wake: Wake
) -> None:
    """Start the run's Temporal workflow with *wake*, or signal the one running: a run
    never has two executions."""
    await client.start_workflow(
        WORKFLOW_TYPE,
        start,
        id=start.coordination_id,
        task_queue=config.task_queue,
        start_signal=WAKE_SIGNAL,
        start_signal_args=[wake],
    )


class TemporalExecutionProvider(RemoteExecutionProvider):
    """Runs workflows on Temporal (see the module docstring). ``is_available()`` asks
    the server's health (cached, see ``RemoteExecutionProvider``). Only workflows
    declared with ``Workflow.define`` can run here: the worker rebuilds them by name.
    Inputs (``resume(input=...)``) must be JSON-serialisable."""

    name = "temporal"
    unavailable_error = TemporalUnavailableError

    def __init__(self, config: TemporalConfig | None = None) -> None:
        super().__init__()
        self.config = config or TemporalConfig.from_settings()
        self.connection = TemporalConnection(self.config)

    def probe(self) -> str:
        try:
            healthy = self.connection.call(
                lambda client: client.service_client.check_health(),
                timeout=self.config.connect_timeout + 1,
            )
        except Exception as exc:
            self.connection.close()  # reconnect from scratch next time
            return f"Temporal at {self.config.target} is unreachable: {type(exc).__name__}: {exc}"
        return "" if healthy else f"Temporal at {self.config.target} is not serving"

    def run(
        self, workflow: ExecutableWorkflow, initial_state: Any = None, input: Any = None
    ) -> WorkflowResult:
        """Seed the run, wake its Temporal workflow on commit, return ``Running`` (or the
        current result of a completed run, or of a waiting run given no input)."""
        definition = workflow_registry.get(workflow.name, workflow.version)
        head, _record, settled = self.handover(workflow, initial_state, input)
        if settled is not None:
            return settled
        start = run_start(self.config, definition, workflow.coordination_id)
        last_step = head.metadata.get(LAST_STEP, "")
        policy = next_policy(self.config, definition, last_step, head.metadata.get(NEXT_STEP, ""))
        wake = Wake("run", input, policy, definition.version)
        wake = partial(self._wake_after_commit, start, wake)
        transaction.on_commit(wake, using=workflow.runs.db)
        return Running(head.state, workflow.coordination_id, last_step)

    def continue_running(self, workflow: ExecutableWorkflow) -> None:
        """A queue handed the run a slot and made it ``running`` (``workflows.queues``):
        signal-with-start its Temporal workflow with a ``dispatch`` wake, which
        continues a running run only. No claim, unlike ``run()``: the run's own step
        activity may be starting at this moment (its report found it ``running``),
        and must not find the run held. A failed signal is logged; the recovery sweep
        wakes the run then."""
        record = workflow.run_record()
        if record is None or record.status != RunStatus.RUNNING:
            return  # cancelled meanwhile, or on its way already
        definition = workflow_registry.get(record.workflow_name, record.workflow_version)
        start = run_start(self.config, definition, workflow.coordination_id)
        policy = next_policy(self.config, definition, *position_of(record))
        self._wake_after_commit(start, Wake("dispatch", policy=policy, version=definition.version))

    def run_changed(self, coordination_id: str, using: str) -> None:
        """A fork: wake the run's Temporal workflow to re-read what it waits for (only
        if one is running: a fork alone starts nothing)."""
        from ...workflows.runs.records import RunRecords

        record = RunRecords(using).get(coordination_id)
        if record is None or record.workflow_name not in workflow_registry:
            return

        async def refresh(client: Any) -> None:
            from temporalio.service import RPCError

            # RPCError: no workflow running for the run, so nothing waits.
            with contextlib.suppress(RPCError):
                await client.get_workflow_handle(coordination_id).signal(
                    WAKE_SIGNAL, Wake("refresh")
                )

        try:
            self.connection.call(refresh)
        except Exception as exc:
            wake_failures.failed(exc)

    def cancelled(self, workflow: ExecutableWorkflow) -> None:
        """The run was cancelled: cancel its Temporal workflow (an activity in flight is
        cancelled at its next heartbeat; its step's result was discarded anyway)."""
        cid = workflow.coordination_id

        async def cancel(client: Any) -> None:
            from temporalio.service import RPCError

            # RPCError: no workflow running for the run, so nothing to cancel.
            with contextlib.suppress(RPCError):
                await client.get_workflow_handle(cid).cancel()

        try:
            self.connection.call(cancel)
        except Exception as exc:
            # The workflow's next activity finds the run cancelled and it ends then.
            wake_failures.failed(exc)

    def wake(self, start: RunStart, wake: Wake) -> None:
        """Signal-with-start the run's Temporal workflow (raises when that fails)."""
        self.connection.call(lambda client: signal_with_start(client, self.config, start, wake))

    def _wake_after_commit(self, start: RunStart, wake: Wake) -> None:
        try:
            self.wake(start, wake)
        except Exception as exc:
            # The next runs go in-process until the server answers a check again.
            self.remember(f"waking run {start.coordination_id} on Temporal failed: {exc}")
            wake_failures.failed(exc)
        else:
            wake_failures.succeeded()
