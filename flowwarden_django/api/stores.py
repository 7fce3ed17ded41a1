"""Which snapshot store the API reads and writes: by alias, or a run's workflow's."""

from __future__ import annotations

from typing import Any

from ..workflows.engine import Workflow, workflow_registry
from ..workflows.forking import fork_snapshot as fork_snapshot_in_store
from ..workflows.snapshot import WorkflowSnapshot
from ..workflows.store import SnapshotStore, snapshot_stores

DEFAULT_ALIAS = "default"


def store_aliases() -> list[str]:
    """The configured aliases of ``FLOWWARDEN["SNAPSHOT_STORES"]``."""
    return sorted(snapshot_stores)


def store_for_workflow(workflow_name: str) -> SnapshotStore:
    """The store of a registered workflow, else the ``default`` alias's."""
    if workflow_name in workflow_registry:
        store = workflow_registry.get(workflow_name).store
        return snapshot_stores[store] if isinstance(store, str) else store
    return snapshot_stores[DEFAULT_ALIAS]


def fork_snapshot(store: SnapshotStore, source: WorkflowSnapshot, state: Any) -> WorkflowSnapshot:
    """Branch off *source* (read from *store*) with *state*.

    Through ``Workflow.fork`` when the run's workflow is registered here and keeps
    its snapshots in *store*; otherwise through the store's own ``fork``.
    ``UnknownSnapshotError`` when the source is gone.
    """
    try:
        workflow = Workflow.for_coordination(source.coordination_id)
    except LookupError:  # no run record, or its workflow is not defined in this process
        workflow = None
    if workflow is not None and workflow.store is store:
        return workflow.fork(source.id, state)
    return fork_snapshot_in_store(store, source.id, state)
