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

import time
from typing import Any

from django.conf import settings

from flowwarden_django.workflows import Workflow, WorkflowDefinition, advance, step
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from tests.support import step_log

INPROCESS = "fw-chaos-inprocess"
CELERY = "fw-chaos-celery"
INPROCESS_STEPS = tuple(f"s{n:02d}" for n in range(1, 11))
CELERY_STEPS = tuple(f"c{n}" for n in range(1, 7))


def _make_step(name: str) -> Any:
    @step(name)
    def run(state: dict[str, Any], ctx: Any) -> Any:
        step_log.append(state, ctx, at=time.time())
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
