"""``manage.py flowwarden_workflows``: list, show, resume, cancel, fork, prune and
upgrade workflow runs, send them messages and read their events, the versions
they are on, the queues they wait in and the schedules that start them.

A thin layer over the workflow API: ``WorkflowRun`` rows for the runs, the snapshot
stores of ``FLOWWARDEN["SNAPSHOT_STORES"]`` for their history, and the registered
workflow definitions (``Workflow.define``) to resume them. Snapshots are read from
the store of the run's registered workflow, else from ``--store`` (default
``"default"``).
"""

from __future__ import annotations

from django.core.management.base import CommandParser

from ...models import WorkflowRun
from ..base import non_negative_int, positive_int
from ..workflows_cli.control import ControlActions
from ..workflows_cli.listing import ListingActions
from ..workflows_cli.maintenance import MaintenanceActions
from ..workflows_cli.messages import MessageActions
from ..workflows_cli.queues import QueueActions
from ..workflows_cli.schedules import ScheduleActions
from ..workflows_cli.versions import VersionActions

STATUSES = tuple(WorkflowRun.Status.values)


class Command(
    ListingActions,
    ControlActions,
    MessageActions,
    VersionActions,
    QueueActions,
    ScheduleActions,
    MaintenanceActions,
):
    """Operators' view of workflow runs and their snapshot trees."""

    database_subject = "The workflow tables"

    help = (
        "Inspect and operate workflow runs: list them, show one with its snapshot tree, "
        "resume a paused or failed run, fork a snapshot with a new state, prune old snapshots."
    )
    # A misconfigured store must not stop operators from inspecting the runs; store
    # errors are reported by this command itself.
    requires_system_checks: list[str] = []

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

        show = actions.add_parser(
            "show", help="Show a run, its snapshot tree, its child runs and its timeline."
        )
        _coordination(show)
        show.add_argument("--json", action="store_true", help="Print a JSON object.")
        show.add_argument("--state", action="store_true", help="Show each snapshot's state.")

        resume = actions.add_parser(
            "resume",
            help="Continue a paused (hibernated, waiting) or failed run in this process.",
        )
        _coordination(resume)
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

        send = actions.add_parser(
            "send",
            help="Send a run a message: a wait_for(state, TOPIC) of the run takes it (at "
            "once if the run waits for it). Once per --idempotency-key.",
        )
        _coordination(send)
        send.add_argument("topic", metavar="TOPIC", help="The message's topic.")
        send.add_argument(
            "--payload",
            required=True,
            metavar="JSON",
            help="The message's payload, a JSON object: '{\"amount\": 42}'.",
        )
        send.add_argument(
            "--idempotency-key",
            metavar="KEY",
            help="Send at most once with this key: a repeat sends nothing and names the first.",
        )
        send.add_argument(
            "--sender",
            metavar="TEXT",
            help="Who sends it (default: cli:<your operating system user>).",
        )

        events = actions.add_parser(
            "events", help="The values a run published (ctx.set_event), by key."
        )
        _coordination(events)

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
        _dry_run(prune, "Show what would be deleted; delete nothing.")

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
        _dry_run(recover, "List the stalled runs; change nothing.")

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
        _dry_run(
            upgrade,
            "Show each run's new version, position and whether its state converts; change nothing.",
        )

        versions = actions.add_parser(
            "versions",
            help="The workflow versions the unfinished runs are on, and whether this "
            "process defines them.",
        )

        queues = actions.add_parser(
            "queues",
            help="Each workflow queue (and each partition with activity): its limits, "
            "the slots in use, the steps waiting for one, the oldest wait and the "
            "starts within the rate's period.",
        )

        schedules = actions.add_parser(
            "schedules",
            help="The scheduled starts of workflows: Celery's beat_schedule entries, "
            "django-celery-beat's periodic tasks and (when the runs execute on Temporal) "
            "the Temporal Schedules, with their last and next start where known.",
        )

        reencrypt = actions.add_parser(
            "reencrypt",
            help="Bind legacy enc:v1 snapshot values to their run (re-encrypt them as "
            "enc:v2); the ORM store refuses enc:v1 values until then.",
        )

        reports = (listing, events, upgrade, versions, queues)
        for sub, shape in (*((sub, "list") for sub in reports), (schedules, "object")):
            sub.add_argument("--json", action="store_true", help=f"Print a JSON {shape}.")
        schedules.add_argument(
            "--database",
            metavar="ALIAS",
            help="The database of django-celery-beat's periodic tasks (default: the "
            "router's choice).",
        )
        runs_subs = (listing, show, resume, cancel, send, events, recover, upgrade, versions)
        for sub in (*runs_subs, queues):
            sub.add_argument(
                "--database",
                metavar="ALIAS",
                help="The database of the WorkflowRun rows (default: the router's choice; "
                "for recover and queues, every database a defined workflow uses).",
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


def _coordination(parser: CommandParser) -> None:
    """The positional ``COORDINATION`` of an action on one run."""
    parser.add_argument("coordination", metavar="COORDINATION", help="The coordination id.")


def _dry_run(parser: CommandParser, what: str) -> None:
    """``--dry-run``: *what* the action shows instead of changing anything."""
    parser.add_argument("--dry-run", action="store_true", help=what)
