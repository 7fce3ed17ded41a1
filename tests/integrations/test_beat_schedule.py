"""Scheduled starts through Celery's own ``beat_schedule``: no django-celery-beat (so no
Django pin), the same one-run-per-tick start, mistakes refused when the schedule is
declared and by ``manage.py check``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

pytest.importorskip("celery", reason="scheduled starts need Celery")

from celery import Celery
from celery.beat import Scheduler
from celery.schedules import crontab

from flowwarden_django.checks import check_scheduled_starts
from flowwarden_django.integrations.celery.schedules import (
    START_TASK,
    ScheduleError,
    beat_schedule_entry,
    start_scheduled,
)
from flowwarden_django.models import WorkflowRun
from flowwarden_django.workflows import Workflow, advance, step, workflow_registry


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.fixture
def nightly() -> Iterator[str]:
    name = f"beat-{uuid.uuid4().hex[:8]}"
    Workflow.define(name, [step("go")(advance)])
    yield name
    workflow_registry.unregister(name)


@pytest.fixture
def app() -> Iterator[Celery]:
    """A Celery app made current for the test (as a project's is), then the previous one."""
    from celery import current_app

    previous = current_app._get_current_object()
    celery_app = Celery("fw-beat-schedule", broker="memory://", fixups=[])
    celery_app.conf.task_always_eager = True
    celery_app.set_current()
    try:
        yield celery_app
    finally:
        previous.set_current()


def test_an_entry_is_a_plain_beat_schedule_entry() -> None:
    entry = beat_schedule_entry(
        "nightly", "report", state={"day": "{date}"}, crontab={"minute": "0", "hour": "2"}
    )
    assert entry["task"] == START_TASK
    assert entry["schedule"] == crontab(minute="0", hour="2")
    assert entry["kwargs"] == {
        "workflow": "report",
        "state": {"day": "{date}"},
        "schedule": "nightly",
    }
    every = beat_schedule_entry("often", "report", every=timedelta(minutes=5))
    assert every["schedule"] == timedelta(minutes=5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one"),
        ({"every": timedelta(minutes=1), "crontab": {"minute": "0"}}, "exactly one"),
        ({"every": timedelta(milliseconds=10)}, "at least a second"),
        ({"crontab": {"minute": "0", "hours": "2"}}, "not hours"),
        ({"crontab": {"minute": "61"}}, "crontab"),
        ({"every": timedelta(hours=1), "state": {"x": "{tick.nope}"}}, "not a field"),
        ({"every": timedelta(hours=1), "state": ["{tick:>300000000}"]}, "more than 100"),
    ],
)
def test_a_mistaken_entry_is_refused_when_declared(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        beat_schedule_entry("nightly", "report", **kwargs)


@pytest.mark.django_db(transaction=True)
def test_a_beat_schedule_entry_starts_one_run_per_tick(nightly: str, app: Celery) -> None:
    app.conf.beat_schedule = {
        "nightly": beat_schedule_entry(
            "nightly", nightly, state={"day": "{date}"}, crontab={"minute": "0", "hour": "2"}
        )
    }
    first = start_scheduled("nightly", nightly, {"day": "{date}"}, now=at("2026-12-03T02:00:05"))
    again = start_scheduled("nightly", nightly, {"day": "{date}"}, now=at("2026-12-03T09:00:00"))
    later = start_scheduled("nightly", nightly, {"day": "{date}"}, now=at("2026-12-04T02:00:00"))
    assert (first["created"], again["created"], later["created"]) == (True, False, True)
    run = WorkflowRun.objects.get(pk=first["coordination_id"])
    assert run.idempotency_key == "schedule:nightly:2026-12-03T02:00:00+00:00"
    assert Workflow.for_coordination(run.pk).current_result().final_state == {"day": "2026-12-03"}
    with pytest.raises(ScheduleError, match="no periodic task named 'missing'"):
        start_scheduled("missing", nightly)


@pytest.mark.django_db(transaction=True)
def test_celery_beat_itself_sends_the_start(nightly: str, app: Celery) -> None:
    """Celery's own scheduler (not django-celery-beat's) applies the entry: the task
    finds its schedule by name and starts the run for the current tick."""
    import flowwarden_django.integrations.celery.tasks  # noqa: F401  (registers the task)

    app.conf.beat_schedule = {
        "every-hour": beat_schedule_entry(
            "every-hour",
            nightly,
            state={"at": "{tick}", "by": "{schedule}"},
            every=timedelta(hours=1),
        )
    }
    scheduler = Scheduler(app, lazy=True)
    scheduler.setup_schedule()
    result = scheduler.apply_async(scheduler.schedule["every-hour"])
    started = result.get()
    assert started["schedule"] == "every-hour" and started["created"] is True
    run = WorkflowRun.objects.get(pk=started["coordination_id"])
    final = Workflow.for_coordination(run.pk).current_result().final_state
    assert final == {"at": started["tick"], "by": "every-hour"}
    assert datetime.fromisoformat(started["tick"]).minute == 0


def test_check_names_a_hand_written_entry_that_cannot_start(app: Celery) -> None:
    app.conf.beat_schedule = {
        "good": beat_schedule_entry("good", "report", every=timedelta(hours=1)),
        "bad-template": {
            "task": START_TASK,
            "schedule": 60.0,
            "kwargs": {"workflow": "report", "state": "{tick.nope}", "schedule": "bad-template"},
        },
        "wrong-name": {
            "task": START_TASK,
            "schedule": 60.0,
            "kwargs": {"workflow": "report", "schedule": "other"},
        },
        "no-workflow": {"task": START_TASK, "schedule": 60.0, "kwargs": {"schedule": "x"}},
        "not-ours": {"task": "other.task", "schedule": 60.0},
    }
    errors = check_scheduled_starts()
    assert {error.id for error in errors} == {"flowwarden_django.E210"}
    named = sorted(error.msg.split("'")[1] for error in errors)
    assert named == ["bad-template", "no-workflow", "wrong-name"]
    assert any("not a field" in error.msg for error in errors)
