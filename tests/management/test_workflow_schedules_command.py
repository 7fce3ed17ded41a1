"""``manage.py flowwarden_workflows schedules``: the scheduled starts from Celery's
``beat_schedule``, django-celery-beat's periodic tasks and Temporal Schedules (a fake
Temporal client, and a server that does not answer), as a table and as JSON."""

from __future__ import annotations

import asyncio
import io
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("django_celery_beat", reason="the listing reads django-celery-beat")

from celery import Celery
from django.core.management import CommandError, call_command
from django.db import OperationalError
from django.test import override_settings
from django.utils import timezone

from flowwarden_django.integrations.celery import schedules as celery_schedules
from flowwarden_django.integrations.celery.schedules import (
    beat_schedule_entry,
    schedule_workflow,
)
from flowwarden_django.integrations.temporal import schedules as temporal_schedules
from flowwarden_django.integrations.temporal.messages import (
    SCHEDULED_START_TYPE,
    ScheduledStart,
)
from flowwarden_django.workflows import Workflow, advance, step, workflow_registry
from flowwarden_django.workflows.operations.schedule_ticks import interval_text
from tests.support.services import free_port

pytestmark = pytest.mark.django_db(transaction=True)

HEADERS = ["NAME", "WORKFLOW", "SCHEDULE", "ENABLED", "LAST RUN", "NEXT RUN", "WHERE"]


@pytest.fixture
def report() -> Iterator[str]:
    name = f"report-{uuid.uuid4().hex[:8]}"
    Workflow.define(name, [step("go")(advance)])
    yield name
    workflow_registry.unregister(name)


@pytest.fixture
def app() -> Iterator[Celery]:
    """A Celery app made current for the test (as a project's is), then the previous one."""
    from celery import current_app

    previous = current_app._get_current_object()
    celery_app = Celery("fw-schedules-command", broker="memory://", fixups=[])
    celery_app.set_current()
    try:
        yield celery_app
    finally:
        previous.set_current()


def schedules(*args: str) -> str:
    out = io.StringIO()
    call_command("flowwarden_workflows", "schedules", *args, stdout=out, no_color=True)
    return out.getvalue()


def table(output: str) -> list[list[str]]:
    """The table's rows (header first) split at its columns' starts; the notes below it
    left out."""
    lines = output.splitlines()
    starts = [lines[0].index(name) for name in HEADERS]
    notes = ("Schedule ", "Temporal schedules:", "Celery beat schedules:")
    rows = []
    for line in lines:
        if line.startswith(notes):
            break
        rows.append([line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)])
    return rows


def test_interval_text() -> None:
    assert interval_text(5400) == "every 1h 30m"
    assert interval_text(300) == "every 5m"
    assert interval_text(86400 * 2 + 5) == "every 2d 5s"
    assert interval_text(0.5) == "every 0.5s"


