"""Which workflow versions the unfinished runs are on, read with one grouped query:
for ``manage.py flowwarden_workflows versions`` and the system check that names the
runs a deploy would strand (``checks``)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from django.db.models import Count

from ...common.app_models import models
from ..definition.registry import workflow_registry
from ..runs.records import RunRecords, RunStatus
from .upgrades import upgrade_registry

#: Every status but completed.
UNFINISHED = (*RunStatus.UPGRADABLE, RunStatus.RUNNING)


@dataclasses.dataclass
class VersionInUse:
    """Unfinished runs of one version of one workflow: how many by status, by the
    step they stand after (as their run records say), whether this process defines
    the version, and the upgrade declared from it (``"to 3"``, or ``""``)."""

    workflow: str
    version: int
    defined: bool
    statuses: dict[str, int] = dataclasses.field(default_factory=dict)
    last_steps: dict[str, int] = dataclasses.field(default_factory=dict)
    upgrade: str = ""

    @property
    def total(self) -> int:
        return sum(self.statuses.values())

    def missing_steps(self) -> dict[str, int]:
        """The steps runs stand after that the defined version lacks, with counts
        (empty when the version is not defined: every step is missing then)."""
        if not self.defined:
            return {}
        names = {s.name for s in workflow_registry.get(self.workflow, self.version).steps}
        return {
            step: count for step, count in self.last_steps.items() if step and step not in names
        }

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "total": self.total}


def versions_in_use(*, using: str | None = None) -> list[VersionInUse]:
    """Every (workflow, version) with unfinished runs, by name then version."""
    rows = (
        models.WorkflowRun.objects.using(RunRecords(using).db)
        # An IN list, not "<> completed": read through the status index, so a table of
        # mostly finished runs costs the check little.
        .filter(status__in=UNFINISHED)
        .values_list("workflow_name", "workflow_version", "status", "last_step")
        .annotate(runs=Count("pk"))
        .order_by()
    )
    found: dict[tuple[str, int], VersionInUse] = {}
    steps: dict[tuple[str, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for name, version, status, last_step, count in rows:
        key = (name, version)
        if key not in found:
            upgrade = upgrade_registry.get(name, version)
            found[key] = VersionInUse(
                name,
                version,
                workflow_registry.defines(name, version),
                upgrade=f"to {upgrade.to_version}" if upgrade else "",
            )
        statuses = found[key].statuses
        statuses[status] = statuses.get(status, 0) + count
        steps[key][last_step] += count
    for key, counts in steps.items():
        found[key].last_steps = dict(counts)
    return [found[key] for key in sorted(found)]
