"""What an action works on: the run rows, the snapshot store and the workflow definition."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError
from django.db import router

from ...models import SnapshotRecord, WorkflowRun
from ...workflows import SnapshotStore, snapshot_stores, workflow_registry
from ...workflows.backends.orm import OrmSnapshotStore
from ...workflows.runs.records import RunRecords


def run_rows(database: str | None) -> Any:
    """The ``WorkflowRun`` rows of *database* (``None``: the router's choice)."""
    return WorkflowRun.objects.using(RunRecords(database).db)


def store_db(store: OrmSnapshotStore) -> str:
    """The database alias of an ORM snapshot store."""
    return store.using or router.db_for_write(SnapshotRecord)


def workflow_definition(name: str, coordination: str) -> Any:
    """The registered definition of workflow *name*, which run *coordination* is a run
    of; a ``CommandError`` that says how to define it when this process does not."""
    if name not in workflow_registry:
        raise CommandError(
            f"Run {coordination!r} is a run of workflow {name!r}, which is not defined in "
            f"this process (defined: {', '.join(workflow_registry.names()) or 'none'}). "
            "Define it with Workflow.define() in an app's workflows.py (imported at "
            "start-up, like admin.py), so that every process sees it: the web process, "
            "the workers and the management commands."
        )
    return workflow_registry.get(name)


def store_for(workflow_name: str | None, alias: str | None) -> tuple[SnapshotStore, str]:
    """The store to read, and how messages name it: ``--store`` when given, else
    the registered workflow's store, else ``"default"``."""
    if alias is None and workflow_name is not None and workflow_name in workflow_registry:
        definition = workflow_registry.get(workflow_name)
        if isinstance(definition.store, SnapshotStore):
            return definition.store, f"the snapshot store of workflow {workflow_name!r}"
        alias = definition.store
    alias = alias or "default"
    try:
        return snapshot_stores[alias], f"snapshot store {alias!r}"
    except ImproperlyConfigured as exc:
        raise CommandError(f"{exc} (see FLOWWARDEN['SNAPSHOT_STORES'])") from exc
