"""Scheduled starts' pieces without a broker: where a schedule's ticks fall, the
state template, the periodic task made from code, and a start per tick."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

pytest.importorskip("django_celery_beat", reason="scheduled starts need django-celery-beat")

from celery.schedules import crontab, schedule
from django_celery_beat.models import PeriodicTask

from flowwarden_django.integrations.celery.schedules import (
    START_TASK,
    ScheduleError,
    latest_tick,
    render_state,
    schedule_workflow,
    start_scheduled,
)
from flowwarden_django.models import WorkflowRun
from flowwarden_django.workflows import Workflow, advance, step, workflow_registry

pytestmark = pytest.mark.django_db(transaction=True)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("spec", "now", "tick"),
    [
        ({"minute": "0", "hour": "2"}, "2026-12-03T17:36:45", "2026-12-03T02:00:00"),
        ({"minute": "0", "hour": "2"}, "2026-12-03T01:59:59", "2026-12-02T02:00:00"),
        ({"minute": "*/15"}, "2026-12-03T17:36:45", "2026-12-03T17:30:00"),
        (
            {"minute": "30", "hour": "9", "day_of_week": "mon"},
            "2026-12-03T08:00:00",
            "2026-11-30T09:30:00",
        ),
        (
            {"minute": "0", "hour": "0", "day_of_month": "1"},
            "2026-12-03T00:00:00",
            "2026-12-01T00:00:00",
        ),
        (
            {"minute": "59", "hour": "23", "month_of_year": "1", "day_of_month": "31"},
            "2026-12-03T10:00:00",
            "2026-01-31T23:59:00",
        ),
    ],
)
def test_a_crontab_s_latest_tick(spec: dict[str, str], now: str, tick: str) -> None:
    assert latest_tick(crontab(**spec), at(now)) == at(tick)


def test_a_crontab_s_tick_is_in_its_time_zone() -> None:
    zone = ZoneInfo("Europe/Paris")
    from django_celery_beat.tzcrontab import TzAwareCrontab

    paris = TzAwareCrontab(minute="0", hour="2", tz=zone)
    found = latest_tick(paris, at("2026-12-03T01:30:00"))
    assert found == datetime(2026, 12, 3, 2, 0, tzinfo=zone)  # 01:00 UTC


def test_an_interval_s_ticks_are_multiples_of_its_period() -> None:
    every_ten = schedule(timedelta(seconds=10))
    assert latest_tick(every_ten, at("2026-12-03T17:36:45.5")) == at("2026-12-03T17:36:40")
    with pytest.raises(ScheduleError, match="no ticks"):
        latest_tick(schedule(timedelta(0)), at("2026-12-03T17:36:45"))
    with pytest.raises(ScheduleError, match="not supported"):
        latest_tick(object(), at("2026-12-03T17:36:45"))


def test_the_state_template() -> None:
    template = {"day": "{date}", "items": ["{schedule}", 3, None], "literal": "{{x}}"}
    assert render_state(template, tick="T", date="D", schedule="S") == {
        "day": "D",
        "items": ["S", 3, None],
        "literal": "{x}",
    }
    with pytest.raises(ScheduleError, match="nope"):
        render_state("{nope}", tick="T", date="D", schedule="S")


@pytest.fixture
def nightly() -> Any:
    name = f"sched-{uuid.uuid4().hex[:8]}"
    Workflow.define(name, [step("go")(advance)])
    yield name
    workflow_registry.unregister(name)


def test_a_periodic_task_starts_one_run_per_tick(nightly: str) -> None:
    task = schedule_workflow(
        "nightly", nightly, state={"day": "{date}"}, crontab={"minute": "0", "hour": "2"}
    )
    assert task.task == START_TASK and task.crontab.hour == "2" and task.interval is None
    first = start_scheduled("nightly", nightly, {"day": "{date}"}, now=at("2026-12-03T02:00:05"))
    again = start_scheduled("nightly", nightly, {"day": "{date}"}, now=at("2026-12-03T09:00:00"))
    later = start_scheduled("nightly", nightly, {"day": "{date}"}, now=at("2026-12-04T02:00:00"))
    assert (first["created"], again["created"], later["created"]) == (True, False, True)
    assert first["coordination_id"] == again["coordination_id"] != later["coordination_id"]
    run = WorkflowRun.objects.get(pk=first["coordination_id"])
    assert run.idempotency_key == "schedule:nightly:2026-12-03T02:00:00+00:00"
    state = Workflow.for_coordination(run.pk).current_result().final_state
    assert state == {"day": "2026-12-03"}
    # Edited: the same periodic task, now an interval.
    edited = schedule_workflow("nightly", nightly, every=timedelta(minutes=5))
    assert edited.pk == task.pk and edited.crontab is None and edited.interval.every == 300
    assert PeriodicTask.objects.filter(name="nightly").count() == 1


def test_schedule_mistakes_are_clear_errors(nightly: str) -> None:
    with pytest.raises(ScheduleError, match="exactly one"):
        schedule_workflow("x", nightly)
    with pytest.raises(ScheduleError, match="at least a second"):
        schedule_workflow("x", nightly, every=timedelta(milliseconds=10))
    with pytest.raises(ScheduleError, match="no periodic task named 'missing'"):
        start_scheduled("missing", nightly)


def test_a_start_counts_for_the_tick_it_was_sent_in_unless_it_is_late(nightly: str) -> None:
    """Beat's sends of a 10 s interval are a period apart but not on the epoch's
    multiples: a start sent at :09.9 and run at :10.1 is the :00 tick's (the next
    send, at :19.9, the :10 tick's); one that runs a period or more after it was sent
    is late and starts the current tick's run (a backlog starts one)."""
    schedule_workflow("every-10s", nightly, every=timedelta(seconds=10))
    first = start_scheduled(
        "every-10s", nightly, sent_at=at("2026-12-03T10:00:09.9"), now=at("2026-12-03T10:00:10.1")
    )
    second = start_scheduled(
        "every-10s", nightly, sent_at=at("2026-12-03T10:00:19.9"), now=at("2026-12-03T10:00:20.05")
    )
    assert (first["tick"], second["tick"]) == (
        "2026-12-03T10:00:00+00:00",
        "2026-12-03T10:00:10+00:00",
    )
    assert first["created"] and second["created"]
    backlog = [
        start_scheduled(
            "every-10s",
            nightly,
            sent_at=at(f"2026-12-03T10:0{n}:00"),
            now=at("2026-12-03T10:09:05"),
        )
        for n in (5, 6, 7)
    ]
    assert {b["tick"] for b in backlog} == {"2026-12-03T10:09:00+00:00"}
    assert [b["created"] for b in backlog] == [True, False, False]
