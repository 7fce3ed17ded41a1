"""``resume``, ``cancel``, ``fork`` and ``recover``: what continues, stops or branches
a run."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from ...common.durations import parse_duration
from ...common.formatting import NONE_TEXT, age_text, timestamp_text
from ...common.user_input import MAX_PAYLOAD_BYTES
from ...models import WorkflowRun
from ...workflows import (
    Cancelled,
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
    WaitingForMessage,
    Workflow,
    WorkflowResult,
)
from ...workflows.runs.records import RunRecords
from ...workflows.storage.snapshot import Saved, SnapshotEvent
from ...workflows.waiting.cancellation import cancel_coordination
from ..base import ActionCommand, confirmed, os_user
from .inputs import confirm, parse_age, parse_json
from .lookup import store_for, workflow_definition
from .output import COMMAND, seq, state_text, step_text


class ControlActions(ActionCommand):
    """``resume``, ``cancel``, ``fork`` and ``recover`` of ``manage.py flowwarden_workflows``."""

    def handle_resume(
        self, *, coordination: str, input: str | None, database: str | None, **options: Any
    ) -> None:
        payload = parse_json("--input", input, MAX_PAYLOAD_BYTES)
        record = RunRecords(database).get(coordination)
        if record is None:
            raise CommandError(
                f"No workflow run {coordination!r}. Run `{COMMAND} list` to see the runs."
            )
        workflow_definition(record.workflow_name, coordination)
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
        elif isinstance(result, WaitingForMessage):
            until = (
                f" until {timestamp_text(result.deadline, timezone.now())}"
                if result.deadline is not None
                else ""
            )
            self.stdout.write(
                f"Run {cid!r} waits for a message on {result.topic!r}{until} after step "
                f"{result.last_step_name!r} ({done}); a resume does not continue it. Send it "
                f"one: `{COMMAND} send {cid} {result.topic} --payload '{{...}}'`."
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

    def handle_fork(
        self, *, snapshot_id: str, state: str, store: str | None, **options: Any
    ) -> None:
        new_state = parse_json("--state", state)
        backend, where = store_for(None, store)
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
            f"Fork snapshot {source.id} (#{seq(source)}, after step "
            f"{step_text(source)!r}) of coordination {cid!r} in {where}."
        )
        self.stdout.write(f"  current state: {state_text(source.state)}")
        self.stdout.write(f"  new state:     {state_text(new_state)}")
        if head is not None:
            self.stdout.write(
                f"The fork becomes the newest snapshot (#{seq(head) + 1}, after "
                f"#{seq(head)}): the run's next run or resume continues from it, at the step "
                f"after {step_text(source)!r}."
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
        if not confirm(self, "Fork", **options):
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

        age = None if older_than is None else parse_age(older_than)
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


class _StepProgress:
    """A store listener that prints a line per snapshot saved in one coordination."""

    def __init__(
        self, command: BaseCommand, store: SnapshotStore, coordination: str, started: float
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
        step = NONE_TEXT if snapshot is None else step_text(snapshot)
        self.command.stdout.write(f"  step {step!r} done ({time.monotonic() - self.started:.1f}s)")


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
