"""``versions`` and ``upgrade``: the workflow versions unfinished runs are on, and
moving runs to the version their declared upgrades lead to."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from ...common.formatting import dump_json, format_table
from ...workflows import workflow_registry
from ...workflows.operations.upgrades import UpgradeOutcome, upgrade_runs
from ...workflows.operations.versions import versions_in_use
from ..base import ActionCommand, os_user
from .output import COMMAND


class VersionActions(ActionCommand):
    """``versions`` and ``upgrade`` of ``manage.py flowwarden_workflows``."""

    def handle_versions(self, *, database: str | None, json: bool, **options: Any) -> None:
        rows = versions_in_use(using=database)
        if json:
            self.stdout.write(dump_json([row.as_dict() for row in rows]))
            return
        if not rows:
            self.stdout.write("No unfinished runs.")
            return
        table = [
            (
                row.workflow,
                str(row.version),
                "yes" if row.defined else "NO",
                ", ".join(f"{status} {count}" for status, count in row.statuses.items()),
                row.upgrade,
            )
            for row in rows
        ]
        headers = ("WORKFLOW", "VERSION", "DEFINED HERE", "UNFINISHED RUNS", "UPGRADE")
        for line in format_table(headers, table):
            self.stdout.write(line)
        stranded = [row for row in rows if not row.defined and not row.upgrade]
        if stranded:
            self.stdout.write(
                self.style.WARNING(
                    f"{sum(row.total for row in stranded)} unfinished run(s) are on versions "
                    "this process neither defines nor upgrades: define those versions "
                    "again, or declare upgrades (Workflow.define_upgrade) and run "
                    f"`{COMMAND} upgrade`."
                )
            )

    def handle_upgrade(
        self,
        *,
        workflow: str | None,
        run: list[str] | None,
        limit: int | None,
        dry_run: bool,
        database: str | None,
        json: bool,
        **options: Any,
    ) -> None:
        if workflow is not None and workflow not in workflow_registry:
            raise CommandError(
                f"Workflow {workflow!r} is not defined in this process (defined: "
                f"{', '.join(workflow_registry.names()) or 'none'})."
            )
        verb = "Would upgrade" if dry_run else "Upgraded"
        lines = 0

        def report(outcome: UpgradeOutcome) -> None:
            nonlocal lines
            lines += 1
            if json:
                return
            where = (
                f"v{outcome.from_version} after {outcome.from_step or '(start)'!r} -> "
                f"v{outcome.to_version} after {outcome.to_step or '(start)'!r}"
            )
            if outcome.upgraded:
                then = " and continued it" if outcome.continued else ""
                self.stdout.write(f"[{lines}] {verb} {outcome.coordination_id}: {where}{then}")
            else:
                self.stdout.write(
                    self.style.WARNING(
                        f"[{lines}] Not upgraded {outcome.coordination_id} "
                        f"(v{outcome.from_version}): {outcome.reason}"
                    )
                )

        outcomes = upgrade_runs(
            workflow,
            using=database,
            coordination_ids=run,
            dry_run=dry_run,
            by=os_user(),
            limit=limit,
            progress=report,
        )
        if json:
            self.stdout.write(dump_json([outcome.as_dict() for outcome in outcomes]))
            return
        done = sum(outcome.upgraded for outcome in outcomes)
        if not outcomes:
            self.stdout.write(
                "No run to upgrade: no declared upgrade applies to an unfinished run."
            )
            return
        summary = f"{verb} {done} of {len(outcomes)} run(s)."
        if done < len(outcomes):
            raise CommandError(f"{summary} Fix what is said above and run it again.")
        self.stdout.write(self.style.SUCCESS(summary))
