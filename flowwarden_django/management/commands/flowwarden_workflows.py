"""``manage.py flowwarden_workflows``: list, show, resume, cancel, fork, prune and
upgrade workflow runs, and the versions they are on.

A thin layer over the workflow API: ``WorkflowRun`` rows for the runs, the snapshot
stores of ``FLOWWARDEN["SNAPSHOT_STORES"]`` for their history, and the registered
workflow definitions (``Workflow.define``) to resume them. Snapshots are read from
the store of the run's registered workflow, else from ``--store`` (default
``"default"``).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError, CommandParser
from django.db import router
from django.db.models import Count
from django.utils import timezone

from ...common.durations import parse_duration
from ...common.formatting import (
    NONE_TEXT,
    age_text,
    dump_json,
    format_table,
    timestamp_text,
    truncate,
)
from ...common.user_input import (
    MAX_PAYLOAD_BYTES,
    MAX_STATE_BYTES,
    UserJSONError,
    parse_user_json,
)
from ...models import SnapshotRecord, WorkflowRun
from ...workflows import (
    Cancelled,
    CheckpointQuery,
    Completed,
    ConcurrentRunError,
    Failed,
    Hibernated,
    NeedsUpgrade,
    RunStatus,
    Sleeping,
    SnapshotStore,
    UnknownSnapshotError,
    VersionNotDefinedError,
    Workflow,
    WorkflowResult,
    WorkflowSnapshot,
    snapshot_stores,
    workflow_registry,
)
from ...workflows.backends.orm import OrmSnapshotStore
from ...workflows.definition.metadata import CANCELLED, LAST_STEP
from ...workflows.operations.upgrades import UpgradeOutcome, upgrade_runs
from ...workflows.operations.versions import versions_in_use
from ...workflows.runs.records import RunRecords
from ...workflows.storage.retention import PruneRow, plan_prune
from ...workflows.storage.snapshot import Saved, SnapshotEvent
from ...workflows.waiting.cancellation import cancel_coordination
from ..base import ActionCommand, confirmed, non_negative_int, os_user, positive_int

COMMAND = "manage.py flowwarden_workflows"
LIST_HEADERS = (
    "COORDINATION",
    "WORKFLOW",
    "STATUS",
    "LAST STEP",
    "SNAPSHOTS",
    "STARTED",
    "UPDATED",
)
STATUSES = tuple(WorkflowRun.Status.values)
#: ``--older-than`` units, in seconds.
#: The longest ``--older-than``: older than anything a database keeps.
MAX_AGE = timedelta(days=36500)
#: Snapshots per page when a store is read through ``list``.
PAGE = 500


class Command(ActionCommand):
    """Operators' view of workflow runs and their snapshot trees."""

    database_subject = "The workflow tables"

    help = (
        "Inspect and operate workflow runs: list them, show one with its snapshot tree, "
        "resume a paused or failed run, fork a snapshot with a new state, prune old snapshots."
    )
    # A misconfigured store must not stop operators from inspecting the runs; store
    # errors are reported by this command itself.
    requires_system_checks: list[str] = []

    #: Seconds between progress lines of long-running actions (prune).
    progress_interval = 2.0

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(
            dest="action", required=True, title="actions", metavar="ACTION"
        )

        listing = actions.add_parser("list", help="Show the runs, newest first.")
        listing.add_argument(
            "--status", choices=STATUSES, metavar="STATUS", help=f"One of: {', '.join(STATUSES)}."
        )
        listing.add_argument("--workflow", metavar="NAME", help="Only runs of this workflow.")
        listing.add_argument(
            "--limit",
            type=non_negative_int,
            default=50,
            metavar="N",
            help="Show at most N runs (default 50; 0 = all).",
        )
        listing.add_argument("--json", action="store_true", help="Print a JSON list.")

        show = actions.add_parser("show", help="Show a run and its snapshot tree.")
        show.add_argument("coordination", metavar="COORDINATION", help="The coordination id.")
        show.add_argument("--json", action="store_true", help="Print a JSON object.")
        show.add_argument("--state", action="store_true", help="Show each snapshot's state.")

        resume = actions.add_parser(
            "resume",
            help="Continue a paused (hibernated, waiting) or failed run in this process.",
        )
        resume.add_argument("coordination", metavar="COORDINATION", help="The coordination id.")
        resume.add_argument(
            "--input",
            metavar="JSON",
            help="Handed to the next step as ctx.input, as JSON: '{\"approved\": true}'.",
        )

        cancel = actions.add_parser(
            "cancel",
            help="Cancel runs: they never run another step (a step running now finishes "
            "and its result is discarded); their pending approvals are cancelled.",
        )
        cancel.add_argument(
            "coordinations", nargs="+", metavar="COORDINATION", help="The coordination ids."
        )
        cancel.add_argument(
            "--reason", default="", metavar="TEXT", help="Why (kept on the run and audited)."
        )

        fork = actions.add_parser(
            "fork",
            help="Branch a run off one of its snapshots with a new state; the run continues "
            "from the fork at its next run or resume.",
        )
        fork.add_argument("snapshot_id", metavar="SNAPSHOT_ID", help="The snapshot to fork.")
        fork.add_argument(
            "--state", required=True, metavar="JSON", help="The fork's state, as JSON."
        )

        prune = actions.add_parser(
            "prune",
            help="Delete old snapshots. Never deleted: each run's newest snapshot, the "
            "ancestors of a kept fork, the head of a run waiting for approval.",
        )
        prune.add_argument(
            "--keep-last",
            type=positive_int,
            metavar="N",
            help="Keep each coordination's N newest snapshots.",
        )
        prune.add_argument(
            "--older-than",
            metavar="AGE",
            help="Delete only snapshots older than AGE: a number with s, m, h, d or w (30d).",
        )
        prune.add_argument("--coordination", metavar="C", help="Only this coordination.")
        prune.add_argument(
            "--dry-run", action="store_true", help="Show what would be deleted; delete nothing."
        )

        recover = actions.add_parser(
            "recover",
            help="Continue running runs that stalled (no live claim, unchanged for AGE): "
            "a process or message lost mid-run.",
        )
        recover.add_argument(
            "--older-than",
            metavar="AGE",
            help="How long a run must be unchanged (default: "
            "FLOWWARDEN['WORKFLOW_RECOVER_AFTER'], 10s).",
        )
        recover.add_argument("--limit", type=positive_int, default=100, metavar="N")
        recover.add_argument(
            "--every",
            metavar="INTERVAL",
            nargs="?",
            const="",
            help="Keep sweeping, every INTERVAL (default: "
            "FLOWWARDEN['WORKFLOW_SWEEP_INTERVAL'], 2s) until Ctrl-C or SIGTERM: "
            "the sweep of in-process runs, under your process manager.",
        )
        recover.add_argument(
            "--dry-run", action="store_true", help="List the stalled runs; change nothing."
        )

        upgrade = actions.add_parser(
            "upgrade",
            help="Move unfinished runs to the version their declared upgrades lead to "
            "(Workflow.define_upgrade); runs stopped as needs_upgrade then continue.",
        )
        upgrade.add_argument("--workflow", metavar="NAME", help="Only runs of this workflow.")
        upgrade.add_argument(
            "--run", action="append", metavar="COORDINATION", help="Only this run (repeatable)."
        )
        upgrade.add_argument("--limit", type=positive_int, metavar="N", help="At most N runs.")
        upgrade.add_argument(
            "--dry-run",
            action="store_true",
            help="Show each run's new version, position and whether its state converts; "
            "change nothing.",
        )
        upgrade.add_argument("--json", action="store_true", help="Print a JSON list.")

        versions = actions.add_parser(
            "versions",
            help="The workflow versions the unfinished runs are on, and whether this "
            "process defines them.",
        )
        versions.add_argument("--json", action="store_true", help="Print a JSON list.")

        reencrypt = actions.add_parser(
            "reencrypt",
            help="Bind legacy enc:v1 snapshot values to their run (re-encrypt them as "
            "enc:v2); the ORM store refuses enc:v1 values until then.",
        )

        for sub in (listing, show, resume, cancel, recover, upgrade, versions):
            sub.add_argument(
                "--database",
                metavar="ALIAS",
                help="The database of the WorkflowRun rows (default: the router's choice; "
                "for recover, every database a defined workflow uses).",
            )
        for sub in (listing, show, fork, prune, reencrypt):
            default = (
                "the store of the run's registered workflow, else 'default'"
                if sub in (listing, show)
                else "'default'"
            )
            sub.add_argument(
                "--store",
                metavar="ALIAS",
                help=f"The alias in FLOWWARDEN['SNAPSHOT_STORES'] (default: {default}).",
            )
        for sub in (fork, prune, reencrypt, cancel):
            sub.add_argument(
                "-y", "--yes", action="store_true", help="Do not ask for confirmation."
            )
            sub.add_argument(
                "--no-input",
                "--noinput",
                action="store_false",
                dest="interactive",
                help="Do not ask for confirmation (same as --yes).",
            )

    # -- versions and upgrades -----------------------------------------------------

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

    # -- reencrypt -----------------------------------------------------------------

    def handle_reencrypt(self, *, store: str | None, **options: Any) -> None:
        backend, where = self._store_for(None, store)
        rebind = getattr(backend, "reencrypt_legacy", None)
        if rebind is None or not backend.encrypts_at_rest:
            raise CommandError(
                f"{where} ({type(backend).__name__}) does not encrypt with enc:v1 values "
                "to bind; name an encrypting OrmSnapshotStore with --store ALIAS."
            )
        self.stdout.write(
            f"Re-encrypt the legacy enc:v1 values of {where} as enc:v2, each bound to the "
            "run its row is in now."
        )
        if not self._confirmed("Re-encrypt", **options):
            return
        total = 0
        started = time.monotonic()
        for batch in rebind():
            total += batch
            self.stdout.write(
                f"  {total} snapshots re-encrypted ({time.monotonic() - started:.0f}s)"
            )
        self.stdout.write(
            self.style.SUCCESS(
                f"Re-encrypted {total} snapshot{'s' if total != 1 else ''} in {where}; "
                "none holds an enc:v1 value any more."
            )
        )

    # -- recover -------------------------------------------------------------------

    def handle_recover(
        self,
        *,
        older_than: str | None,
        limit: int,
        dry_run: bool,
        database: str | None,
        every: str | None = None,
        **options: Any,
    ) -> None:
        """Hand each stalled run to the configured execution provider (in this process,
        or as a Celery step task), as the ``recover_workflows`` beat task does."""
        from ...workflows.definition.databases import workflow_databases
        from ...workflows.operations.recovery import (
            recover_in_every_database,
            recover_stalled_runs,
            stalled_runs,
        )

        age = None if older_than is None else _parse_age(older_than)
        if dry_run:
            databases = [database] if database else workflow_databases()
            runs = [
                r for db in databases for r in stalled_runs(older_than=age, using=db, limit=limit)
            ]
            now = timezone.now()
            for run in runs:
                self.stdout.write(
                    f"{run.coordination_id}  {run.workflow_name}  after step "
                    f"{run.last_step or '(seed)'}  unchanged for {age_text(run.updated_at, now)}"
                )
            self.stdout.write(f"{len(runs)} stalled run(s); nothing changed (--dry-run).")
            return

        def continue_run(run: WorkflowRun) -> None:
            self.stdout.write(f"Continuing {run.coordination_id} ({run.workflow_name})...")
            try:
                workflow = Workflow.for_coordination(run.coordination_id, using=run._state.db)
                result = workflow.run()
            except ConcurrentRunError as exc:  # a live runner got there first
                self.stdout.write(f"  not continued: {exc}")
                return
            self.stdout.write(f"  {type(result).__name__}")

        def sweep() -> list[str]:
            if database is None:  # every database a defined workflow keeps its runs in
                return recover_in_every_database(continue_run, older_than=age, limit=limit)
            return recover_stalled_runs(continue_run, older_than=age, using=database, limit=limit)

        if every is None:
            recovered = sweep()
            self.stdout.write(self.style.SUCCESS(f"{len(recovered)} stalled run(s) continued."))
            return
        self._sweep_forever(sweep, _parse_interval(every))

    def _sweep_forever(self, sweep: Any, interval: float) -> None:
        """``recover --every``: sweep every *interval* seconds until SIGTERM or Ctrl-C,
        a line per run continued; a failing sweep is reported and tried again."""
        from ...workflows.operations.sweeper import SweepThread

        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        runner = SweepThread(sweep, interval)
        self.stdout.write(f"Sweeping for stalled runs every {interval:g} s (Ctrl-C to stop).")
        total = 0
        while not stop.wait(interval):
            total += len(runner.run_once())
        self.stdout.write(self.style.SUCCESS(f"Stopped; {total} stalled run(s) continued."))

    # -- list ----------------------------------------------------------------------

    def handle_list(
        self,
        *,
        status: str | None,
        workflow: str | None,
        limit: int,
        json: bool,
        database: str | None,
        store: str | None,
        **options: Any,
    ) -> None:
        runs = _runs(database)
        if status:
            runs = runs.filter(status=status)
        if workflow:
            runs = runs.filter(workflow_name=workflow)
        runs = runs.order_by("-created_at", "-coordination_id")
        records = list(runs[:limit] if limit else runs)
        counts = self._snapshot_counts(records, store)
        if json:
            self.stdout.write(
                dump_json(
                    [{**_run_json(r), "snapshots": counts.get(r.coordination_id)} for r in records]
                )
            )
            return
        if not records:
            filters = [f"status {status!r}"] if status else []
            filters += [f"workflow {workflow!r}"] if workflow else []
            where = f" with {' and '.join(filters)}" if filters else ""
            self.stdout.write(f"No workflow runs{where}.")
            return
        now = timezone.now()
        rows = [
            (
                r.coordination_id,
                r.workflow_name,
                r.status,
                r.last_step or NONE_TEXT,
                _count_text(counts.get(r.coordination_id)),
                age_text(r.created_at, now),
                age_text(r.updated_at, now),
            )
            for r in records
        ]
        header, *lines = format_table(LIST_HEADERS, rows)
        self.stdout.write(self.style.MIGRATE_HEADING(header))
        for line in lines:
            self.stdout.write(line)
        if limit and len(records) == limit:
            self.stdout.write(f"(the newest {limit}; --limit 0 shows all)")

    def _snapshot_counts(
        self, records: list[WorkflowRun], store_alias: str | None
    ) -> dict[str, int | None]:
        """Snapshots per coordination: one query per ORM store, ``list`` otherwise;
        ``None`` where the store cannot be read."""
        by_store: dict[int, tuple[SnapshotStore, list[str]]] = {}
        counts: dict[str, int | None] = {}
        for record in records:
            try:
                store, _ = self._store_for(record.workflow_name, store_alias)
            except CommandError:
                counts[record.coordination_id] = None
                continue
            by_store.setdefault(id(store), (store, []))[1].append(record.coordination_id)
        for store, cids in by_store.values():
            if isinstance(store, OrmSnapshotStore):
                grouped = (
                    SnapshotRecord.objects.using(_store_db(store))
                    .filter(coordination_id__in=cids)
                    .values_list("coordination_id")
                    .annotate(n=Count("pk"))
                )
                found = dict(grouped)
                counts.update({cid: found.get(cid, 0) for cid in cids})
            else:
                for cid in cids:
                    counts[cid] = len(store.list(CheckpointQuery.for_coordination(cid)))
        return counts

    # -- show ----------------------------------------------------------------------

    def handle_show(
        self,
        *,
        coordination: str,
        json: bool,
        state: bool,
        database: str | None,
        store: str | None,
        **options: Any,
    ) -> None:
        record = RunRecords(database).get(coordination)
        backend, where = self._store_for(record.workflow_name if record else None, store)
        snapshots = backend.list(CheckpointQuery.for_coordination(coordination))
        if record is None and not snapshots:
            raise CommandError(
                f"No workflow run {coordination!r} and no snapshots of it in {where}. "
                f"Run `{COMMAND} list` to see the runs"
                + ("" if store else ", or pass --store ALIAS to look in another store")
                + "."
            )
        tree = snapshot_tree(snapshots)
        head = max(snapshots, key=_seq) if snapshots else None
        if json:
            self.stdout.write(
                dump_json(
                    {
                        "run": None if record is None else _run_json(record),
                        "snapshots": [
                            _snapshot_json(s, depth, fork, with_state=state)
                            for depth, fork, s in sorted(tree, key=lambda item: _seq(item[2]))
                        ],
                    }
                )
            )
            return
        now = timezone.now()
        for label, value in _run_fields(record, coordination, now):
            self.stdout.write(f"{self.style.MIGRATE_LABEL(f'{label}:'.ljust(17))} {value}")
        self.stdout.write("")
        self.stdout.write(self.style.MIGRATE_HEADING(f"Snapshots ({len(snapshots)}):"))
        if not snapshots:
            self.stdout.write(f"  none in {where}")
            return
        seq_width = max(len(str(_seq(s))) for s in snapshots) + 1
        step_width = max(len(_step_text(s)) for s in snapshots)
        by_id = {s.id: s for s in snapshots}
        for depth, fork, snapshot in tree:
            indent = "  " + "    " * depth
            marker = "└─ " if fork else ("   " if depth else "")
            notes = []
            if fork and snapshot.parent_id in by_id:
                notes.append(f"fork of #{_seq(by_id[snapshot.parent_id])}")
            elif snapshot.parent_id is not None and snapshot.parent_id not in by_id:
                notes.append(f"parent {snapshot.parent_id} is gone")
            if snapshot is head:
                notes.append("head")
            self.stdout.write(
                f"{indent}{marker}{f'#{_seq(snapshot)}'.ljust(seq_width)}  "
                f"{_step_text(snapshot).ljust(step_width)}  {snapshot.id}  "
                f"{timestamp_text(snapshot.created_at, now)}"
                + (f"  ({', '.join(notes)})" if notes else "")
            )
            if state:
                pad = " " * (len(indent) + (3 if fork or depth else 0) + seq_width + 2)
                self.stdout.write(f"{pad}state: {_state_text(snapshot.state)}")

    # -- resume --------------------------------------------------------------------

    def handle_resume(
        self, *, coordination: str, input: str | None, database: str | None, **options: Any
    ) -> None:
        payload = _parse_json("--input", input, MAX_PAYLOAD_BYTES)
        record = RunRecords(database).get(coordination)
        if record is None:
            raise CommandError(
                f"No workflow run {coordination!r}. Run `{COMMAND} list` to see the runs."
            )
        self._definition(record.workflow_name, coordination)
        try:
            workflow = Workflow.for_coordination(coordination, using=database)
        except VersionNotDefinedError as exc:
            raise CommandError(
                f"{exc}. `{COMMAND} upgrade --dry-run` shows what a declared upgrade "
                "would do to it."
            ) from exc
        if record.status in RunStatus.FINAL:
            self.stdout.write(f"Run {coordination!r} is {record.status}: nothing to resume.")
            return
        waiting = record.status == RunStatus.WAITING
        if waiting and payload is not None and _pending_approval(coordination, database):
            raise CommandError(_waiting_for_a_decision(coordination, database))
        self.stdout.write(
            f"Resuming run {coordination!r} of workflow {record.workflow_name!r} "
            f"({record.status}, after step {record.last_step or '(start)'!r})"
            + (" with input" if payload is not None else "")
            + "..."
        )
        started = time.monotonic()
        progress = _StepProgress(self, workflow.store, coordination, started)
        workflow.store.add_listener(progress)
        try:
            result = workflow.resume(input=payload)
        except ConcurrentRunError as exc:
            raise CommandError(
                f"{exc}. Wait until it finishes or its lease runs out, then resume again."
            ) from exc
        finally:
            workflow.store.remove_listener(progress)
        self._report(result, progress.steps, time.monotonic() - started)

    def _report(self, result: WorkflowResult, steps: int, elapsed: float) -> None:
        cid = result.coordination_id
        done = f"{steps} step{'s' if steps != 1 else ''} in {elapsed:.1f}s"
        if isinstance(result, Completed):
            self.stdout.write(self.style.SUCCESS(f"Run {cid!r} completed ({done})."))
        elif isinstance(result, Hibernated) and result.status == RunStatus.WAITING:
            self.stdout.write(
                self.style.WARNING(
                    f"Run {cid!r} is waiting for approval after step {result.last_step_name!r} "
                    f"({done}). {_how_to_continue(cid)}"
                )
            )
        elif isinstance(result, Sleeping):
            self.stdout.write(
                f"Run {cid!r} sleeps after step {result.last_step_name!r} ({done}) until "
                f"{timestamp_text(result.wake_at, timezone.now())}; the sweep continues it "
                f"then, or `{COMMAND} resume {cid}` now."
            )
        elif isinstance(result, Hibernated):
            self.stdout.write(
                f"Run {cid!r} hibernated after step {result.last_step_name!r} ({done}). "
                f"Continue it with `{COMMAND} resume {cid}`."
            )
        elif isinstance(result, Cancelled):
            raise CommandError(
                f"Run {cid!r} is cancelled ({result.reason or 'no reason given'}): it never "
                "runs another step."
            )
        elif isinstance(result, NeedsUpgrade):
            raise CommandError(
                f"Run {cid!r} needs an upgrade ({done}): {result.reason}. Nothing ran; "
                f"`{COMMAND} upgrade --dry-run` shows what a declared upgrade would do."
            )
        elif isinstance(result, Failed):
            raise CommandError(
                f"Run {cid!r} failed at step {result.last_step_name!r} ({done}): "
                f"{result.reason}. Fix the cause, then `{COMMAND} resume {cid}` runs the "
                "step again."
            )
        else:
            self.stdout.write(
                f"Run {cid!r} is running ({done}): its next step was handed to the execution "
                f"provider. Follow it with `{COMMAND} show {cid}`."
            )

    # -- cancel --------------------------------------------------------------------

    def handle_cancel(
        self, *, coordinations: list[str], reason: str, database: str | None, **options: Any
    ) -> None:
        runs = RunRecords(database)
        records = {cid: runs.get(cid) for cid in dict.fromkeys(coordinations)}
        unknown = [cid for cid, record in records.items() if record is None]
        if unknown:
            raise CommandError(
                f"No workflow run {', '.join(map(repr, unknown))}; nothing was cancelled. "
                f"Run `{COMMAND} list` to see the runs."
            )
        self.stdout.write(f"Cancelling {len(records)} run(s): they never run another step.")
        if not confirmed(
            self, "Cancelling", yes=options["yes"], interactive=options["interactive"]
        ):
            return
        by = os_user()
        cancelled = 0
        for cid in records:
            outcome = cancel_coordination(cid, reason, by=by, using=database)
            if outcome.cancelled:
                cancelled += 1
                approvals = f", {len(outcome.approvals)} approval(s) cancelled" * bool(
                    outcome.approvals
                )
                self.stdout.write(f"Cancelled {cid!r}{approvals}.")
            else:
                self.stdout.write(f"Run {cid!r} is already {outcome.status}: left alone.")
        self.stdout.write(self.style.SUCCESS(f"{cancelled} run(s) cancelled."))

    # -- fork ----------------------------------------------------------------------

    def handle_fork(
        self, *, snapshot_id: str, state: str, store: str | None, **options: Any
    ) -> None:
        new_state = _parse_json("--state", state)
        backend, where = self._store_for(None, store)
        source = backend.load(snapshot_id)
        if source is None:
            raise CommandError(
                f"No snapshot {snapshot_id!r} in {where}. "
                f"`{COMMAND} show COORDINATION` lists a run's snapshot ids"
                + ("" if store else "; pass --store ALIAS for another store")
                + "."
            )
        cid = source.coordination_id
        record = RunRecords(None).get(cid)
        head = backend.latest(cid)
        now = timezone.now()
        self.stdout.write(
            f"Fork snapshot {source.id} (#{_seq(source)}, after step "
            f"{_step_text(source)!r}) of coordination {cid!r} in {where}."
        )
        self.stdout.write(f"  current state: {_state_text(source.state)}")
        self.stdout.write(f"  new state:     {_state_text(new_state)}")
        if head is not None:
            self.stdout.write(
                f"The fork becomes the newest snapshot (#{_seq(head) + 1}, after "
                f"#{_seq(head)}): the run's next run or resume continues from it, at the step "
                f"after {_step_text(source)!r}."
            )
        if (
            record is not None
            and record.runner
            and record.claimed_until
            and (record.claimed_until > now)
        ):
            self.stdout.write(
                self.style.WARNING(
                    f"Runner {record.runner} holds the run until "
                    f"{record.claimed_until.isoformat()}: its next step will fail (another "
                    "snapshot took its place) and it will stop."
                )
            )
        if not self._confirmed("Fork", **options):
            return
        try:
            child = backend.fork(source.id, new_state)
        except UnknownSnapshotError as exc:  # deleted since it was loaded
            raise CommandError(f"{exc}; it was deleted meanwhile.") from exc
        except (TypeError, ValueError) as exc:
            raise CommandError(f"The store refused the new state: {exc}.") from exc
        self.stdout.write(
            self.style.SUCCESS(
                f"Forked {source.id} as {child.id} (#{child.seq}) in coordination {cid!r}."
            )
        )
        if record is not None and record.status != RunStatus.RUNNING:
            self.stdout.write(f"Continue the run from it with `{COMMAND} resume {cid}`.")

    # -- prune ---------------------------------------------------------------------

    def handle_prune(
        self,
        *,
        keep_last: int | None,
        older_than: str | None,
        coordination: str | None,
        store: str | None,
        dry_run: bool,
        **options: Any,
    ) -> None:
        if keep_last is None and older_than is None:
            raise CommandError(
                "prune needs --keep-last N, --older-than AGE or both, for example "
                f"`{COMMAND} prune --keep-last 10 --older-than 30d`."
            )
        age = None if older_than is None else _parse_age(older_than)
        backend, where = self._store_for(None, store)
        rules = _rules_text(keep_last, older_than)
        scope = f"coordination {coordination!r}" if coordination else "every coordination"
        protected = _waiting_heads(backend)
        if dry_run:
            self._dry_run(backend, where, keep_last, age, coordination, protected, rules)
            return
        self.stdout.write(
            f"Prune snapshots of {scope} in {where}: keep {rules}. Never deleted: "
            "each coordination's newest snapshot, the ancestors of a kept fork, the head of "
            "a run waiting for approval."
        )
        self.stdout.write("Run with --dry-run first to see what would be deleted.")
        if not self._confirmed("Prune", **options):
            return
        cids = [coordination] if coordination else list(_coordinations(backend))
        removed = 0
        started = last = time.monotonic()
        for done, cid in enumerate(cids, 1):
            try:
                removed += backend.prune(
                    keep_last, age, coordination_id=cid, protected_ids=protected
                )
            except NotImplementedError as exc:
                raise CommandError(
                    f"{exc}: {where} ({type(backend).__name__}) cannot prune. "
                    "Use a store that implements SnapshotStore.prune."
                ) from exc
            now = time.monotonic()
            if now - last >= self.progress_interval and done < len(cids):
                last = now
                self.stdout.write(
                    f"  {done}/{len(cids)} coordinations, {removed} snapshots deleted "
                    f"({now - started:.0f}s)"
                )
        self.stdout.write(
            self.style.SUCCESS(
                f"Deleted {removed} snapshot{'s' if removed != 1 else ''} from "
                f"{len(cids)} coordination{'s' if len(cids) != 1 else ''} in {where}."
            )
        )

    def _dry_run(
        self,
        backend: SnapshotStore,
        where: str,
        keep_last: int | None,
        age: timedelta | None,
        coordination: str | None,
        protected: set[str],
        rules: str,
    ) -> None:
        cutoff = None if age is None else timezone.now() - age
        protected = protected | set(_store_protected(backend))
        cids = [coordination] if coordination else list(_coordinations(backend))
        total = touched = 0
        self.stdout.write(f"Dry run: keep {rules}; nothing is deleted.")
        for cid in cids:
            snapshots = backend.list(CheckpointQuery.for_coordination(cid))
            plan = plan_prune(
                [PruneRow(s.id, s.parent_id, _seq(s), s.created_at) for s in snapshots],
                keep_last=keep_last,
                cutoff=cutoff,
                protected=protected,
            )
            if plan:
                touched += 1
                total += len(plan)
                self.stdout.write(
                    f"  {cid}: would delete {len(plan)} of {len(snapshots)} snapshots"
                )
        self.stdout.write(
            f"Would delete {total} snapshot{'s' if total != 1 else ''} from {touched} of "
            f"{len(cids)} coordination{'s' if len(cids) != 1 else ''} in {where}."
        )

    # -- helpers -------------------------------------------------------------------

    def _definition(self, name: str, coordination: str) -> Any:
        if name not in workflow_registry:
            raise CommandError(
                f"Run {coordination!r} is a run of workflow {name!r}, which is not defined in "
                f"this process (defined: {', '.join(workflow_registry.names()) or 'none'}). "
                "Define it with Workflow.define() in an app's workflows.py (imported at "
                "start-up, like admin.py), so that every process sees it: the web process, "
                "the workers and the management commands."
            )
        return workflow_registry.get(name)

    def _store_for(self, workflow_name: str | None, alias: str | None) -> tuple[SnapshotStore, str]:
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

    def _confirmed(self, verb: str, *, yes: bool, interactive: bool, **options: Any) -> bool:
        return confirmed(self, verb, yes=yes, interactive=interactive)


