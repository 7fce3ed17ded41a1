"""A workflow's diagram: its steps in order, the jumps they declare (``goes_to``),
the kind each declares (``@step(kind="approval")``), and where a run stands; and
the list of every defined workflow with its versions and its runs by status, for
the admin's "Workflows" page (``workflows_page``).

Plain dataclasses built from ``Workflow.graph()`` (``definition.graph``); the
templates draw them as HTML (``workflowrun/diagram.html``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from django.db.models import Count
from django.utils.translation import gettext_lazy as _

from ..models import WorkflowRun
from ..workflows.definition.graph import continue_index, graph_of, step_index
from ..workflows.definition.registry import RegisteredWorkflow, workflow_registry

Status = WorkflowRun.Status

#: The words of each step kind a definition may declare (``STEP_KINDS``).
KIND_LABELS = {
    "approval": _("approval"),
    "sleep": _("sleep"),
    "spawn": _("spawns child runs"),
    "wait": _("waits for a message"),
}
#: The statuses in which a run stands *at* the step that paused it (not after it).
PAUSED_AT_STEP = {
    Status.WAITING,
    Status.SLEEPING,
    Status.WAITING_CHILDREN,
    Status.WAITING_MESSAGE,
    Status.HIBERNATED,
    Status.FAILED,
}


@dataclasses.dataclass(frozen=True)
class DiagramStep:
    """One step of a diagram: its place, declared kind and jumps, and the run's
    position at it (``""``, ``"here"``: the run paused or failed at it, ``"next"``:
    the run continues with it, ``"passed"``: the run has gone past it)."""

    index: int
    name: str
    kind: str
    next: str
    #: The steps its ``goes_to`` declares besides the next one: (name, ``"back"`` for a
    #: loop to it or an earlier step, ``"ahead"`` for a branch that skips steps).
    jumps: tuple[tuple[str, str], ...]
    jumps_anywhere: bool
    position: str = ""

    @property
    def kind_text(self) -> str:
        return str(KIND_LABELS.get(self.kind, self.kind))


@dataclasses.dataclass(frozen=True)
class Diagram:
    """The steps of version ``version`` of workflow ``name``, in order, with the
    position of run ``run_id`` (``""``: none marked) and its ``run_status``."""

    name: str
    version: int
    steps: tuple[DiagramStep, ...]
    run_id: str = ""
    run_status: str = ""

    @property
    def current(self) -> DiagramStep | None:
        return next((s for s in self.steps if s.position in ("here", "next")), None)


def build_diagram(
    definition: RegisteredWorkflow,
    run: WorkflowRun | None = None,
    *,
    next_step: str = "",
) -> Diagram:
    """The diagram of *definition*, with *run*'s position marked (*next_step*: the
    step its head jumped to, ``workflow.nextStep``, when it did)."""
    steps = definition.steps
    graph = graph_of(steps)
    here, after = _position(steps, run, next_step)
    names = [s.name for s in steps]
    drawn = []
    for index, step in enumerate(steps):
        following = steps[index + 1].name if index + 1 < len(steps) else ""
        jumps = tuple(
            (t, "back" if names.index(t) <= index else "ahead")
            for t in graph.successors(step.name)
            if t != following
        )
        position = ""
        if index == here:
            position = "here"
        elif index == after:
            position = "next"
        elif index < (after if after is not None else here if here is not None else 0):
            position = "passed"
        drawn.append(
            DiagramStep(
                index=index + 1,
                name=step.name,
                kind=getattr(step, "kind", None) or "",
                next=following,
                jumps=jumps,
                jumps_anywhere=graph.may_jump_anywhere(step.name),
                position=position,
            )
        )
    return Diagram(
        definition.name,
        definition.version,
        tuple(drawn),
        run.coordination_id if run is not None else "",
        run.status if run is not None else "",
    )


def _position(
    steps: Sequence[object], run: WorkflowRun | None, next_step: str
) -> tuple[int | None, int | None]:
    """(The step the run stands at, the step it continues with): indexes or ``None``."""
    if run is None or run.status in (Status.COMPLETED, Status.CANCELLED):
        return None, None
    index = continue_index(steps, run.last_step, next_step)  # type: ignore[arg-type]
    if run.status in PAUSED_AT_STEP and run.last_step:
        last = step_index(steps, run.last_step)  # type: ignore[arg-type]
        if run.status == Status.FAILED:  # it failed in the step it would continue with
            return index, None
        return last, index
    return None, index


@dataclasses.dataclass(frozen=True)
class WorkflowEntry:
    """A defined workflow on the "Workflows" page: its versions and its runs' counts
    by status (of all its versions)."""

    name: str
    versions: tuple[int, ...]
    counts: Mapping[str, int]
    steps: int

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def defined_workflows(using: str | None = None) -> list[WorkflowEntry]:
    """Every workflow this process defines, by name, with its runs by status (one
    query for all)."""
    names = workflow_registry.names()
    counts: dict[str, dict[str, int]] = {name: {} for name in names}
    rows = (
        WorkflowRun.objects.using(using)
        .filter(workflow_name__in=names)
        .values_list("workflow_name", "status")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for name, status, n in rows:
        counts[name][status] = n
    entries = []
    for name in sorted(names):
        versions = tuple(workflow_registry.versions(name))
        newest = workflow_registry.get(name)
        entries.append(WorkflowEntry(name, versions, counts[name], len(newest.steps)))
    return entries
