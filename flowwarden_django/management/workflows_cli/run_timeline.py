"""What ``show`` prints below a run's snapshot tree: its child runs, and its timeline
as text, one line per step attempt and per wait, from the builder the admin draws
its timeline with (``workflows.operations.timeline``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from ...common.formatting import NONE_TEXT, age_text
from ...models import WorkflowRun
from ...workflows.operations.timeline import MAX_CHILDREN, Bar, Timeline
from .output import LINE_WIDTH, fit_table, iso

TIMELINE_HEADERS = ("", "START", "TOOK", "KIND", "NAME", "ATTEMPT", "OUTCOME", "WHERE")
CHILD_HEADERS = ("COORDINATION", "WORKFLOW", "STATUS", "STARTED", "UPDATED")
#: The timeline's columns that give way when a line would be too long: name,
#: outcome (an error class), where (provider @ worker).
_SHRINKING = (4, 6, 7)
#: The kind of each wait (``Bar.wait``), as printed.
_WAIT_KINDS = {"hibernate": "hibernated"}
#: A wait's outcome once over: an approval's decision, else "ok".
_DECIDED = {"approved", "rejected", "expired", "cancelled"}


def child_runs(record: WorkflowRun) -> tuple[list[WorkflowRun], int]:
    """The oldest ``MAX_CHILDREN`` child runs of *record*, and how many it has."""
    children = WorkflowRun.objects.using(record._state.db).filter(parent_coordination_id=record.pk)
    shown = list(children.order_by("created_at", "coordination_id")[:MAX_CHILDREN])
    total = len(shown) if len(shown) < MAX_CHILDREN else children.count()
    return shown, total


def child_lines(children: list[WorkflowRun], total: int, now: datetime) -> list[str]:
    """The child runs as a table (header first), with a note when some are left out."""
    rows = [
        (
            child.coordination_id,
            child.workflow_name,
            child.status,
            age_text(child.created_at, now),
            age_text(child.updated_at, now),
        )
        for child in children
    ]
    lines = fit_table(CHILD_HEADERS, rows, shrink=(1,), width=LINE_WIDTH - 2)  # indented
    if total > len(children):
        lines.append(f"(the oldest {len(children)} of {total})")
    return lines


def run_json(record: WorkflowRun) -> dict[str, Any]:
    """What ``show --json`` and ``list --json`` say of a run."""
    return {
        "coordination_id": record.coordination_id,
        "workflow_name": record.workflow_name,
        "status": record.status,
        "last_step": record.last_step,
        "head_snapshot_id": record.head_snapshot_id,
        "idempotency_key": record.idempotency_key,
        "failure_reason": record.failure_reason,
        "resume_input": record.resume_input,
        "waiting_topic": record.waiting_topic or None,
        "runner": record.runner,
        "claimed_until": iso(record.claimed_until),
        "attempts": record.attempts,
        "created_at": iso(record.created_at),
        "updated_at": iso(record.updated_at),
    }


#: What ``show --json`` says of a child run: these fields of its ``run_json``.
CHILD_FIELDS = ("coordination_id", "workflow_name", "status", "created_at", "updated_at")


def child_json(child: WorkflowRun) -> dict[str, Any]:
    run = run_json(child)
    return {name: run[name] for name in CHILD_FIELDS}


def timeline_bars(timeline: Timeline) -> list[Bar]:
    """The step attempts and waits of *timeline* (the child runs have their own table)."""
    return [bar for bar in timeline.bars if bar.kind != "child"]


def kind_text(bar: Bar) -> str:
    """``step`` for an attempt, else the wait's kind (``approval``, ``sleep``,
    ``message``, ``children``, ``slot``, ``hibernated``)."""
    if bar.kind == "attempt":
        return "step"
    return _WAIT_KINDS.get(bar.wait, bar.wait or "wait")


def name_text(bar: Bar) -> str:
    """The step an attempt ran, or that paused for a wait (else the wait's words)."""
    return bar.label if bar.kind == "attempt" else (bar.step or bar.label)


def outcome_text(bar: Bar) -> str:
    """``ok``, the error class of a failed attempt (``failed`` when not recorded),
    ``waiting`` or ``running`` while it lasts, an approval's decision."""
    if bar.outcome == "failed":
        return bar.error or "failed"
    if bar.outcome in ("waiting", "running", "cancelled"):
        return bar.outcome
    if bar.decision in _DECIDED:
        return bar.decision
    return "ok"


def timeline_heading(timeline: Timeline) -> str:
    """What the lines' times mean: the day (or days) and time zone, the span."""
    zone = timezone.get_current_timezone_name()
    first, last = (timezone.localtime(at).date() for at in (timeline.start, timeline.end))
    day = first.isoformat() if first == last else f"{first.isoformat()} to {last.isoformat()}"
    return f"{day} {zone}, {timeline.span_text}"


def timeline_lines(timeline: Timeline) -> list[str]:
    """One line per attempt and wait (header first; ``*`` marks where the run stands),
    at most 100 characters wide."""
    bars = timeline_bars(timeline)
    one_day = timezone.localtime(timeline.start).date() == timezone.localtime(timeline.end).date()
    rows = [
        (
            "*" if bar.current else " ",
            _start_text(bar.start, one_day),
            bar.took,
            kind_text(bar),
            name_text(bar),
            NONE_TEXT if bar.attempt is None else str(bar.attempt),
            outcome_text(bar),
            bar.where or NONE_TEXT,
        )
        for bar in bars
    ]
    return fit_table(TIMELINE_HEADERS, rows, shrink=_SHRINKING)


def timeline_json(timeline: Timeline) -> list[dict[str, Any]]:
    return [
        {
            "kind": kind_text(bar),
            "name": name_text(bar),
            "attempt": bar.attempt,
            "outcome": outcome_text(bar),
            "error": bar.error or None,
            "started_at": iso(bar.start),
            "ended_at": iso(bar.end),
            "duration_ms": None if bar.duration is None else bar.duration.total_seconds() * 1000,
            "provider": bar.provider or None,
            "worker": bar.worker or None,
            "current": bar.current,
        }
        for bar in timeline_bars(timeline)
    ]


def _start_text(at: datetime | None, one_day: bool) -> str:
    if at is None:
        return NONE_TEXT
    local = timezone.localtime(at)
    if one_day:
        return local.strftime("%H:%M:%S.%f")[:12]
    return local.strftime("%m-%d %H:%M:%S")