class _StepProgress:
    """A store listener that prints a line per snapshot saved in one coordination."""

    def __init__(
        self, command: Command, store: SnapshotStore, coordination: str, started: float
    ) -> None:
        self.command = command
        self.store = store
        self.coordination = coordination
        self.started = started
        self.steps = 0

    def __call__(self, event: SnapshotEvent) -> None:
        if not isinstance(event, Saved) or event.coordination_id != self.coordination:
            return
        self.steps += 1
        snapshot = self.store.load(event.snapshot_id)
        step = NONE_TEXT if snapshot is None else _step_text(snapshot)
        self.command.stdout.write(f"  step {step!r} done ({time.monotonic() - self.started:.1f}s)")


# -- the snapshot tree -------------------------------------------------------------------


def snapshot_tree(snapshots: list[WorkflowSnapshot]) -> list[tuple[int, bool, WorkflowSnapshot]]:
    """The snapshots in display order as ``(depth, is_fork, snapshot)``.

    A chain stays at its depth: a snapshot's continuation (its child at the next
    ``seq``) follows it at the same depth; its other children are forks, shown right
    after it, one level deeper, each with its own chain. A snapshot whose parent is
    not among *snapshots* (pruned) starts a chain at depth 0.
    """
    ordered = sorted(snapshots, key=_seq)
    by_id = {s.id: s for s in ordered}
    children: dict[str, list[WorkflowSnapshot]] = defaultdict(list)
    roots = []
    for snapshot in ordered:
        if snapshot.parent_id in by_id and snapshot.parent_id != snapshot.id:
            children[snapshot.parent_id].append(snapshot)
        else:
            roots.append(snapshot)
    lines: list[tuple[int, bool, WorkflowSnapshot]] = []
    seen: set[str] = set()
    stack = [(root, 0, False) for root in reversed(roots)]
    while stack:
        snapshot, depth, fork = stack.pop()
        if snapshot.id in seen:
            continue
        seen.add(snapshot.id)
        lines.append((depth, fork, snapshot))
        kids = children.get(snapshot.id, [])
        main = next((k for k in kids if _seq(k) == _seq(snapshot) + 1), None)
        if main is not None:
            stack.append((main, depth, False))
        stack.extend((k, depth + 1, True) for k in reversed(kids) if k is not main)
    # A parent cycle (only a corrupted store has one) is never reached from a root.
    lines.extend((0, False, s) for s in ordered if s.id not in seen)
    return lines


