"""The step-execution log of the worker tests: every step of the test workflows appends
one JSON line (coordination, step, pid, and what the caller adds) to the file named by
``state["log"]`` before doing anything else. That is how a test counts executions
across processes and sees a step start."""

from __future__ import annotations

import json
import os
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
    return sum(
        1
        for e in executions(state["log"])
        if (e["cid"], e["step"]) == (ctx.coordination_id, ctx.step_name)
    )


def then(state: dict[str, Any], name: str) -> dict[str, Any]:
    """*state* with *name* appended to its ``trail``."""
    return {**state, "trail": [*state.get("trail", []), name]}
