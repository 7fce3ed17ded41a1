"""The registry of workflow definitions, by name (``Workflow.define`` registers).

It sits below the engine: the engine registers ``WorkflowDefinition`` objects, and
code the engine itself uses (approvals, the recovery sweep) reads them back without
importing the engine. What it needs of a definition is the ``RegisteredWorkflow``
protocol: its name, its steps and store, and ``workflow(coordination_id)``, the
factory of one run's ``Workflow``. That factory is how approvals continue a run
after a decision (``workflow_for(cid).run()``): a definition can only be registered
by code that imported the engine, and a run whose workflow this process does not
define is a ``LookupError``, left to a process that defines it.

Definitions are kept by name *and version*: several versions of one workflow can be
defined side by side, ``Workflow.start(name)`` starts runs on the highest, and a run
continues on the version it records (``workflow_for``); a run whose version is not
defined here is ``VersionNotDefinedError``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..runs.records import RunRecords, UnknownRunError
from ..storage.store import SnapshotStore, snapshot_stores

if TYPE_CHECKING:
    from .results import WorkflowResult
    from .steps import WorkflowStep

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
    def version(self) -> int: ...

    @property
    def steps(self) -> Sequence[WorkflowStep]: ...

    @property
    def store(self) -> SnapshotStore | str: ...

    @property
    def using(self) -> str | None: ...

    @property
    def queue(self) -> str | None: ...

    def workflow(self, coordination_id: str, kind: Any = None, **extra: Any) -> Coordination: ...

    def start(
        self,
        initial_state: Any = None,
        *,
        idempotency_key: str | None = None,
        coordination_id: str | None = None,
    ) -> Any: ...


class VersionNotDefinedError(LookupError):
    """A run is on a version of its workflow that this process does not define."""

    def __init__(self, name: str, version: int, defined: Sequence[int], cid: str = "") -> None:
        self.workflow_name = name
        self.version = version
        self.defined = list(defined)
        run = f"run {cid!r} is on " if cid else ""
        super().__init__(
            f"{run}version {version} of workflow {name!r}, which this process does not "
            f"define (defined: {', '.join(map(str, defined)) or 'none'}); define it again "
            f"beside the others (Workflow.define({name!r}, ..., version={version})), or "
            "declare an upgrade from it and run `manage.py flowwarden_workflows upgrade`"
        )


class WorkflowRegistry:
    """Workflow definitions by name and version (``Workflow.define`` registers).
    Thread-safe."""

    def __init__(self) -> None:
        self._definitions: dict[str, dict[int, RegisteredWorkflow]] = {}
        self._lock = threading.Lock()

    def register(self, definition: RegisteredWorkflow) -> None:
        """Add *definition* (a later one with the same name and version replaces it,
        with a warning when its steps differ: the same module imported twice is
        normal)."""
        with self._lock:
            versions = self._definitions.setdefault(definition.name, {})
            previous = versions.get(definition.version)
            if previous is not None and [s.name for s in previous.steps] != [
                s.name for s in definition.steps
            ]:
                logger.warning(
                    "version %d of workflow %r is defined again with other steps; "
                    "give a changed definition a new version (Workflow.define(..., "
                    "version=...)) so that runs of the old one keep their steps",
                    definition.version,
                    definition.name,
                )
            versions[definition.version] = definition

    def unregister(self, name: str, version: int | None = None) -> None:
        """Forget version *version* of *name*, or every version (nothing when there
        is none)."""
        with self._lock:
            if version is None:
                self._definitions.pop(name, None)
                return
            versions = self._definitions.get(name, {})
            versions.pop(version, None)
            if not versions:
                self._definitions.pop(name, None)

    def get(self, name: str, version: int | None = None) -> RegisteredWorkflow:
        """Version *version* of *name* (default: its highest). ``LookupError`` naming
        the known workflows when *name* is not defined, ``VersionNotDefinedError``
        (a ``LookupError``) when that version is not."""
        with self._lock:
            versions = self._definitions.get(name)
            known = sorted(self._definitions)
            if versions:
                found = versions.get(max(versions) if version is None else version)
                defined = sorted(versions)
        if not versions:
            raise LookupError(
                f"no workflow named {name!r} is defined (known: {', '.join(known) or 'none'}); "
                "define it with Workflow.define() in a module your app imports"
            )
        if found is None:
            raise VersionNotDefinedError(name, version or 0, defined)
        return found

    def versions(self, name: str) -> list[int]:
        """The versions of *name* defined here, lowest first (``[]``: none)."""
        with self._lock:
            return sorted(self._definitions.get(name, ()))

    def defines(self, name: str, version: int) -> bool:
        """Whether version *version* of *name* is defined here."""
        with self._lock:
            return version in self._definitions.get(name, ())

    def names(self) -> list[str]:
        """The registered names, sorted."""
        with self._lock:
            return sorted(self._definitions)

    def declared_queues(self) -> dict[tuple[str, int], str]:
        """The queue each version defined here declares (``define(queue=...)``), by
        ``(name, version)``; versions without one are left out."""
        with self._lock:
            return {
                (name, version): queue
                for name, versions in sorted(self._definitions.items())
                for version, definition in sorted(versions.items())
                if (queue := getattr(definition, "queue", None))
            }

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._definitions


#: The process's registered workflow definitions.
workflow_registry = WorkflowRegistry()


def workflow_for(
    coordination_id: str, *, using: str | None = None, mark: bool = True
) -> Coordination:
    """The ``Workflow`` of an existing run: the registered definition of the
    workflow and version its record names. ``UnknownRunError`` / ``LookupError`` when
    the run or its workflow is unknown; ``VersionNotDefinedError`` when its version
    is not defined here (a hibernated run is then marked ``needs_upgrade``, unless
    not *mark*: ``RunRecords.needs_upgrade``)."""
    records = RunRecords(using)
    record = records.get(coordination_id)
    if record is None:
        raise UnknownRunError(f"no workflow run {coordination_id!r}")
    try:
        definition = workflow_registry.get(record.workflow_name, record.workflow_version)
    except VersionNotDefinedError as exc:
        error = VersionNotDefinedError(exc.workflow_name, exc.version, exc.defined, coordination_id)
        if mark:
            records.needs_upgrade(coordination_id, str(error), only_if_idle=True)
        raise error from None
    return definition.workflow(coordination_id)


def store_for_workflow(workflow_name: str) -> SnapshotStore:
    """The snapshot store of a workflow defined in this process, else the ``default``
    alias's (where a run of a workflow defined elsewhere most likely keeps its own)."""
    if workflow_name in workflow_registry:
        store = workflow_registry.get(workflow_name).store
        return snapshot_stores[store] if isinstance(store, str) else store
    return snapshot_stores["default"]
