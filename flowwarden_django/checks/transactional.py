"""The check of transactional steps: E212 a defined workflow has a transactional step
(``@step(transactional=True)``) and its snapshots cannot commit with the step's writes
(not the ORM store, or not on the runs' database)."""

from __future__ import annotations

from typing import Any

from django.core import checks


@checks.register()
def check_transactional_steps(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E212 for each defined workflow version whose transactional steps could not
    commit with their snapshots (``workflows.engine.transactional``)."""
    from ..workflows.definition.registry import workflow_registry
    from ..workflows.engine.transactional import store_problem

    messages: list[checks.CheckMessage] = []
    for name in workflow_registry.names():
        for version in workflow_registry.versions(name):
            definition = workflow_registry.get(name, version)
            steps = [s.name for s in definition.steps if s.transactional]
            if not steps:
                continue
            workflow = definition.workflow("flowwarden-check")
            try:
                problem = store_problem(workflow.store, workflow.runs.db)
            except Exception as exc:  # an unknown store alias: the store checks say so
                problem = f"cannot resolve its store ({type(exc).__name__}: {exc})"
            if problem is None:
                continue
            messages.append(
                checks.Error(
                    f"Version {version} of workflow {name!r} has transactional steps "
                    f"({', '.join(map(repr, steps))}): a transactional step {problem}.",
                    hint="Give the workflow an OrmSnapshotStore on the database its runs "
                    "are on (Workflow.define(..., store, using=<that alias>)), or make "
                    "the steps plain ones (transactional=False).",
                    id="flowwarden_django.E212",
                )
            )
    return messages