# -- small helpers -----------------------------------------------------------------------


def _parse_json(option: str, text: str | None, max_bytes: int = MAX_STATE_BYTES) -> Any:
    if text is None:
        return None
    try:
        return parse_user_json(text, what=option, max_bytes=max_bytes)
    except UserJSONError as exc:
        if exc.code != "json_invalid":
            raise CommandError(f"{exc}: {truncate(text, 60)!r}.") from exc
        raise CommandError(
            f"{exc}: {truncate(text, 60)!r}. Quote it for the "
            f"shell and use JSON syntax, for example {option} '{{\"approved\": true}}' "
            f"(strings in double quotes: {option} '\"text\"')."
        ) from exc


def _pending_approval(coordination: str, database: str | None) -> Any:
    """The pending ``Approval`` of *coordination*, or ``None``."""
    from ...models import Approval

    return (
        Approval.objects.using(RunRecords(database).db)
        .filter(coordination_id=coordination, status=Approval.Status.PENDING)
        .order_by("-requested_at")
        .first()
    )


def _how_to_continue(coordination: str) -> str:
    """How to continue a waiting run: decide its approval, or resume it with input
    (a pause that waits for input, not for an approval)."""
    if _pending_approval(coordination, None) is not None:
        return _how_to_decide(coordination, None)
    return f"Resume it with the decision: `{COMMAND} resume {coordination} --input '{{...}}'`."


