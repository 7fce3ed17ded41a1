"""``schedules``: the scheduled starts of workflows, wherever they live: the entries of
Celery's ``beat_schedule``, django-celery-beat's periodic tasks and, when the runs
execute on Temporal, the Temporal Schedules."""

from __future__ import annotations

from datetime import datetime
from importlib.util import find_spec
from typing import Any

from django.core.management.base import CommandError
from django.db import DatabaseError
from django.utils import timezone

from ...common.formatting import NONE_TEXT, age_text, dump_json
from ...conf import SETTING_NAME, fw_settings
from ...workflows import workflow_registry
from ...workflows.operations.schedule_ticks import ListedSchedule
from ..base import ActionCommand
from .output import fit_table, iso

SCHEDULE_HEADERS = ("NAME", "WORKFLOW", "SCHEDULE", "ENABLED", "LAST RUN", "NEXT RUN", "WHERE")
#: The columns that give way when a line would be too long: name, workflow, schedule.
_SHRINKING = (0, 1, 2)


class ScheduleActions(ActionCommand):
    """``schedules`` of ``manage.py flowwarden_workflows``."""

    def handle_schedules(self, *, json: bool, database: str | None, **options: Any) -> None:
        notes: list[str] = []
        schedules = _celery_schedules(database, notes) + _temporal_schedules(notes)
        notes += [
            f"Schedule {s.name!r} starts {s.workflow!r}, which this process does not define."
            for s in schedules
            if s.workflow and s.workflow not in workflow_registry
        ]
        if json:
            self.stdout.write(
                dump_json({"schedules": [_schedule_json(s) for s in schedules], "notes": notes})
            )
            return
        if schedules:
            now = timezone.now()
            self.write_table(
                fit_table(SCHEDULE_HEADERS, [_row(s, now) for s in schedules], shrink=_SHRINKING)
            )
        else:
            self.stdout.write("No scheduled starts.")
        for note in notes:
            self.stdout.write(self.style.WARNING(note))


def _celery_schedules(database: str | None, notes: list[str]) -> list[ListedSchedule]:
    if find_spec("celery") is None:
        notes.append("Celery beat schedules: not read (Celery is not installed).")
        return []
    from ...integrations.celery.schedules import listed_schedules

    try:
        return listed_schedules(using=database)
    except DatabaseError as exc:
        raise CommandError(
            f"django-celery-beat's periodic tasks could not be read: {exc}. "
            "Has `manage.py migrate django_celery_beat` been run"
            + (f" on the database {database!r}?" if database else "?")
        ) from exc


def _temporal_schedules(notes: list[str]) -> list[ListedSchedule]:
    execution = fw_settings.WORKFLOW_EXECUTION
    if execution != "temporal":
        notes.append(
            f"Temporal schedules: not read ({SETTING_NAME}['WORKFLOW_EXECUTION'] is "
            f"{execution!r}, not 'temporal')."
        )
        return []
    if find_spec("temporalio") is None:
        notes.append(
            "Temporal schedules: not read (temporalio is not installed: "
            "pip install 'flowwarden-django[temporal]')."
        )
        return []
    from ...integrations.temporal.config import TemporalConfig
    from ...integrations.temporal.schedules import listed_schedules

    config = TemporalConfig.from_settings()  # a bad setting: ImproperlyConfigured
    try:
        return listed_schedules(config=config)
    except Exception as exc:  # whatever the SDK raises: one line, never a traceback
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        notes.append(
            f"Temporal schedules: not read (the server at {config.target}, namespace "
            f"{config.namespace!r}, did not answer: {type(exc).__name__}"
            + (f": {reason}" if reason else "")
            + ")."
        )
        return []


def _row(schedule: ListedSchedule, now: datetime) -> tuple[str, ...]:
    return (
        schedule.name,
        schedule.workflow or NONE_TEXT,
        schedule.schedule,
        "yes" if schedule.enabled else "no",
        age_text(schedule.last_run, now),
        _next_text(schedule.next_run, now),
        schedule.source,
    )


def _next_text(at: datetime | None, now: datetime) -> str:
    if at is None:
        return NONE_TEXT
    return "due" if at <= now else age_text(at, now)


def _schedule_json(schedule: ListedSchedule) -> dict[str, Any]:
    return {
        "name": schedule.name,
        "workflow": schedule.workflow or None,
        "schedule": schedule.schedule,
        "enabled": schedule.enabled,
        "last_run": iso(schedule.last_run),
        "next_run": iso(schedule.next_run),
        "source": schedule.source,
    }
