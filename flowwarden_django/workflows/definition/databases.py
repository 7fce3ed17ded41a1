"""Which databases hold the runs of the workflows this process defines, and a sweep
over each of them that one database's failure does not stop."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..runs.records import RunRecords
from .registry import workflow_registry

Swept = TypeVar("Swept")


def workflow_databases() -> list[str]:
    """Every database alias a workflow this process defines keeps its runs in (each
    version's ``RunRecords(using).db``), sorted; the router's default when none is
    defined."""
    databases = set()
    for name in workflow_registry.names():
        for version in workflow_registry.versions(name):
            try:
                databases.add(RunRecords(workflow_registry.get(name, version).using).db)
            except LookupError:  # undefined meanwhile
                continue
    return sorted(databases or {RunRecords().db})


def in_every_workflow_database(sweep: Callable[[str], Swept]) -> list[Swept]:
    """``sweep(db)`` for each of ``workflow_databases()``, in order; what each returned.
    A database that fails (is down, say) does not keep the others from being swept:
    the first error is raised once they were."""
    results: list[Swept] = []
    failure: Exception | None = None
    for db in workflow_databases():
        try:
            results.append(sweep(db))
        except Exception as exc:
            failure = failure or exc
    if failure is not None:
        raise failure
    return results
