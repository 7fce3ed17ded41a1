"""The workflows of ``tests/chaos/test_workflow_outages.py``.

The test process defines them with ``define_workflows(using)`` on the private
PostgreSQL's alias (``"chaos"``); the Celery worker subprocess
(``tests.chaos.celery_chaos_settings``) on its ``default`` database, which is the same
private database: it does so when it imports this module (``CELERY_IMPORTS``).

* ``INPROCESS`` (:data:`INPROCESS_STEPS` steps) and ``CELERY`` (:data:`CELERY_STEPS`
  steps): each step appends one JSON line (coordination, step, pid, wall-clock time) to the file
  named by ``state["log"]``, sleeps ``state["sleep"]`` seconds (so runs are in
  flight when a server goes away), and advances with its name added to
  ``state["trail"]``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from django.conf import settings

from flowwarden_django.workflows import Workflow, WorkflowDefinition, advance, step
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore

INPROCESS = "fw-chaos-inprocess"
CELERY = "fw-chaos-celery"
INPROCESS_STEPS = tuple(f"s{n:02d}" for n in range(1, 11))
CELERY_STEPS = tuple(f"c{n}" for n in range(1, 7))


def executions(log: str) -> list[dict[str, Any]]:
    """The step executions recorded in *log*, in order."""
    try:
        with open(log) as lines:
            return [json.loads(line) for line in lines if line.strip()]
    except FileNotFoundError:
        return []


def _make_step(name: str) -> Any:
    @step(name)
    def run(state: dict[str, Any], ctx: Any) -> Any:
        line = {
            "cid": ctx.coordination_id,
            "step": ctx.step_name,
            "pid": os.getpid(),
            "at": time.time(),
        }
        with open(state["log"], "a") as log:  # one short O_APPEND write per line
            log.write(json.dumps(line) + "\n")
        time.sleep(state.get("sleep", 0.0))
        return advance({**state, "trail": [*state["trail"], name]})

    return run


def define_workflows(using: str) -> dict[str, WorkflowDefinition]:
    """Register the chaos workflows on database *using*; their definitions by name."""
    store = OrmSnapshotStore(using=using)
    return {
        name: Workflow.define(name, [_make_step(s) for s in steps], store, using=using)
        for name, steps in ((INPROCESS, INPROCESS_STEPS), (CELERY, CELERY_STEPS))
    }


if getattr(settings, "FLOWWARDEN_CHAOS_WORKFLOW_DB", None):  # the worker
    define_workflows(settings.FLOWWARDEN_CHAOS_WORKFLOW_DB)
