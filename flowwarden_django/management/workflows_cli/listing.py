"""``list`` and ``show``: the runs, newest first, and one run with its snapshot tree."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.core.management.base import CommandError
from django.db.models import Count
from django.utils import timezone

from ...common.formatting import NONE_TEXT, age_text, dump_json, format_table, timestamp_text
from ...models import SnapshotRecord, WorkflowEvent, WorkflowMessage, WorkflowRun
from ...workflows import (
    CheckpointQuery,
    RunStatus,
    SnapshotStore,
    WorkflowSnapshot,
    workflow_registry,
)
from ...workflows.backends.orm import OrmSnapshotStore
from ...workflows.definition.metadata import LAST_STEP
from ...workflows.operations.timeline import MAX_SNAPSHOTS, Timeline, load_timeline
from ...workflows.runs.records import RunRecords
from ..base import ActionCommand
from .lookup import run_rows, store_db, store_for
from .output import COMMAND, iso, seq, state_text, step_text
from .run_timeline import (
    child_json,
    child_lines,
    child_runs,
    run_json,
    timeline_bars,
    timeline_heading,
    timeline_json,
    timeline_lines,
)

LIST_HEADERS = (
    "COORDINATION",
    "WORKFLOW",
    "STATUS",
    "LAST STEP",
    "SNAPSHOTS",
    "STARTED",
    "UPDATED",
)


class ListingActions(ActionCommand):
    """``list`` and ``show`` of ``manage.py flowwarden_workflows``."""

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
        runs = run_rows(database)
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
                    [{**run_json(r), "snapshots": counts.get(r.coordination_id)} for r in records]
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
        self.write_table(format_table(LIST_HEADERS, rows))
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
                store, _ = store_for(record.workflow_name, store_alias)
            except CommandError:
                counts[record.coordination_id] = None
                continue
            by_store.setdefault(id(store), (store, []))[1].append(record.coordination_id)
        for store, cids in by_store.values():
            if isinstance(store, OrmSnapshotStore):
                grouped = (
                    SnapshotRecord.objects.using(store_db(store))
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
        backend, where = store_for(record.workflow_name if record else None, store)
        snapshots = backend.list(CheckpointQuery.for_coordination(coordination))
        if record is None and not snapshots:
            raise CommandError(
                f"No workflow run {coordination!r} and no snapshots of it in {where}. "
                f"Run `{COMMAND} list` to see the runs"
                + ("" if store else ", or pass --store ALIAS to look in another store")
                + "."
            )
        tree = snapshot_tree(snapshots)
        head = max(snapshots, key=seq) if snapshots else None
        children, child_count = child_runs(record) if record else ([], 0)
        timeline = load_timeline(record, backend) if record else None
        if json:
            self.stdout.write(
                dump_json(
                    {
                        "run": None if record is None else run_json(record),
                        "snapshots": [
                            _snapshot_json(s, depth, fork, with_state=state)
                            for depth, fork, s in sorted(tree, key=lambda item: seq(item[2]))
                        ],
                        "children": [child_json(child) for child in children],
                        "timeline": [] if timeline is None else timeline_json(timeline),
                    }
                )
            )
            return
        now = timezone.now()
        for label, value in _run_fields(record, coordination, now):
            self.stdout.write(f"{self.style.MIGRATE_LABEL(f'{label}:'.ljust(17))} {value}")
        self.stdout.write("")
        self.stdout.write(self.style.MIGRATE_HEADING(f"Snapshots ({len(snapshots)}):"))
        if snapshots:
            self._write_tree(tree, head, now, state=state)
        else:
            self.stdout.write(f"  none in {where}")
        if record is not None:
            assert timeline is not None
            self._write_children(children, child_count, now)
            self._write_timeline(timeline)

    def _write_children(self, children: list[WorkflowRun], total: int, now: Any) -> None:
        self.stdout.write("")
        self.stdout.write(self.style.MIGRATE_HEADING(f"Child runs ({total}):"))
        if not children:
            self.stdout.write("  none")
            return
        header, *lines = child_lines(children, total, now)
        self.stdout.write(self.style.MIGRATE_LABEL(f"  {header}"))
        for line in lines:
            self.stdout.write(f"  {line}")

    def _write_timeline(self, timeline: Timeline) -> None:
        bars = timeline_bars(timeline)
        self.stdout.write("")
        self.stdout.write(self.style.MIGRATE_HEADING(f"Timeline ({timeline_heading(timeline)}):"))
        if not bars:
            self.stdout.write("  no step has run yet")
            return
        header, *lines = timeline_lines(timeline)
        self.stdout.write(self.style.MIGRATE_LABEL(header))
        for line in lines:
            self.stdout.write(line)
        notes = ["* marks where the run stands"]
        if timeline.skipped:
            notes.append(f"only the newest {MAX_SNAPSHOTS} snapshots were read")
        self.stdout.write(f"  ({'; '.join(notes)})")

    def _write_tree(
        self,
        tree: list[tuple[int, bool, WorkflowSnapshot]],
        head: WorkflowSnapshot | None,
        now: Any,
        *,
        state: bool,
    ) -> None:
        snapshots = [snapshot for _depth, _fork, snapshot in tree]
        seq_width = max(len(str(seq(s))) for s in snapshots) + 1
        step_width = max(len(step_text(s)) for s in snapshots)
        by_id = {s.id: s for s in snapshots}
        for depth, fork, snapshot in tree:
            indent = "  " + "    " * depth
            marker = "└─ " if fork else ("   " if depth else "")
            notes = []
            if fork and snapshot.parent_id in by_id:
                notes.append(f"fork of #{seq(by_id[snapshot.parent_id])}")
            elif snapshot.parent_id is not None and snapshot.parent_id not in by_id:
                notes.append(f"parent {snapshot.parent_id} is gone")
            if snapshot is head:
                notes.append("head")
            self.stdout.write(
                f"{indent}{marker}{f'#{seq(snapshot)}'.ljust(seq_width)}  "
                f"{step_text(snapshot).ljust(step_width)}  {snapshot.id}  "
                f"{timestamp_text(snapshot.created_at, now)}"
                + (f"  ({', '.join(notes)})" if notes else "")
            )
            if state:
                pad = " " * (len(indent) + (3 if fork or depth else 0) + seq_width + 2)
                self.stdout.write(f"{pad}state: {state_text(snapshot.state)}")


def snapshot_tree(snapshots: list[WorkflowSnapshot]) -> list[tuple[int, bool, WorkflowSnapshot]]:
    """The snapshots in display order as ``(depth, is_fork, snapshot)``.

    A chain stays at its depth: a snapshot's continuation (its child at the next
    ``seq``) follows it at the same depth; its other children are forks, shown right
    after it, one level deeper, each with its own chain. A snapshot whose parent is
    not among *snapshots* (pruned) starts a chain at depth 0.
    """
    ordered = sorted(snapshots, key=seq)
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
        main = next((k for k in kids if seq(k) == seq(snapshot) + 1), None)
        if main is not None:
            stack.append((main, depth, False))
        stack.extend((k, depth + 1, True) for k in reversed(kids) if k is not main)
    # A parent cycle (only a corrupted store has one) is never reached from a root.
    lines.extend((0, False, s) for s in ordered if s.id not in seen)
    return lines


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
        fields.append(("Resume input", state_text(record.resume_input)))
    return fields + _mailbox_fields(record, now)


def _mailbox_fields(record: WorkflowRun, now: Any) -> list[tuple[str, str]]:
    """What the run waits for, and how many messages and events it has."""
    fields = []
    if record.status == RunStatus.WAITING_MESSAGE:
        until = f" until {timestamp_text(record.wake_at, now)}" if record.wake_at else ""
        fields.append(("Waiting for", f"a message on {record.waiting_topic!r}{until}"))
    db = record._state.db
    messages = WorkflowMessage.objects.using(db).filter(coordination_id=record.pk)
    sent = messages.count()
    if sent:
        pending = messages.filter(delivered_to__isnull=True).count()
        fields.append(("Messages", f"{sent} ({pending} pending)"))
    events = WorkflowEvent.objects.using(db).filter(coordination_id=record.pk).count()
    if events:
        fields.append(("Events", f"{events}: `{COMMAND} events {record.pk}`"))
    return fields


def _snapshot_json(
    snapshot: WorkflowSnapshot, depth: int, fork: bool, *, with_state: bool
) -> dict[str, Any]:
    value: dict[str, Any] = {
        "id": snapshot.id,
        "parent_id": snapshot.parent_id,
        "seq": snapshot.seq,
        "step": snapshot.metadata.get(LAST_STEP),
        "created_at": iso(snapshot.created_at),
        "agent_name": snapshot.agent_name,
        "metadata": dict(snapshot.metadata),
        "depth": depth,
        "fork": fork,
    }
    if with_state:
        value["state"] = snapshot.state
    return value
