"""Which snapshot store holds a run's snapshots, and forking a run in it."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.utils.translation import gettext

from ..models import WorkflowRun
from ..workflows.definition.registry import workflow_registry
from ..workflows.operations.forking import fork_snapshot as fork_snapshot_in_store
from ..workflows.storage.store import SnapshotStore, snapshot_stores


@dataclasses.dataclass(frozen=True)
class RunStore:
    """The snapshot store of a run and how the page names it; ``registered`` is
    whether the run's workflow is defined in this process (forks then go through
    ``Workflow.fork``)."""

    store: SnapshotStore
    label: str
    registered: bool


def run_store(workflow_name: str, coordination_id: str, alias: str = "default") -> RunStore:
    """The store of the run's workflow when it is registered, else ``snapshot_stores[alias]``."""
    if workflow_name in workflow_registry:
        store = workflow_registry.get(workflow_name).workflow(coordination_id).store
        label = gettext("the store of workflow “%(name)s” (%(backend)s)") % {
            "name": workflow_name,
            "backend": type(store).__name__,
        }
        return RunStore(store, label, True)
    store = snapshot_stores[alias]
    label = gettext("snapshot store “%(alias)s” (%(backend)s)") % {
        "alias": alias,
        "backend": type(store).__name__,
    }
    return RunStore(store, label, False)


def fork_snapshot(run: WorkflowRun, found: RunStore, snapshot_id: str, state: Any) -> Any:
    """Fork *run* off *snapshot_id* with *state*: ``Workflow.fork`` when the workflow is
    registered (it checks the snapshot belongs to the run), else ``store.fork``."""
    if found.registered and workflow_registry.defines(run.workflow_name, run.workflow_version):
        definition = workflow_registry.get(run.workflow_name, run.workflow_version)
        return definition.workflow(run.coordination_id).fork(snapshot_id, state)
    return fork_snapshot_in_store(found.store, snapshot_id, state)