def _how_to_decide(coordination: str, database: str | None) -> str:
    """How to decide the pending approval of *coordination* from the shell."""
    pending = _pending_approval(coordination, database)
    ident = str(pending.pk) if pending is not None else "APPROVAL_ID"
    return (
        f"Decide its approval: `manage.py flowwarden_approvals approve {ident} --by USER` "
        f"(or `reject`); the run then continues by itself."
    )


def _waiting_for_a_decision(coordination: str, database: str | None) -> str:
    return (
        f"Run {coordination!r} is waiting for a decision on its approval, and a resume "
        f"input is no decision (only the approval's own row is). "
        + _how_to_decide(coordination, database)
    )


def _parse_interval(text: str) -> float:
    """``--every``'s value in seconds (empty: ``WORKFLOW_SWEEP_INTERVAL``)."""
    if not text:
        from ...workflows.operations.sweeper import sweep_interval

        return sweep_interval()
    try:
        seconds = parse_duration(text)
    except ValueError:
        seconds = -1
    if not 0 < seconds <= 86400:
        raise CommandError(
            f"--every {text!r} is not an interval: use a positive number of seconds or a "
            "duration up to a day, for example --every 2s or --every 1m."
        )
    return seconds


def _parse_age(text: str) -> timedelta:
    try:
        seconds = parse_duration(text)
    except ValueError:
        raise CommandError(
            f"--older-than {text!r} is not an age: use a number with s, m, h, d or w, "
            "for example --older-than 30d or --older-than 12h."
        ) from None
    if seconds < 0:
        raise CommandError(f"--older-than {text!r} is negative: give an age, like 30d.")
    if seconds > MAX_AGE.total_seconds():
        raise CommandError(
            f"--older-than {text!r} is longer than anything kept: the most is 36500d (100 years)."
        )
    return timedelta(seconds=seconds)


