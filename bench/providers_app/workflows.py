"""The workflow of ``bench/workflow_providers.py``: 20 trivial steps on the ORM snapshot
store of the ``default`` database (the benchmark's PostgreSQL database in every process).

Each step increments the state's counter and records the id of the process that ran it,
so the benchmark can check that every run was executed where its provider says (the
benchmark process, the Celery worker or the Temporal worker), not in a fallback.
"""

from __future__ import annotations

import os
from typing import Any

from flowwarden_django.workflows import Workflow, WorkflowStep, advance, step
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore

NAME = "bench.providers"
STEPS = 20
USING = "default"


def _make(number: int) -> WorkflowStep:
    @step(f"s{number:02d}")
    def bump(state: dict[str, Any]) -> Any:
        return advance({**state, "n": state["n"] + 1, "pid": os.getpid()})

    return bump


BENCH = Workflow.define(
    NAME,
    [_make(number) for number in range(1, STEPS + 1)],
    OrmSnapshotStore(using=USING),
    using=USING,
)

#: The same workflow with every step marked short: on Temporal, local activities.
SHORT_NAME = "bench.providers.short"


def _make_short(number: int) -> WorkflowStep:
    @step(f"s{number:02d}", short=True)
    def bump(state: dict[str, Any]) -> Any:
        return advance({**state, "n": state["n"] + 1, "pid": os.getpid()})

    return bump


SHORT = Workflow.define(
    SHORT_NAME,
    [_make_short(number) for number in range(1, STEPS + 1)],
    OrmSnapshotStore(using=USING),
    using=USING,
)
