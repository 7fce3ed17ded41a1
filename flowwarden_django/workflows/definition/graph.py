"""Loops and branches: where a step may go, and where a run continues.

A workflow's steps run in their list's order: ``advance(state)`` continues with the
next step, and the last step's completes the run. A step may instead continue at a
named step of the same workflow, earlier (a loop) or later (a branch that skips
steps): ``advance(state, to="poll")``. ``hibernate``, ``sleep`` and ``wait_for``
take ``to=`` too: the run continues there when it wakes. The jump is recorded in the
step's snapshot (``workflow.nextStep``), so where a run continues is decided by its
latest snapshot, as ``workflow.lastStep`` decides it otherwise: a crash, a resume, another worker,
the recovery sweep and an upgrade all continue at the target. The snapshots stay one
chain whose ``seq`` keeps growing; nothing reads the chain behind its head, so the
10,000th pass of a loop costs what the first did.

A step may declare where it goes: ``@step("poll", goes_to=["poll", "ship"])``. The
next step in the list stays allowed (a plain ``advance``); a jump anywhere else fails
the run as a returned ``fail()`` does (not retried, nothing persisted: fix the code
and run it again), with a reason that names the declared targets. Without
``goes_to`` a step may jump to any step. A jump to a step the workflow lacks always
fails the run that way. ``goes_to`` names are checked when the workflow is defined
(``ValueError`` for a name that is not one of its steps), and ``Workflow.graph()``
returns the declared graph (for a diagram, say).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .metadata import FURTHEST_STEP, NEXT_STEP

if TYPE_CHECKING:
    from .steps import WorkflowStep


@dataclasses.dataclass(frozen=True)
class WorkflowGraph:
    """Where each step of a workflow may go (``Workflow.graph()``).

    ``steps``: the step names in the list's order. ``edges``: for each step, the
    steps it may continue at: the next one in the list (none after the last, whose
    plain ``advance`` completes the run), then those its ``goes_to`` declares.
    ``undeclared``: the steps that declare no ``goes_to``; they may jump to any step,
    so their edges show only the next one. Any step may end the run with ``done()``.
    """

    steps: tuple[str, ...]
    edges: Mapping[str, tuple[str, ...]]
    undeclared: frozenset[str] = frozenset()

    def successors(self, step: str) -> tuple[str, ...]:
        """The steps *step* may continue at (``KeyError`` for an unknown step)."""
        return self.edges[step]

    def may_jump_anywhere(self, step: str) -> bool:
        """Whether *step* declares no ``goes_to`` (any step is then allowed)."""
        if step not in self.edges:
            raise KeyError(step)
        return step in self.undeclared


def check_goes_to(value: Any) -> tuple[str, ...] | None:
    """A step's ``goes_to`` as a tuple of non-blank step names (``None``: not
    declared); ``ValueError`` otherwise."""
    if value is None:
        return None
    return non_blank_strings(
        value, "goes_to is a list of step names", "goes_to names steps by non-blank strings"
    )


def non_blank_strings(value: Any, listing: str, item: str) -> tuple[str, ...]:
    """*value*, an iterable of non-blank strings (not a string itself), as a tuple;
    ``ValueError`` otherwise, saying *listing* (what it should be) or *item* (what each
    should be)."""
    if isinstance(value, str):
        raise ValueError(f"{listing}, not the string {value!r}")
    names = tuple(value)
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{item}, not {name!r}")
    return names


def check_jump_target(to: Any) -> str:
    """The ``to=`` of ``advance``, ``hibernate``, ``sleep`` or ``wait_for`` (``""``: no
    jump)."""
    if to is None:
        return ""
    if not isinstance(to, str) or not to.strip():
        raise ValueError(f"to= names a step of the workflow, not {to!r}")
    return to


def check_graph(workflow: str, steps: Sequence[WorkflowStep]) -> None:
    """``ValueError`` when a step's ``goes_to`` names a step *steps* lacks."""
    names = [s.name for s in steps]
    for s in steps:
        for target in s.goes_to or ():
            if target not in names:
                raise ValueError(
                    f"step {s.name!r} of workflow {workflow!r} goes_to {target!r}, which "
                    f"is not one of its steps ({', '.join(names)})"
                )


def graph_of(steps: Sequence[WorkflowStep]) -> WorkflowGraph:
    """The ``WorkflowGraph`` of *steps* (checked ones: ``check_graph``)."""
    edges: dict[str, tuple[str, ...]] = {}
    for index, s in enumerate(steps):
        successors = [steps[index + 1].name] if index + 1 < len(steps) else []
        for target in s.goes_to or ():
            if target not in successors:
                successors.append(target)
        edges[s.name] = tuple(successors)
    undeclared = frozenset(s.name for s in steps if s.goes_to is None)
    return WorkflowGraph(tuple(s.name for s in steps), edges, undeclared)


def step_index(steps: Sequence[WorkflowStep], name: str) -> int | None:
    """The index of step *name* in *steps*, or ``None``."""
    positions = getattr(steps, "positions", None)  # ``checks.CheckedSteps``
    if positions is not None:
        return positions.get(name)
    for index, s in enumerate(steps):
        if s.name == name:
            return index
    return None


def continue_index(
    steps: Sequence[WorkflowStep], last_step: str, next_step: str = ""
) -> int | None:
    """The index of the step a run continues at: *next_step* when its last step
    jumped, else the one after *last_step* (the first when it is ``""``; the length
    of *steps* after the last). ``None`` when the step named is not one of *steps*
    (the run then needs an upgrade: it is never started over)."""
    if next_step:
        return step_index(steps, next_step)
    if not last_step:
        return 0
    index = step_index(steps, last_step)
    return None if index is None else index + 1


def jump_of(outcome: Any) -> str:
    """The step *outcome* (a step's) jumps to, ``""`` for none."""
    return getattr(outcome, "to", "") or ""


def jump_problem(workflow: str, steps: Sequence[WorkflowStep], index: int, target: str) -> str:
    """Why step *index* of *steps* may not continue at *target* (``""``: it may)."""
    current = steps[index]
    if step_index(steps, target) is None:
        return (
            f"step {current.name!r} jumps to {target!r}, which is not a step of workflow "
            f"{workflow!r} (its steps: {', '.join(s.name for s in steps)})"
        )
    following = steps[index + 1].name if index + 1 < len(steps) else None
    if current.goes_to is not None and target not in (*current.goes_to, following):
        declared = ", ".join(repr(name) for name in current.goes_to) or "none"
        return (
            f"step {current.name!r} jumps to {target!r}, which its goes_to does not "
            f"declare (declared: {declared}); add it to goes_to, or jump elsewhere"
        )
    return ""


def furthest_index(steps: Sequence[WorkflowStep], metadata: Mapping[str, str]) -> int | None:
    """The index of the furthest step the run of a snapshot with *metadata* has
    completed, when it recorded one (it has jumped), else ``None``."""
    name = metadata.get(FURTHEST_STEP)
    return None if not name else step_index(steps, name)


def position_metadata(
    steps: Sequence[WorkflowStep], head: Mapping[str, str], index: int, target: str
) -> dict[str, str]:
    """The position entries of the snapshot of step *index*, whose run stood at a
    snapshot with metadata *head*: where it continues when it jumps to *target*, and
    the furthest step the run has completed once it ever jumped."""
    if not target and FURTHEST_STEP not in head:
        return {}  # never jumped: its last step says it all
    furthest = furthest_index(steps, head)
    reached = index if furthest is None else max(furthest, index)
    entries = {FURTHEST_STEP: steps[reached].name}
    if target:
        entries[NEXT_STEP] = target
    return entries