def _rules_text(keep_last: int | None, older_than: str | None) -> str:
    rules = []
    if keep_last is not None:
        rules.append(f"the last {keep_last} of each coordination")
    if older_than is not None:
        rules.append(f"those younger than {older_than.strip()}")
    return " and ".join(rules)


def _runs(database: str | None) -> Any:
    return WorkflowRun.objects.using(RunRecords(database).db)


def _store_db(store: OrmSnapshotStore) -> str:
    return store.using or router.db_for_write(SnapshotRecord)


def _coordinations(store: SnapshotStore) -> Iterator[str]:
    """Every coordination with snapshots in *store*: one query on an ORM store, else
    a pass over ``list`` a page at a time."""
    if isinstance(store, OrmSnapshotStore):
        rows = SnapshotRecord.objects.using(_store_db(store))
        yield from (
            rows.order_by("coordination_id").values_list("coordination_id", flat=True).distinct()
        )
        return
    seen: set[str] = set()
    query: CheckpointQuery | None = CheckpointQuery(limit=PAGE)
    while query is not None:
        page = store.list(query)
        for snapshot in page:
            if snapshot.coordination_id not in seen:
                seen.add(snapshot.coordination_id)
                yield snapshot.coordination_id
        query = query.next_page(page)


def _waiting_heads(store: SnapshotStore) -> set[str]:
    """Heads of runs waiting for approval, from the run database of *store* (its own
    database for an ORM store)."""
    using = _store_db(store) if isinstance(store, OrmSnapshotStore) else None
    waiting = _runs(using).filter(status=RunStatus.WAITING).exclude(head_snapshot_id=None)
    return set(waiting.values_list("head_snapshot_id", flat=True))


