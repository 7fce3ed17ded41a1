"""The registry of workflow definitions, by name (``Workflow.define`` registers).

It sits below the engine: the engine registers ``WorkflowDefinition`` objects, and
code the engine itself uses (approvals, the recovery sweep) reads them back without
importing the engine. What it needs of a definition is the ``RegisteredWorkflow``
protocol: its name, its steps and store, and ``workflow(coordination_id)``, the
factory of one run's ``Workflow``. That factory is how approvals continue a run
after a decision (``workflow_for(cid).run()``): a definition can only be registered
by code that imported the engine, and a run whose workflow this process does not
define is a ``LookupError``, left to a process that defines it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .runs import RunRecords, UnknownRunError

if TYPE_CHECKING:
    from .results import WorkflowResult
    from .steps import WorkflowStep
    from .store import SnapshotStore

logger = logging.getLogger("flowwarden_django.workflows")


class Coordination(Protocol):
    """One run of a registered workflow, as the modules below the engine use it
    (``engine.Workflow`` is the implementation)."""

    @property
    def store(self) -> SnapshotStore: ...

    def run(self, initial_state: Any = None) -> WorkflowResult: ...


class RegisteredWorkflow(Protocol):
    """What the registry holds (``engine.WorkflowDefinition``, made by
    ``Workflow.define``)."""

    @property
    def name(self) -> str: ...

    @property
    def steps(self) -> Sequence[WorkflowStep]: ...

    @property
    def store(self) -> SnapshotStore | str: ...

    @property
    def using(self) -> str | None: ...

    def workflow(self, coordination_id: str) -> Coordination: ...


class WorkflowRegistry:
    """Workflow definitions by name (``Workflow.define`` registers). Thread-safe."""

    def __init__(self) -> None:
        self._definitions: dict[str, RegisteredWorkflow] = {}
        self._lock = threading.Lock()

    def register(self, definition: RegisteredWorkflow) -> None:
        """Add *definition* (a later one with the same name replaces it, with a warning
        when its steps differ: the same module imported twice is normal)."""
        with self._lock:
            previous = self._definitions.get(definition.name)
            if previous is not None and [s.name for s in previous.steps] != [
                s.name for s in definition.steps
            ]:
                logger.warning("workflow %r is defined again with other steps", definition.name)
            self._definitions[definition.name] = definition

    def unregister(self, name: str) -> None:
        """Forget the definition of *name* (nothing when there is none)."""
        with self._lock:
            self._definitions.pop(name, None)

    def get(self, name: str) -> RegisteredWorkflow:
        """The definition of *name*; ``LookupError`` naming the known ones otherwise."""
        with self._lock:
            definition = self._definitions.get(name)
            known = sorted(self._definitions)
        if definition is None:
            raise LookupError(
                f"no workflow named {name!r} is defined (known: {', '.join(known) or 'none'}); "
                "define it with Workflow.define() in a module your app imports"
            )
        return definition

    def names(self) -> list[str]:
        """The registered names, sorted."""
        with self._lock:
            return sorted(self._definitions)

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._definitions


#: The process's registered workflow definitions.
workflow_registry = WorkflowRegistry()


def workflow_for(coordination_id: str, *, using: str | None = None) -> Coordination:
    """The ``Workflow`` of an existing run, from its record's registered workflow.
    ``UnknownRunError`` / ``LookupError`` when the run or its workflow is unknown."""
    record = RunRecords(using).get(coordination_id)
    if record is None:
        raise UnknownRunError(f"no workflow run {coordination_id!r}")
    return workflow_registry.get(record.workflow_name).workflow(coordination_id)
