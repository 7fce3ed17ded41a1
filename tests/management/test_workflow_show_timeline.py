"""``manage.py flowwarden_workflows show``: a run's child runs and its timeline as
text (one line per step attempt and wait, from the admin's timeline builder) and in
``--json``."""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.utils import timezone

from flowwarden_django.management.workflows_cli.run_timeline import (
    timeline_json,
    timeline_lines,
)
from flowwarden_django.models import Approval, WorkflowRun
from flowwarden_django.workflows import approve, workflow_registry
from flowwarden_django.workflows.operations.timeline import Bar, Timeline
from tests.support.timeline_workflow import (
    CHILD,
    ORDERS,
    define_orders,
    drive_orders,
    forget_orders,
)

pytestmark = pytest.mark.django_db(transaction=True)

CID = "cmd-tl-1"


@pytest.fixture
def orders() -> Any:
    define_orders()
    yield
    forget_orders()


@pytest.fixture
def operator() -> User:
    return User.objects.create_superuser("operator", "op@example.com", "pw")


def show(*args: str) -> str:
    out = io.StringIO()
    call_command("flowwarden_workflows", "show", *args, stdout=out, no_color=True)
    return out.getvalue()


def section(output: str, heading: str) -> list[str]:
    """The lines of the section whose heading starts with *heading*, up to a blank."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    body = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        body.append(line)
    return body


def columns(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip(" *"))


def test_a_finished_run_s_children_and_timeline(orders: None, operator: User) -> None:
    drive_orders(CID, operator)
    output = show(CID)
    children = section(output, "Child runs (2):")
    assert columns(children[0]) == ["COORDINATION", "WORKFLOW", "STATUS", "STARTED", "UPDATED"]
    kids = WorkflowRun.objects.filter(parent_coordination_id=CID).order_by("created_at")
    assert [columns(line)[:3] for line in children[1:]] == [
        [kid.pk, CHILD, "completed"] for kid in kids
    ]

    timeline = section(output, "Timeline (")
    header, *lines = timeline
    assert columns(header) == [
        "START", "TOOK", "KIND", "NAME", "ATTEMPT", "OUTCOME", "WHERE",
    ]  # fmt: skip
    rows = [columns(line) for line in lines[:-1]]
    assert [row[2:6] for row in rows] == [
        ["step", "reserve", "1", "FlakyError"],
        ["step", "reserve", "2", "ok"],
        ["step", "review", "1", "ok"],
        ["approval", "review", "—", "approved"],
        ["step", "cool-off", "1", "ok"],
        ["sleep", "cool-off", "—", "ok"],
        ["step", "pack", "1", "ok"],
        ["children", "pack", "—", "ok"],
        ["step", "ship", "1", "ok"],
    ]
    for row in rows:
        assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3}", row[0]), row
        assert re.fullmatch(r"\d+ ms|[\d.]+ (s|min|h|d)", row[1]), row
    steps = [row for row in rows if row[2] == "step"]
    assert all(re.fullmatch(r"inprocess @ .+:\d+", row[6]) for row in steps)
    # The run stands at its last step; the columns line up.
    assert lines[-2].startswith("*") and not any(line.startswith("*") for line in lines[:-2])
    assert lines[-1].strip() == "(* marks where the run stands)"
    starts = {line.index(row[2]) for line, row in zip(lines, rows, strict=False)}
    assert len(starts) == 1
    assert max(len(line) for line in [*children, *timeline]) <= 100


def test_a_run_waiting_for_its_approval_then_sleeping(orders: None, operator: User) -> None:
    workflow_registry.get(ORDERS).start({"order": 1}, coordination_id=CID)
    lines = section(show(CID), "Timeline (")[1:-1]
    assert columns(lines[-1])[2:6] == ["approval", "review", "—", "waiting"]
    assert columns(lines[-1])[1] == "…" and lines[-1].startswith("*")
    assert "Child runs (0):\n  none" in show(CID)

    approve(Approval.objects.get(coordination_id=CID).pk, operator)
    lines = section(show(CID), "Timeline (")[1:-1]
    assert [columns(line)[2:6] for line in lines[-3:]] == [
        ["approval", "review", "—", "approved"],
        ["step", "cool-off", "1", "ok"],
        ["sleep", "cool-off", "—", "waiting"],
    ]
    assert lines[-1].startswith("*")


def test_show_json_has_the_children_and_the_timeline(orders: None, operator: User) -> None:
    drive_orders(CID, operator)
    shown = json.loads(show(CID, "--json"))
    assert {child["workflow_name"] for child in shown["children"]} == {CHILD}
    assert [child["status"] for child in shown["children"]] == ["completed", "completed"]
    timeline = shown["timeline"]
    assert [(e["kind"], e["name"], e["attempt"], e["outcome"]) for e in timeline[:4]] == [
        ("step", "reserve", 1, "FlakyError"),
        ("step", "reserve", 2, "ok"),
        ("step", "review", 1, "ok"),
        ("approval", "review", None, "approved"),
    ]
    failed = timeline[0]
    assert failed["error"] == "FlakyError" and failed["provider"] == "inprocess"
    assert failed["worker"] and failed["started_at"] and failed["duration_ms"] is not None
    assert [e["kind"] for e in timeline if e["kind"] != "step"] == [
        "approval",
        "sleep",
        "children",
    ]
    assert [e["current"] for e in timeline].count(True) == 1 and timeline[-1]["current"]


def test_a_run_without_children_or_steps(orders: None) -> None:
    now = timezone.now()
    WorkflowRun.objects.create(
        coordination_id="cmd-tl-bare", workflow_name=ORDERS, created_at=now, updated_at=now
    )
    output = show("cmd-tl-bare")
    assert "Child runs (0):\n  none" in output
    assert re.search(r"Timeline \(.*\):\n  no step has run yet", output)
    shown = json.loads(show("cmd-tl-bare", "--json"))
    assert shown["children"] == [] and shown["timeline"] == []


def test_every_kind_of_wait_and_long_cells_fit_in_100_characters() -> None:
    """Pure: the lines of a hand-made timeline spanning two days, with a message, a
    queue slot and a hibernation, and cells too long for one line."""
    start = datetime(2026, 5, 1, 23, 59, tzinfo=UTC)
    later = start + timedelta(minutes=2)
    bars = (
        Bar(
            "attempt", "x" * 60, "failed", start, start + timedelta(seconds=2), attempt=1,
            provider="celery", worker="worker-" + "w" * 60 + ":42",
            error="VeryLongModuleName." + "E" * 50,
        ),
        Bar("wait", "message", "waited", start, later, wait="message", step="await-payment"),
        Bar("wait", "hibernated", "waited", later, later, wait="hibernate", step="park"),
        Bar("wait", "queue slot", "waiting", later, None, wait="slot", current=True),
        Bar("child", "child · c-1", "completed", start, later),
    )  # fmt: skip
    timeline = Timeline(start, later, bars, ())
    header, *lines = timeline_lines(timeline)
    assert columns(header)[2] == "KIND"
    rows = [columns(line) for line in lines]
    assert [row[2] for row in rows] == ["step", "message", "hibernated", "slot"]
    assert [row[3] for row in rows[1:]] == ["await-payment", "park", "queue slot"]
    assert [row[5] for row in rows[1:]] == ["ok", "ok", "waiting"]
    assert rows[0][0] == "05-01 23:59:00" and rows[0][1] == "2.0 s"
    assert rows[0][5].startswith("VeryLong") and rows[0][5].endswith("…")
    assert rows[0][6].startswith("celery @ w") and rows[0][6].endswith("…")
    assert rows[3][1] == "…" and lines[3].startswith("*")
    assert max(len(line) for line in [header, *lines]) <= 100
    assert [e["kind"] for e in timeline_json(timeline)] == [
        "step", "message", "hibernated", "slot",
    ]  # fmt: skip
