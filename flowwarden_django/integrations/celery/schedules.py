"""Scheduled starts with django-celery-beat: a ``PeriodicTask`` of the task
``flowwarden_django.start_scheduled_workflow`` starts a workflow run at every tick.

The schedule is django-celery-beat's (edited in its admin, run by ``celery beat -S
django``); this module only starts the run. Each run gets the idempotency key
``schedule:<periodic task name>:<tick>``, where the tick is the schedule's latest due
time at or before the moment beat *sent* the task (stamped in its headers when it is
published; a crontab's matching minute, an interval's multiple of its period since
the epoch, UTC). Hence:

* **one run per tick**: a message delivered twice (two beats, a redelivery) starts
  nothing more; beat's sends of an interval are a period apart, so each has a tick
  of its own however long it waited in the queue;
* **missed ticks start once**: a start that runs after the schedule ticked again (an
  interval's period later; a crontab's next time) is late, and starts the run of the
  current tick: when the workers were down, the messages beat queued meanwhile start
  one run, for the latest tick (and that tick's own message finds it). A run never
  starts for a tick that has not come.

The state is a template: each string value (at any depth) is formatted with
``{tick}`` (ISO 8601), ``{date}`` (the tick's date) and ``{schedule}`` (the periodic
task's name), so ``{"day": "{date}"}`` becomes ``{"day": "2026-12-03"}``.
``schedule_workflow(...)`` creates or updates such a periodic task from code.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from ...workflows.operations.schedule_ticks import (
    ScheduleError,
    interval_tick,
    late,
    render_state,
    start_for_tick,
)

__all__ = [
    "START_TASK",
    "ScheduleError",
    "latest_tick",
    "render_state",
    "schedule_workflow",
    "start_scheduled",
]

logger = logging.getLogger("flowwarden_django.celery")

START_TASK = "flowwarden_django.start_scheduled_workflow"
#: The fields of a django-celery-beat crontab ("*" when not given).
CRONTAB_FIELDS = ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")
#: How far back a crontab's latest tick is looked for (a yearly schedule's).
MAX_LOOKBACK = timedelta(days=366)


def latest_tick(schedule: Any, now: datetime) -> datetime:
    """The latest time at or before *now* (aware) that *schedule* (a Celery
    ``crontab`` or ``schedule``) is due at."""
    run_every = getattr(schedule, "run_every", None)
    if hasattr(schedule, "minute") and hasattr(schedule, "day_of_week"):
        return _crontab_tick(schedule, now)
    if isinstance(run_every, timedelta):
        return interval_tick(run_every.total_seconds(), now)
    raise ScheduleError(
        f"{type(schedule).__name__} schedules are not supported: use a crontab or an interval"
    )


def _ticked_since(
    schedule: Any, tick: datetime, current: datetime, sent: datetime, now: datetime
) -> bool:
    """Whether *schedule* ticked again between a start's *sent* time and *now*: a
    crontab's next matching minute came; an interval's period passed (beat's sends of
    an interval are a period apart, not on the epoch's multiples)."""
    run_every = getattr(schedule, "run_every", None)
    if isinstance(run_every, timedelta) and not hasattr(schedule, "minute"):
        return (now - sent) >= run_every
    return current > tick


def _crontab_tick(schedule: Any, now: datetime) -> datetime:
    zone = getattr(schedule, "tz", None)
    local = now.astimezone(zone) if zone is not None else now
    candidate = local.replace(second=0, microsecond=0)
    limit = candidate - MAX_LOOKBACK
    minutes, hours = sorted(schedule.minute), sorted(schedule.hour)
    while candidate >= limit:
        cron_weekday = (candidate.weekday() + 1) % 7  # crontab: 0 is Sunday
        day_matches = (
            candidate.month in schedule.month_of_year
            and candidate.day in schedule.day_of_month
            and cron_weekday in schedule.day_of_week
        )
        if not day_matches:  # the previous day's last minute
            candidate = candidate.replace(hour=23, minute=59) - timedelta(days=1)
            continue
        hour = max((h for h in hours if h <= candidate.hour), default=None)
        if hour is None:
            candidate = candidate.replace(hour=23, minute=59) - timedelta(days=1)
            continue
        if hour < candidate.hour:
            candidate = candidate.replace(hour=hour, minute=59)
        minute = max((m for m in minutes if m <= candidate.minute), default=None)
        if minute is None:
            if candidate.hour == 0:
                candidate = candidate.replace(hour=23, minute=59) - timedelta(days=1)
            else:
                candidate = candidate.replace(minute=59) - timedelta(hours=1)
            continue
        return candidate.replace(minute=minute)
    raise ScheduleError(f"{schedule} had no tick in the year before {now.isoformat()}")


def start_scheduled(
    schedule_name: str,
    workflow: str,
    state: Any = None,
    *,
    sent_at: datetime | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Start *workflow* for the tick of periodic task *schedule_name* that the start
    sent at *sent_at* (default: *now*) belongs to, at most once per tick (see the
    module); what happened, as JSON."""
    from django_celery_beat.models import PeriodicTask

    task = PeriodicTask.objects.filter(name=schedule_name).first()
    if task is None:
        raise ScheduleError(f"no periodic task named {schedule_name!r}")
    now = now or timezone.now()
    sent = sent_at or now
    tick = latest_tick(task.schedule, sent)
    current = latest_tick(task.schedule, now)
    if late(sent, now, _ticked_since(task.schedule, tick, current, sent, now)):
        tick = current
    started = start_for_tick(schedule_name, workflow, state, tick)
    if started.created:
        logger.info("schedule %s: started %s for tick %s", schedule_name, workflow, tick)
    return {
        "schedule": schedule_name,
        "tick": tick.isoformat(),
        "coordination_id": started.coordination_id,
        "created": started.created,
    }


def schedule_workflow(
    name: str,
    workflow: str,
    *,
    state: Any = None,
    crontab: dict[str, str] | None = None,
    every: timedelta | None = None,
    enabled: bool = True,
    using: str | None = None,
) -> Any:
    """Create or update the django-celery-beat ``PeriodicTask`` *name* that starts
    *workflow* with the state template *state*, on *crontab* (``{"minute": "0",
    "hour": "2"}``) or *every* (a ``timedelta``): exactly one of them. It shows and
    can be edited in django-celery-beat's admin. *using*: the database beat reads
    (default: the router's)."""
    from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

    if (crontab is None) == (every is None):
        raise ScheduleError("schedule_workflow() takes exactly one of crontab= and every=")
    fields: dict[str, Any] = {
        "task": START_TASK,
        "kwargs": json.dumps({"workflow": workflow, "state": state}),
        "enabled": enabled,
        "crontab": None,
        "interval": None,
    }
    if crontab is not None:
        # Every field given: a partial match would take another task's crontab.
        spec = {field: "*" for field in CRONTAB_FIELDS} | dict(crontab)
        fields["crontab"], _ = CrontabSchedule.objects.db_manager(using).get_or_create(**spec)
    else:
        assert every is not None
        seconds = int(every.total_seconds())
        if seconds < 1:
            raise ScheduleError(f"every must be at least a second, not {every}")
        fields["interval"], _ = IntervalSchedule.objects.db_manager(using).get_or_create(
            every=seconds, period=IntervalSchedule.SECONDS
        )
    tasks = PeriodicTask.objects.db_manager(using)
    task, _ = tasks.update_or_create(name=name, defaults=fields)
    return task