def test_beat_schedule_entries_and_periodic_tasks(report: str, app: Celery) -> None:
    app.conf.beat_schedule = {
        "nightly": beat_schedule_entry("nightly", report, crontab={"minute": "0", "hour": "2"}),
        "hourly": beat_schedule_entry("hourly", report, every=timedelta(hours=1)),
        "other-task": {"task": "proj.cleanup", "schedule": 60.0},
    }
    schedule_workflow(
        "db-weekly", report, crontab={"minute": "30", "hour": "9", "day_of_week": "1"}
    )
    every = schedule_workflow("db-every", report, every=timedelta(minutes=5))
    last = timezone.now() - timedelta(minutes=1)
    every.last_run_at = last
    every.save()
    schedule_workflow("db-off", "not-defined", every=timedelta(hours=2), enabled=False)

    output = schedules()
    rows = table(output)
    assert rows[0] == HEADERS
    by_name = {row[0]: row for row in rows[1:]}
    assert set(by_name) == {"hourly", "nightly", "db-every", "db-off", "db-weekly"}
    assert by_name["nightly"][1:4] == [report, "cron 0 2 * * *", "yes"]
    assert by_name["nightly"][4] == "—" and by_name["nightly"][5].startswith("in ")
    assert by_name["nightly"][6] == "beat_schedule"
    assert by_name["hourly"][2:] == ["every 1h", "yes", "—", "—", "beat_schedule"]
    assert by_name["db-weekly"][2] == "cron 30 9 * * 1"
    assert by_name["db-every"][2:4] == ["every 5m", "yes"]
    assert by_name["db-every"][4] == "1m ago" and by_name["db-every"][5].startswith("in ")
    assert by_name["db-off"][1:] == [
        "not-defined", "every 2h", "no", "—", "—", "django-celery-beat",
    ]  # fmt: skip
    assert "Schedule 'db-off' starts 'not-defined', which this process does not define." in output
    assert "Temporal schedules: not read (FLOWWARDEN['WORKFLOW_EXECUTION'] is 'inprocess'" in output
    assert max(len(line) for line in output.splitlines()) <= 100

    listed = json.loads(schedules("--json"))
    found = {entry["name"]: entry for entry in listed["schedules"]}
    assert found["db-every"] == {
        "name": "db-every",
        "workflow": report,
        "schedule": "every 5m",
        "enabled": True,
        "last_run": last.isoformat(),
        "next_run": (last + timedelta(minutes=5)).isoformat(),
        "source": "django-celery-beat",
    }
    nightly = datetime.fromisoformat(found["nightly"]["next_run"]).astimezone(UTC)
    assert (nightly.hour, nightly.minute) == (2, 0)
    assert timedelta(0) < nightly - timezone.now() <= timedelta(days=1)
    weekly = datetime.fromisoformat(found["db-weekly"]["next_run"]).astimezone(UTC)
    assert (weekly.isoweekday(), weekly.hour, weekly.minute) == (1, 9, 30)
    assert found["hourly"]["next_run"] is None and found["db-off"]["enabled"] is False
    assert any("not-defined" in note for note in listed["notes"])


def test_no_schedules(app: Celery) -> None:
    output = schedules()
    assert output.splitlines()[0] == "No scheduled starts."
    assert json.loads(schedules("--json"))["schedules"] == []


def test_mistakes_are_command_errors(app: Celery, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CommandError, match="Use one of the DATABASES aliases"):
        schedules("--database", "nope")

    def no_table(**kwargs: Any) -> Any:
        raise OperationalError("no such table: django_celery_beat_periodictask")

    monkeypatch.setattr(celery_schedules, "listed_schedules", no_table)
    with pytest.raises(CommandError, match=r"`manage.py migrate django_celery_beat`"):
        schedules()


class FakeHandle:
    """What ``describe()`` of a Temporal schedule handle gives, for a flowwarden
    schedule: the action's argument as the server returns it (an encoded payload)."""

    def __init__(self, described: Any) -> None:
        self.described = described

    async def describe(self) -> Any:
        return self.described


class FakeTemporalClient:
    """The two calls the listing makes: ``list_schedules`` and ``get_schedule_handle``."""

    def __init__(self, described: dict[str, Any], foreign: list[str]) -> None:
        self.described = described
        self.foreign = foreign

    async def list_schedules(self) -> Any:
        entries = [
            SimpleNamespace(id=i, schedule=SimpleNamespace(action=SimpleNamespace(workflow=t)))
            for i, t in [
                *((i, SCHEDULED_START_TYPE) for i in self.described),
                *((i, "SomeoneElsesWorkflow") for i in self.foreign),
            ]
        ]

        async def listing() -> Any:
            for entry in entries:
                yield entry

        return listing()

    def get_schedule_handle(self, schedule_id: str) -> FakeHandle:
        return FakeHandle(self.described[schedule_id])


def described(schedule_id: str, workflow: str, *, paused: bool = False) -> Any:
    from temporalio.client import ScheduleIntervalSpec, ScheduleSpec
    from temporalio.converter import DataConverter

    converter = DataConverter.default
    payloads = asyncio.run(
        converter.encode([ScheduledStart(schedule_id, workflow, {"day": "{date}"}, 3600.0)])
    )
    return SimpleNamespace(
        id=schedule_id,
        schedule=SimpleNamespace(
            action=SimpleNamespace(workflow=SCHEDULED_START_TYPE, args=payloads),
            spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(hours=1))]),
            state=SimpleNamespace(paused=paused),
        ),
        info=SimpleNamespace(
            recent_actions=[
                SimpleNamespace(scheduled_at=datetime(2026, 12, 6, 20, 0, tzinfo=UTC)),
                SimpleNamespace(scheduled_at=datetime(2026, 12, 6, 21, 0, tzinfo=UTC)),
            ],
            next_action_times=[datetime(2099, 1, 1, tzinfo=UTC)],
        ),
        data_converter=converter,
    )