def _store_protected(store: SnapshotStore) -> list[str]:
    """The ids a store's own ``protect`` hook keeps (the in-memory store has one)."""
    protect = getattr(store, "protect", None)
    return list(protect()) if callable(protect) else []


def _seq(snapshot: WorkflowSnapshot) -> int:
    return snapshot.seq or 0


def _step_text(snapshot: WorkflowSnapshot) -> str:
    if CANCELLED in snapshot.metadata:
        # The cancel's snapshot repeats the position it cancelled at; it is no step's.
        return "(cancel)"
    if LAST_STEP not in snapshot.metadata:
        return NONE_TEXT
    return snapshot.metadata[LAST_STEP] or "(start)"


def _state_text(state: Any) -> str:
    return json.dumps(state, ensure_ascii=False, default=str, sort_keys=True)


def _count_text(count: int | None) -> str:
    return "?" if count is None else str(count)


def _run_fields(record: WorkflowRun | None, coordination: str, now: Any) -> list[tuple[str, str]]:
    if record is None:
        return [
            ("Coordination", coordination),
            (
                "Run",
                f"{NONE_TEXT} (no WorkflowRun: these snapshots were written without the engine)",
            ),
        ]
    defined = "" if record.workflow_name in workflow_registry else " (not defined in this process)"
    runner = NONE_TEXT
    if record.runner:
        until = record.claimed_until.isoformat() if record.claimed_until else NONE_TEXT
        runner = f"{record.runner} until {until}"
    fields = [
        ("Coordination", record.coordination_id),
        ("Workflow", f"{record.workflow_name}{defined}"),
        ("Status", record.status),
        ("Last step", record.last_step or "(start)"),
        ("Head snapshot", record.head_snapshot_id or NONE_TEXT),
        ("Idempotency key", record.idempotency_key or NONE_TEXT),
        ("Runner", runner),
        ("Attempts", str(record.attempts)),
        ("Started", timestamp_text(record.created_at, now)),
        ("Updated", timestamp_text(record.updated_at, now)),
    ]
    if record.failure_reason:
        cancelled = record.status == RunStatus.CANCELLED
        fields.append(("Cancel reason" if cancelled else "Failure reason", record.failure_reason))
    if record.resume_input is not None:
        fields.append(("Resume input", _state_text(record.resume_input)))
    return fields


