"""Starting a registered workflow's run at most once per idempotency key: the run row
and its seed, then the run through the execution provider (``WorkflowDefinition.start``)."""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any, cast

from django.db import connections, transaction

from ..definition.registry import VersionNotDefinedError, workflow_for
from ..definition.results import Running, StartedRun, WorkflowResult
from ..execution.providers import ExecutionUnavailableError
from ..runs.records import ConcurrentRunError
from .opening import create_seeded, point_at_head

if TYPE_CHECKING:
    from .workflow import Workflow, WorkflowDefinition

logger = logging.getLogger("flowwarden_django.workflows")


def start_run(
    definition: WorkflowDefinition,
    initial_state: Any = None,
    *,
    idempotency_key: str | None = None,
    coordination_id: str | None = None,
    placed: dict[str, Any] | None = None,
) -> StartedRun:
    """``WorkflowDefinition.start`` (see there); *placed*: its queue fields
    (``queues.placing``), written with the run."""
    cid = coordination_id or uuid.uuid4().hex
    wf = definition.workflow(cid)
    runs = wf.runs
    started = create_seeded(wf, runs, initial_state, idempotency_key, placed)
    if started is not None:
        record, created = started[1], True
        wf.started_with = started
    else:
        with transaction.atomic(using=runs.db):
            record, created = runs.create(
                cid,
                definition.name,
                idempotency_key=idempotency_key,
                workflow_version=definition.version,
            )
            if created:
                if placed:  # its queue: in the same transaction as the run
                    runs.place(cid, placed)
                    for name, value in placed.items():
                        setattr(record, name, value)
                wf.started_with = (point_at_head(wf, runs, record, initial_state), record)
    if not created:
        try:
            existing = workflow_for(record.coordination_id, using=runs.db, mark=False)
        except VersionNotDefinedError:  # started on a version this code lacks
            return StartedRun(record.coordination_id, False, None)
        result = cast("Workflow", existing).current_result()
        return StartedRun(record.coordination_id, False, result)
    connection = connections[runs.db]
    if connection.in_atomic_block:
        transaction.on_commit(lambda: run_started(wf), using=runs.db)
        return StartedRun(cid, True, Running(initial_state, cid, ""))
    return StartedRun(cid, True, run_started(wf))


def run_started(workflow: Workflow) -> WorkflowResult:
    """Run a run just started, through the execution provider."""
    try:
        return workflow.run()
    except ExecutionUnavailableError as exc:
        # Recorded and seeded: the recovery sweep continues it once the provider answers.
        logger.warning("workflow %s (%s) was started but not run: %s", workflow.name, workflow, exc)
        return workflow.current_result() or Running(None, workflow.coordination_id, "")
    except ConcurrentRunError:
        # Someone else is driving the run we just created: it is running, not lost.
        logger.info("workflow %s (%s) was started and is run elsewhere", workflow.name, workflow)
        return workflow.current_result() or Running(None, workflow.coordination_id, "")