@pytest.fixture
def fake_temporal(monkeypatch: pytest.MonkeyPatch) -> FakeTemporalClient:
    pytest.importorskip("temporalio")
    client = FakeTemporalClient({}, ["not-ours"])

    class FakeConnection:
        def __init__(self, config: Any) -> None:
            self.config = config

        def call(self, operation: Any) -> Any:
            return asyncio.run(operation(client))

        def close(self) -> None:
            pass

    monkeypatch.setattr(temporal_schedules, "TemporalConnection", FakeConnection)
    return client


@override_settings(FLOWWARDEN={"WORKFLOW_EXECUTION": "temporal"})
def test_temporal_schedules(app: Celery, report: str, fake_temporal: FakeTemporalClient) -> None:
    fake_temporal.described = {
        "hourly-report": described("hourly-report", report),
        "paused-one": described("paused-one", report, paused=True),
    }
    output = schedules()
    rows = {row[0]: row for row in table(output)[1:]}
    assert set(rows) == {"hourly-report", "paused-one"}  # not the foreign schedule
    assert rows["hourly-report"][1:4] == [report, "every 1h", "yes"]
    assert rows["hourly-report"][4].endswith(" ago") and rows["hourly-report"][5].startswith("in ")
    assert rows["hourly-report"][6] == "temporal"
    assert rows["paused-one"][3] == "no"
    assert "Temporal schedules: not read" not in output

    listed = json.loads(schedules("--json"))
    assert listed["schedules"][0] == {
        "name": "hourly-report",
        "workflow": report,
        "schedule": "every 1h",
        "enabled": True,
        "last_run": "2026-12-06T21:00:00+00:00",
        "next_run": "2099-01-01T00:00:00+00:00",
        "source": "temporal",
    }


def test_a_temporal_server_that_does_not_answer_is_a_note(app: Celery) -> None:
    pytest.importorskip("temporalio")
    target = f"127.0.0.1:{free_port()}"  # nothing listens there
    setting = {
        "WORKFLOW_EXECUTION": "temporal",
        "TEMPORAL": {"TARGET": target, "CONNECT_TIMEOUT": "1s", "CALL_TIMEOUT": "5s"},
    }
    with override_settings(FLOWWARDEN=setting):
        output = schedules()
        notes = json.loads(schedules("--json"))["notes"]
    line = next(line for line in output.splitlines() if line.startswith("Temporal"))
    assert line.startswith(f"Temporal schedules: not read (the server at {target}")
    assert "Traceback" not in output
    assert len(notes) == 1 and notes[0].startswith("Temporal schedules: not read")


def test_a_bad_temporal_setting_is_a_command_error(app: Celery) -> None:
    setting = {"WORKFLOW_EXECUTION": "temporal", "TEMPORAL": {"TARGET": "no port"}}
    with override_settings(FLOWWARDEN=setting), pytest.raises(CommandError, match="TARGET"):
        schedules()


@pytest.mark.lane("temporal")
def test_a_real_temporal_schedule(app: Celery, report: str, tmp_path: Any) -> None:
    """Against ``temporal server start-dev``: a schedule made with
    ``schedule_workflow`` is listed with its workflow (decoded from its action's
    argument) and its interval; the list is eventually consistent, so it is polled."""
    from tests.support.polling import wait_until
    from tests.support.temporal_procs import DevServer

    server = DevServer(tmp_path)
    server.start()
    try:
        setting = {"WORKFLOW_EXECUTION": "temporal", "TEMPORAL": {"TARGET": server.target}}
        with override_settings(FLOWWARDEN=setting):
            temporal_schedules.schedule_workflow("cmd-hourly", report, every=timedelta(hours=1))
            wait_until(lambda: "cmd-hourly" in schedules(), "the schedule listed", 30, 0.5)
            listed = json.loads(schedules("--json"))
        (found,) = [s for s in listed["schedules"] if s["source"] == "temporal"]
        assert found["name"] == "cmd-hourly" and found["workflow"] == report
        assert found["schedule"] == "every 1h" and found["enabled"] is True
        assert found["next_run"] is not None
        assert not any(note.startswith("Temporal") for note in listed["notes"])
    finally:
        server.stop()