def _run_json(record: WorkflowRun) -> dict[str, Any]:
    return {
        "coordination_id": record.coordination_id,
        "workflow_name": record.workflow_name,
        "status": record.status,
        "last_step": record.last_step,
        "head_snapshot_id": record.head_snapshot_id,
        "idempotency_key": record.idempotency_key,
        "failure_reason": record.failure_reason,
        "resume_input": record.resume_input,
        "runner": record.runner,
        "claimed_until": _iso(record.claimed_until),
        "attempts": record.attempts,
        "created_at": _iso(record.created_at),
        "updated_at": _iso(record.updated_at),
    }


def _snapshot_json(
    snapshot: WorkflowSnapshot, depth: int, fork: bool, *, with_state: bool
) -> dict[str, Any]:
    value: dict[str, Any] = {
        "id": snapshot.id,
        "parent_id": snapshot.parent_id,
        "seq": snapshot.seq,
        "step": snapshot.metadata.get(LAST_STEP),
        "created_at": _iso(snapshot.created_at),
        "agent_name": snapshot.agent_name,
        "metadata": dict(snapshot.metadata),
        "depth": depth,
        "fork": fork,
    }
    if with_state:
        value["state"] = snapshot.state
    return value


def _iso(at: Any) -> str | None:
    return None if at is None else at.isoformat()
