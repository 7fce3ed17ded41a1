"""What ``Workflow`` and ``WorkflowDefinition`` accept: a workflow's name, its version
and its steps (functions become steps named after them)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .graph import check_graph
from .steps import FunctionStep, StepOutcome, WorkflowStep


def as_step(value: WorkflowStep | Callable[..., StepOutcome]) -> WorkflowStep:
    if isinstance(value, WorkflowStep):
        return value
    if callable(value):
        return FunctionStep(value)
    raise TypeError(f"a workflow step must be a WorkflowStep or a function, not {value!r}")


class CheckedSteps(tuple):
    """Steps ``_check_steps`` accepted: a provider rebuilds a registered workflow for
    every step it runs, without checking them again. ``positions``: each step's index
    by name (``graph.step_index``)."""

    positions: dict[str, int]


def check_steps(name: str, steps: Iterable[Any]) -> tuple[WorkflowStep, ...]:
    if isinstance(steps, CheckedSteps):
        return steps
    checked = CheckedSteps(as_step(s) for s in steps)
    if not checked:
        raise ValueError(f"workflow {name!r} has no steps")
    seen: set[str] = set()
    for s in checked:
        if s.name in seen:
            raise ValueError(f"duplicate step name {s.name!r} in workflow {name!r}")
        seen.add(s.name)
    check_graph(name, checked)
    checked.positions = {s.name: index for index, s in enumerate(checked)}
    return checked


def check_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > 255:
        raise ValueError(f"a workflow name is a non-blank string of <= 255 chars, not {name!r}")
    return name


def check_version(version: object) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"a workflow version is an integer >= 1, not {version!r}")
    return version
