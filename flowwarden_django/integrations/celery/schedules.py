"""Scheduled starts with Celery beat: the task ``flowwarden_django.start_scheduled_workflow``
starts a workflow run at every tick of a schedule, which is either

* an entry of Celery's own ``beat_schedule`` (made with :func:`beat_schedule_entry`; run
  by ``celery beat``; needs nothing but Celery, on every Django this package supports), or
* a django-celery-beat ``PeriodicTask`` (made with :func:`schedule_workflow` or in its
  admin; run by ``celery beat -S django``), the admin-editable option.

Beat decides when; this module only starts the run. Each run gets the idempotency key
``schedule:<schedule name>:<tick>``, where the tick is the schedule's latest due
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
``{tick}`` (ISO 8601), ``{date}`` (the tick's date) and ``{schedule}`` (the schedule's
name), so ``{"day": "{date}"}`` becomes ``{"day": "2026-12-03"}``; a template that
cannot format is refused when the schedule is made (``ScheduleError``).
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from typing import Any

from django.apps import apps
from django.utils import timezone

from ...workflows.operations.schedule_ticks import (
    BEAT_SCHEDULE,
    DJANGO_CELERY_BEAT,
    ListedSchedule,
    ScheduleError,
    check_state_template,
    interval_text,
    interval_tick,
    late,
    render_state,
    start_for_tick,
)

__all__ = [
    "START_TASK",
    "ScheduleError",
    "beat_schedule_entry",
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


def _celery_schedule(value: Any) -> Any:
    """A ``beat_schedule`` entry's schedule as a Celery schedule (beat also takes
    seconds and timedeltas)."""
    from celery.schedules import schedule

    if isinstance(value, timedelta):
        return schedule(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return schedule(timedelta(seconds=value))
    return value


def _find_schedule(schedule_name: str, app: Any = None) -> Any:
    """The schedule named *schedule_name*: the ``beat_schedule`` entry of that name that
    starts workflows, else the django-celery-beat periodic task (when installed)."""
    if app is None:
        from celery import current_app as app
    entry = (app.conf.beat_schedule or {}).get(schedule_name)
    if isinstance(entry, dict) and entry.get("task") == START_TASK:
        return _celery_schedule(entry.get("schedule"))
    if apps.is_installed("django_celery_beat"):
        from django_celery_beat.models import PeriodicTask

        task = PeriodicTask.objects.filter(name=schedule_name).first()
        if task is not None:
            return task.schedule
    raise ScheduleError(
        f"no periodic task named {schedule_name!r}: neither an entry of Celery's "
        "beat_schedule (see beat_schedule_entry) nor a django-celery-beat periodic task"
    )


def start_scheduled(
    schedule_name: str,
    workflow: str,
    state: Any = None,
    *,
    sent_at: datetime | None = None,
    now: datetime | None = None,
    app: Any = None,
) -> dict[str, Any]:
    """Start *workflow* for the tick of schedule *schedule_name* (a ``beat_schedule``
    entry of *app*, default Celery's current app, or a django-celery-beat periodic task)
    that the start sent at *sent_at* (default: *now*) belongs to, at most once per tick
    (see the module); what happened, as JSON."""
    schedule = _find_schedule(schedule_name, app)
    now = now or timezone.now()
    sent = sent_at or now
    tick = latest_tick(schedule, sent)
    current = latest_tick(schedule, now)
    if late(sent, now, _ticked_since(schedule, tick, current, sent, now)):
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


def _check_schedule(
    function: str, state: Any, crontab: dict[str, str] | None, every: timedelta | None
) -> None:
    """What both ways of scheduling refuse: not exactly one of *crontab* and *every*,
    an interval under a second, a state template that cannot format."""
    if (crontab is None) == (every is None):
        raise ScheduleError(f"{function}() takes exactly one of crontab= and every=")
    if every is not None and every < timedelta(seconds=1):
        raise ScheduleError(f"every must be at least a second, not {every}")
    check_state_template(state)


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

    _check_schedule("schedule_workflow", state, crontab, every)
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
        fields["interval"], _ = IntervalSchedule.objects.db_manager(using).get_or_create(
            every=seconds, period=IntervalSchedule.SECONDS
        )
    tasks = PeriodicTask.objects.db_manager(using)
    task, _ = tasks.update_or_create(name=name, defaults=fields)
    return task


def beat_schedule_entry(
    name: str,
    workflow: str,
    *,
    state: Any = None,
    crontab: dict[str, str] | None = None,
    every: timedelta | None = None,
) -> dict[str, Any]:
    """An entry of Celery's own ``beat_schedule`` that starts *workflow* with the state
    template *state*, on *crontab* (``{"minute": "0", "hour": "2"}``, in Celery's
    time zone) or *every* (a ``timedelta``): exactly one of them. No django-celery-beat
    needed; put it under the key *name*::

        app.conf.beat_schedule = {
            "nightly-report": beat_schedule_entry(
                "nightly-report", "nightly-report", crontab={"minute": "0", "hour": "2"}
            ),
        }

    A bad template or schedule raises ``ScheduleError`` here, when the app loads.
    """
    from celery.schedules import crontab as celery_crontab

    _check_schedule("beat_schedule_entry", state, crontab, every)
    if crontab is not None:
        unknown = sorted(set(crontab) - set(CRONTAB_FIELDS))
        if unknown:
            raise ScheduleError(
                f"crontab fields are {', '.join(CRONTAB_FIELDS)}, not {', '.join(unknown)}"
            )
        try:
            schedule: Any = celery_crontab(**crontab)
        except ValueError as exc:
            raise ScheduleError(f"crontab {crontab!r}: {exc}") from exc
    else:
        assert every is not None
        schedule = every
    return {
        "task": START_TASK,
        "schedule": schedule,
        "kwargs": {"workflow": workflow, "state": state, "schedule": name},
        # Also read as the task's request.periodic_task_name, as django-celery-beat sends it.
        "options": {"headers": {"periodic_task_name": name}},
    }


def listed_schedules(
    app: Any = None, *, using: str | None = None, now: datetime | None = None
) -> list[ListedSchedule]:
    """The schedules that start workflows: the entries of *app*'s ``beat_schedule``
    (default: Celery's current app; they have no last start beat shares), then the
    django-celery-beat periodic tasks (when installed; *using*: their database), each
    by name."""
    if app is None:
        from celery import current_app as app
    now = now or timezone.now()
    found = []
    for name, entry in sorted((app.conf.beat_schedule or {}).items()):
        if not isinstance(entry, dict) or entry.get("task") != START_TASK:
            continue
        schedule = _celery_schedule(entry.get("schedule"))
        workflow = (entry.get("kwargs") or {}).get("workflow")
        found.append(
            ListedSchedule(
                name,
                str(workflow or ""),
                schedule_text(schedule),
                True,
                BEAT_SCHEDULE,
                next_run=next_run(schedule, None, now),
            )
        )
    if apps.is_installed("django_celery_beat"):
        found.extend(_periodic_tasks(using, now))
    return found


def _periodic_tasks(using: str | None, now: datetime) -> list[ListedSchedule]:
    from django_celery_beat.models import PeriodicTask

    tasks = (
        PeriodicTask.objects.using(using)
        .filter(task=START_TASK)
        .select_related("crontab", "interval", "solar", "clocked")
        .order_by("name")
    )
    found = []
    for task in tasks:
        try:
            arguments = json.loads(task.kwargs or "{}")
        except ValueError:
            arguments = {}
        workflow = arguments.get("workflow") if isinstance(arguments, dict) else None
        try:
            schedule = task.schedule
        except AttributeError:  # a row without any schedule (beat refuses it too)
            schedule = None
        found.append(
            ListedSchedule(
                task.name,
                str(workflow or ""),
                "—" if schedule is None else schedule_text(schedule),
                task.enabled,
                DJANGO_CELERY_BEAT,
                task.last_run_at,
                next_run(schedule, task.last_run_at, now) if task.enabled and schedule else None,
            )
        )
    return found


def schedule_text(schedule: Any) -> str:
    """A Celery schedule in words: ``"cron 0 2 * * *"`` (with its time zone when it
    has one other than UTC), ``"every 5m"``, ``"once at <time>"``, ``"solar sunset at
    <lat>,<lon>"``."""
    if hasattr(schedule, "_orig_minute"):
        fields = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
        text = "cron " + " ".join(str(getattr(schedule, f"_orig_{f}")) for f in fields)
        zone = getattr(schedule, "tz", None)
        return text if zone is None or str(zone) == "UTC" else f"{text} ({zone})"
    if hasattr(schedule, "clocked_time"):
        return f"once at {schedule.clocked_time.isoformat()}"
    if hasattr(schedule, "event") and hasattr(schedule, "lat"):
        return f"solar {schedule.event} at {schedule.lat},{schedule.lon}"
    run_every = getattr(schedule, "run_every", None)
    if isinstance(run_every, timedelta):
        return interval_text(run_every.total_seconds())
    return str(schedule)


def next_run(schedule: Any, last_run: datetime | None, now: datetime) -> datetime | None:
    """When beat next starts *schedule*, last started at *last_run* (``None``: never,
    or not known), as of *now* (*now* itself when it is due). An interval's is not
    known before its first start (it counts from beat's start)."""
    run_every = getattr(schedule, "run_every", None)
    if isinstance(run_every, timedelta) and not hasattr(schedule, "_orig_minute"):
        return None if last_run is None else max(last_run + run_every, now)
    try:
        if hasattr(schedule, "_orig_minute"):  # a crontab: its next matching minute
            start, delta, _ = schedule.remaining_delta(last_run or now)
            at = start + delta
        else:
            at = now + schedule.remaining_estimate(last_run or now)
    except (AttributeError, TypeError, ValueError):  # a schedule of another kind
        return None
    return max(at, now)
