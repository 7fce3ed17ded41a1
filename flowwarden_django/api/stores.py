"""Which snapshot store the API reads and writes: by alias, or a run's workflow's
(``store_for_workflow``, from the workflow core)."""

from __future__ import annotations

from typing import Any

from ..workflows.engine.workflow import Workflow
from ..workflows.operations.forking import fork_snapshot as fork_snapshot_in_store
from ..workflows.storage.snapshot import WorkflowSnapshot
from ..workflows.storage.store import SnapshotStore, snapshot_stores

DEFAULT_ALIAS = "default"


def store_aliases() -> list[str]:
    """The configured aliases of ``FLOWWARDEN["SNAPSHOT_STORES"]``."""
    return sorted(snapshot_stores)


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
