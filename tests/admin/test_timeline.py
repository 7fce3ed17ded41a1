"""The timeline builder (``workflows.operations.timeline``): bars of attempts, waits
and child runs from what the engine records, placed on one axis, the current
position marked."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.contrib.auth.models import User

from flowwarden_django.admin.run_stores import run_store
from flowwarden_django.models import Approval, WorkflowRun
from flowwarden_django.workflows import WorkflowSnapshot
from flowwarden_django.workflows.definition.metadata import (
    LAST_STEP,
    PAUSE_STATUS,
    STEP_ATTEMPTS,
    STEP_DURATION_MS,
    STEP_ERRORS,
    STEP_PROVIDER,
    STEP_STARTED_AT,
    STEP_WORKER,
    WAKE_AT,
    WORKFLOW_DONE,
)
from flowwarden_django.workflows.execution.step_timings import (
    AttemptError,
    errors_json,
    parse_errors,
    step_timing_of,
)
from flowwarden_django.workflows.operations.timeline import (
    Bar,
    build_timeline,
    duration_text,
    head_chain,
    load_timeline,
)
from tests.support.timeline_workflow import (
    CHILD,
    ORDERS,
    define_orders,
    drive_orders,
    forget_orders,
)

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
Status = WorkflowRun.Status


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def snap(seq: int, parent: str | None, created: float, **metadata: str) -> WorkflowSnapshot:
    return WorkflowSnapshot(
        id=f"s{seq}",
        coordination_id="tl",
        parent_id=parent,
        seq=seq,
        metadata=metadata,
        created_at=at(created),
    )


def attempt(step: str, start: float, ms: float, attempts: int = 1, **more: str) -> dict[str, str]:
    return {
        LAST_STEP: step,
        WORKFLOW_DONE: "false",
        STEP_STARTED_AT: at(start).isoformat(),
        STEP_DURATION_MS: f"{ms:.1f}",
        STEP_ATTEMPTS: str(attempts),
        STEP_WORKER: "host-a:12",
        STEP_PROVIDER: "celery",
        **more,
    }


def a_run(**fields: Any) -> WorkflowRun:
    values = {
        "coordination_id": "tl",
        "workflow_name": ORDERS,
        "status": Status.COMPLETED,
        "created_at": T0,
        "updated_at": at(100),
        "head_snapshot_id": "s6",
        "last_step": "ship",
    }
    values.update(fields)
    return WorkflowRun(**values)


def chain() -> list[WorkflowSnapshot]:
    """Seed; reserve failed once then succeeded; review asked an approval; cool-off
    slept; pack spawned two children; ship completed the run."""
    failed = errors_json(
        [AttemptError(1, "FlakyError", "timed out", at(1).isoformat(), 2000.0, "host-b:7")]
    )
    return [
        snap(1, None, 0),
        snap(2, "s1", 5, **attempt("reserve", 4, 1000, 2, **{STEP_ERRORS: failed})),
        snap(3, "s2", 6, **attempt("review", 5.5, 500, **{PAUSE_STATUS: Status.WAITING})),
        snap(
            4,
            "s3",
            31,
            **attempt(
                "cool-off",
                30.5,
                500,
                **{PAUSE_STATUS: Status.SLEEPING, WAKE_AT: at(60).isoformat()},
            ),
        ),
        snap(5, "s4", 62, **attempt("pack", 61, 1000, **{PAUSE_STATUS: Status.WAITING_CHILDREN})),
        snap(6, "s5", 91, **attempt("ship", 90, 1000, **{WORKFLOW_DONE: "true"})),
    ]


def approval(decided: float | None) -> Approval:
    return Approval(
        snapshot_id="s3",
        coordination_id="tl",
        step_name="review",
        status=Approval.Status.APPROVED if decided else Approval.Status.PENDING,
        requested_at=at(6),
        decided_at=at(decided) if decided else None,
    )


def child(n: int, status: str = Status.COMPLETED) -> Any:
    return SimpleNamespace(
        coordination_id=f"tl.{n}",
        workflow_name=CHILD,
        status=status,
        created_at=at(62 + n),
        updated_at=at(70 + 10 * n),
    )


def bars_of(timeline: Any, kind: str) -> list[Bar]:
    return [bar for bar in timeline.bars if bar.kind == kind]


def test_a_run_with_a_retried_step_an_approval_a_sleep_and_two_children():
    timeline = build_timeline(
        a_run(),
        chain(),
        [approval(30)],
        [child(1), child(2)],
        now=at(500),
        child_url=lambda cid: f"/runs/{cid}/",
    )
    attempts = bars_of(timeline, "attempt")
    assert [(b.label, b.outcome, b.attempt) for b in attempts] == [
        ("reserve", "failed", 1),
        ("reserve", "succeeded", 2),
        ("review", "paused", 1),
        ("cool-off", "paused", 1),
        ("pack", "paused", 1),
        ("ship", "completed", 1),
    ]
    failed, succeeded = attempts[:2]
    assert failed.error == "FlakyError" and failed.worker == "host-b:7"
    assert failed.start == at(1) and failed.end == at(3)
    assert succeeded.start == at(4) and succeeded.end == at(5)
    assert succeeded.provider == "celery" and succeeded.worker == "host-a:12"
    assert "FlakyError" in failed.description and "attempt 1" in failed.description
    waits = bars_of(timeline, "wait")
    assert [(b.wait, b.outcome, b.start, b.end) for b in waits] == [
        ("approval", "waited", at(6), at(30)),  # the approval row's request and decision
        ("sleep", "waited", at(31), at(61)),  # until the next step's first attempt
        ("children", "waited", at(62), at(90)),
    ]
    children = bars_of(timeline, "child")
    assert [(b.url, b.outcome, b.end) for b in children] == [
        ("/runs/tl.1/", "completed", at(80)),
        ("/runs/tl.2/", "completed", at(90)),
    ]
    # A finished run: the axis ends with its last bar, the current position is its end.
    assert timeline.start == T0 and timeline.end == at(91)
    assert timeline.current == attempts[-1]
    for bar in timeline.bars:
        assert bar.left is not None and bar.width is not None
        assert bar.left >= 0 and bar.left + bar.width <= 100.0001
        assert bar.description
    assert failed.left == pytest.approx(100 / 91, abs=0.001)
    assert [t.left for t in timeline.ticks] == [0, 50, 100]
    assert [t.label for t in timeline.ticks] == ["0", "+45.5 s", "+1.5 min"]


def test_the_wait_a_run_is_in_is_its_current_position_and_lasts_until_now():
    steps = chain()[:3]
    run = a_run(status=Status.WAITING, head_snapshot_id="s3", last_step="review")
    timeline = build_timeline(run, steps, [approval(None)], now=at(50))
    current = timeline.current
    assert current is not None and current.kind == "wait" and current.wait == "approval"
    assert current.end is None and current.outcome == "waiting" and current.took == "…"
    assert timeline.end == at(50)
    assert current.left + current.width == pytest.approx(100)
    assert "current position" in current.description


def test_a_failed_run_ends_with_its_failed_attempt_named_by_its_error_class():
    run = a_run(
        status=Status.FAILED,
        head_snapshot_id="s2",
        last_step="reserve",
        failure_reason="unhandled exception: KeyError: 'card'",
        updated_at=at(9),
    )
    timeline = build_timeline(run, chain()[:2], now=at(50))
    last = timeline.bars[-1]
    assert (last.outcome, last.error, last.current) == ("failed", "KeyError", True)
    assert "'card'" not in last.description  # the message may quote the state


def test_a_run_waiting_for_a_queue_slot_and_attempts_a_provider_kept_on_the_record():
    kept = json.loads(
        errors_json([AttemptError(1, "ConnectionError", "down", at(7).isoformat(), 10.0)])
    )
    run = a_run(
        status=Status.WAITING_SLOT,
        head_snapshot_id="s2",
        queued_at=at(8),
        step_errors=kept,
    )
    timeline = build_timeline(run, chain()[:2], now=at(20))
    failed, slot = timeline.bars[-2:]
    assert (failed.outcome, failed.error, failed.start) == ("failed", "ConnectionError", at(7))
    assert (slot.wait, slot.start, slot.end, slot.current) == ("slot", at(8), None, True)


def test_steps_recorded_before_start_times_are_placed_by_their_snapshot_time():
    old = snap(
        2, "s1", 10, **{LAST_STEP: "reserve", STEP_DURATION_MS: "2000.0", STEP_ATTEMPTS: "1"}
    )
    timeline = build_timeline(a_run(head_snapshot_id="s2"), [snap(1, None, 0), old], now=at(20))
    (bar,) = timeline.bars
    assert bar.start == at(8) and bar.end == at(10) and bar.where == ""
    # An old failed attempt (class only): listed, with no place on the axis.
    errors = json.dumps([{"attempt": 1, "error": "OSError"}])
    older = snap(
        2,
        "s1",
        10,
        **{LAST_STEP: "reserve", STEP_DURATION_MS: "1", STEP_ATTEMPTS: "2", STEP_ERRORS: errors},
    )
    first = build_timeline(a_run(head_snapshot_id="s2"), [snap(1, None, 0), older]).bars[0]
    assert first.error == "OSError" and first.left is None and first.took == "—"


def test_the_head_chain_leaves_forks_out():
    steps = chain()
    fork = snap(9, "s2", 40, **attempt("review", 39, 10))
    assert [s.id for s in head_chain([*steps, fork], "s6")] == [f"s{n}" for n in range(1, 7)]
    assert [s.id for s in head_chain([fork, *steps], "missing")][:2] == ["s1", "s2"]


def test_attempt_errors_keep_their_start_duration_and_worker_and_read_old_ones():
    error = AttemptError.of(
        2, ValueError("x" * 900), started_at=at(1).isoformat(), duration_ms=12.34, worker="w:1"
    )
    (read,) = parse_errors(errors_json([error]))
    assert read == AttemptError(2, "ValueError", "x" * 500, at(1).isoformat(), 12.3, "w:1")
    assert error.as_dict(with_message=False) == {"attempt": 2, "error": "ValueError"}
    assert parse_errors('[{"attempt": 1, "error": "E"}]') == (AttemptError(1, "E", ""),)
    timing = step_timing_of(attempt("reserve", 1, 5))
    assert timing is not None and (timing.provider, timing.worker) == ("celery", "host-a:12")


def test_durations_read_in_their_unit():
    assert [duration_text(timedelta(seconds=s)) for s in (0.25, 4.25, 150, 9000, 400000)] == [
        "250 ms",
        "4.2 s",
        "2.5 min",
        "2.5 h",
        "4.6 d",
    ]


@pytest.mark.django_db(transaction=True)
def test_the_timeline_of_a_real_run_from_its_store_and_database():
    define_orders()
    try:
        user = User.objects.create_superuser("op", "op@example.com", "pw")
        run = drive_orders("tl-real", user)
        assert run.status == Status.COMPLETED
        store = run_store(run.workflow_name, run.pk, "default").store
        timeline = load_timeline(run, store, child_url=lambda cid: f"/c/{cid}/")
    finally:
        forget_orders()
    attempts = bars_of(timeline, "attempt")
    assert [(b.label, b.outcome) for b in attempts[:2]] == [
        ("reserve", "failed"),
        ("reserve", "succeeded"),
    ]
    assert attempts[0].error == "FlakyError" and attempts[0].start is not None
    assert {b.provider for b in attempts[1:]} == {"inprocess"}
    assert all(b.worker for b in attempts)
    assert [b.wait for b in bars_of(timeline, "wait")] == ["approval", "sleep", "children"]
    children = bars_of(timeline, "child")
    assert len(children) == 2 and all(b.url.startswith("/c/tl-real.") for b in children)
    assert all(b.left is not None for b in timeline.bars)
