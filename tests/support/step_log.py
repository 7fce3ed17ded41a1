"""The step-execution log of the worker tests: every step of the test workflows appends
one JSON line (coordination, step, pid, and what the caller adds) to the file named by
``state["log"]`` before doing anything else. That is how a test counts executions
across processes and sees a step start. ``assert_chained`` checks the snapshots the
steps left."""

from __future__ import annotations

import json
import os
import time
from typing import Any


def executions(log: str) -> list[dict[str, Any]]:
    """The step executions recorded in *log*, in order."""
    try:
        with open(log) as lines:
            return [json.loads(line) for line in lines if line.strip()]
    except FileNotFoundError:
        return []


def append(state: dict[str, Any], ctx: Any, **extra: Any) -> None:
    """Append this execution to the log."""
    line = {"cid": ctx.coordination_id, "step": ctx.step_name, "pid": os.getpid(), **extra}
    with open(state["log"], "a") as log:  # one short O_APPEND write per line
        log.write(json.dumps(line) + "\n")


def record(state: dict[str, Any], ctx: Any, **extra: Any) -> int:
    """Append this execution to the log; how many times the step has started."""
    append(state, ctx, **extra)
    return count(state, ctx)


def count(state: dict[str, Any], ctx: Any) -> int:
    """How many times the step of *ctx* has started, as its log says."""
    return sum(
        1
        for e in executions(state["log"])
        if (e["cid"], e["step"]) == (ctx.coordination_id, ctx.step_name)
    )


def wait_for_file(path: str, every: float = 0.05) -> None:
    """Wait until *path* exists (a test's cue to end a step)."""
    while not os.path.exists(path):
        time.sleep(every)


def write_effect(state: dict[str, Any], ctx: Any, using: str | None = None) -> None:
    """Write the ``Effect`` row of this execution of a transactional step, before it is
    logged: ``stream`` ``"<cid>:<step>:<pid>"``, ``order_id`` the execution's number
    (as ``record`` will count it), on database *using* (the runs'; default: the
    worker's ``FLOWWARDEN_TEST_WORKFLOW_DB``, else ``default``)."""
    from django.conf import settings

    from tests.testapp.models import Effect

    # A worker's runs are on its FLOWWARDEN_TEST_WORKFLOW_DB.
    using = using or getattr(settings, "FLOWWARDEN_TEST_WORKFLOW_DB", None) or "default"
    stream = f"{ctx.coordination_id}:{ctx.step_name}:{os.getpid()}"
    Effect.objects.using(using).create(order_id=count(state, ctx) + 1, stream=stream)


def assert_committed_once(cid: str, step: str, log: str, using: str, execution: int) -> None:
    """Run *cid*'s step *step* committed exactly one ``Effect`` row (``write_effect``):
    its execution number *execution*'s, in the process that logged it."""
    from tests.testapp.models import Effect

    ran = [e for e in executions(log) if (e["cid"], e["step"]) == (cid, step)]
    rows = Effect.objects.using(using).filter(stream__startswith=f"{cid}:{step}:")
    committed = sorted(rows.values_list("stream", "order_id"))
    assert committed == [(f"{cid}:{step}:{ran[execution - 1]['pid']}", execution)], committed


def then(state: dict[str, Any], name: str) -> dict[str, Any]:
    """*state* with *name* appended to its ``trail``."""
    return {**state, "trail": [*state.get("trail", []), name]}


def assert_chained(wf: Any, steps: list[str]) -> None:
    """*wf*'s snapshots are one chain: the seed and one snapshot per step of *steps*,
    each the child of the one before, at consecutive ``seq``."""
    from flowwarden_django.workflows.definition.metadata import LAST_STEP

    history = wf.history()
    assert [s.seq for s in history] == list(range(1, len(steps) + 2))
    assert [s.metadata[LAST_STEP] for s in history] == ["", *steps]
    assert history[0].parent_id is None
    assert [s.parent_id for s in history[1:]] == [s.id for s in history[:-1]]


def define_versions(
    versioned: dict[tuple[str, int], Any], using: str, versions: tuple[int, ...]
) -> dict[tuple[str, int], Any]:
    """Register *versions* of the *versioned* workflows (``{(name, version): steps
    factory}``) on database *using*, each on an ORM store there."""
    from flowwarden_django.workflows import Workflow
    from flowwarden_django.workflows.backends.orm import OrmSnapshotStore

    store = OrmSnapshotStore(using=using)
    return {
        (name, version): Workflow.define(name, steps(), store, using=using, version=version)
        for (name, version), steps in versioned.items()
        if version in versions
    }
