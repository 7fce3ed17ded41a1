"""What a scheduled start needs whatever runs the schedule (django-celery-beat or a
Temporal Schedule): the state template and the idempotency key of a tick.

A scheduled run's idempotency key is ``schedule:<schedule>:<tick>`` (the tick in ISO
8601), so a tick starts at most one run however often its start is delivered. The
tick is the schedule's latest due time at or before the moment the start was *sent*
(beat's send, Temporal's scheduled time), unless the start runs after the schedule
ticked again: then it is late, and starts the run of the current tick.
"""

from __future__ import annotations

import dataclasses
import re
import string
from datetime import UTC, datetime
from typing import Any

from ..definition.registry import workflow_registry

#: The fields a state template may name.
TEMPLATE_FIELDS = ("tick", "date", "schedule")
#: The largest width or precision a template's format spec may ask for: a value is
#: at most a few dozen characters, and ``{tick:>300000000}`` would build 300 MB.
MAX_FORMAT_WIDTH = 100

_FORMATTER = string.Formatter()
# A standard format spec: [[fill]align][sign][z][#][0][width][grouping][.precision][type]
_FORMAT_SPEC = re.compile(
    r"(?:.?[<>=^])?[-+ ]?z?#?0?(?P<width>\d*)[,_]?(?:\.(?P<precision>\d+))?[a-zA-Z%]?",
    re.DOTALL,
)


#: Where a listed schedule lives (``ListedSchedule.source``).
DJANGO_CELERY_BEAT = "django-celery-beat"
BEAT_SCHEDULE = "beat_schedule"
TEMPORAL = "temporal"

_INTERVAL_UNITS = ((86400, "d"), (3600, "h"), (60, "m"), (1, "s"))


@dataclasses.dataclass(frozen=True)
class ListedSchedule:
    """A schedule that starts a workflow, as ``manage.py flowwarden_workflows
    schedules`` lists it: its *name*, the *workflow* it starts, when (*schedule*, in
    words: ``"cron 0 2 * * *"``, ``"every 1h"``), whether it is *enabled*, its last
    and next start where known (``None``: not known), and where it lives
    (*source*: ``DJANGO_CELERY_BEAT``, ``BEAT_SCHEDULE`` or ``TEMPORAL``)."""

    name: str
    workflow: str
    schedule: str
    enabled: bool
    source: str
    last_run: datetime | None = None
    next_run: datetime | None = None


def interval_text(seconds: float) -> str:
    """An interval in words: ``"every 1h 30m"``, ``"every 45s"``, ``"every 0.5s"``."""
    if seconds < 1:
        return f"every {seconds:g}s"
    left, parts = round(seconds), []
    for size, unit in _INTERVAL_UNITS:
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "every " + " ".join(parts)


class ScheduleError(ValueError):
    """A schedule cannot start a run: unknown, a schedule whose ticks cannot be
    placed (a solar or clocked one), or a state template that does not format."""


def check_state_template(template: Any) -> None:
    """Raise ``ScheduleError`` unless every string of *template* (at any depth) formats
    with ``{tick}``, ``{date}`` and ``{schedule}``: no other field, no attribute or
    index, no nested field, no width or precision above ``MAX_FORMAT_WIDTH``."""
    if isinstance(template, str):
        _check_template_string(template)
    elif isinstance(template, dict):
        for value in template.values():
            check_state_template(value)
    elif isinstance(template, list | tuple):
        for value in template:
            check_state_template(value)


def _check_template_string(template: str) -> None:
    def refuse(reason: str) -> ScheduleError:
        return ScheduleError(
            f"state template {_shown(template)}: {reason} (a template names "
            "{tick}, {date} or {schedule}, with {{ and }} for braces)"
        )

    try:
        parts = list(_FORMATTER.parse(template))
    except ValueError as exc:
        raise refuse(str(exc)) from None
    for _literal, field, spec, conversion in parts:
        if field is None:
            continue
        if field not in TEMPLATE_FIELDS:
            raise refuse(f"{{{field}}} is not a field it can use")
        if conversion not in (None, "r", "s", "a"):
            raise refuse(f"!{conversion} is not a conversion")
        if not spec:
            continue
        if "{" in spec or "}" in spec:
            raise refuse(f"the format spec {spec!r} of {{{field}}} holds a field")
        match = _FORMAT_SPEC.fullmatch(spec)
        if match is None:
            raise refuse(f"{spec!r} is not a format spec")
        for name in ("width", "precision"):
            size = match.group(name)
            if size and int(size) > MAX_FORMAT_WIDTH:
                raise refuse(
                    f"the {name} {_shown(size)} of {{{field}}} is more than {MAX_FORMAT_WIDTH}"
                )


def _shown(text: str, limit: int = 80) -> str:
    """*text* quoted, cut to *limit* characters (a hostile template may be huge)."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def render_state(template: Any, **values: str) -> Any:
    """*template* with every string (at any depth) formatted with *values* (``{{``
    for a brace). Any failure is a ``ScheduleError`` (see ``check_state_template``,
    which runs first)."""
    if isinstance(template, str):
        _check_template_string(template)
        try:
            return template.format(**values)
        except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:
            raise ScheduleError(f"state template {_shown(template)}: {exc}") from exc
    if isinstance(template, dict):
        return {key: render_state(value, **values) for key, value in template.items()}
    if isinstance(template, list):
        return [render_state(value, **values) for value in template]
    return template


def interval_tick(period_seconds: float, now: datetime) -> datetime:
    """The latest multiple of *period_seconds* since the epoch (UTC) at or before *now*."""
    if period_seconds <= 0:
        raise ScheduleError(f"an interval of {period_seconds} s has no ticks")
    seconds = now.timestamp()
    return datetime.fromtimestamp(seconds - seconds % period_seconds, tz=UTC)


def late(sent: datetime, now: datetime, next_tick_came: bool) -> bool:
    """Whether a start sent at *sent* that runs at *now* is late: the schedule has
    ticked again since it was sent (*next_tick_came*). A late start counts as a
    missed tick: it starts the run of the current tick instead (one run for a
    backlog), never one for a tick that has had its chance."""
    return next_tick_came and now > sent


def start_for_tick(schedule: str, workflow: str, template: Any, tick: datetime) -> Any:
    """Start *workflow* for *tick* of *schedule* (the state rendered from *template*
    with ``{tick}``, ``{date}`` and ``{schedule}``), at most once per tick: the
    ``StartedRun`` (``created`` False when the tick had its run already)."""
    stamp = tick.isoformat()
    state = render_state(template, tick=stamp, date=tick.date().isoformat(), schedule=schedule)
    return workflow_registry.get(workflow).start(
        state, idempotency_key=f"schedule:{schedule}:{stamp}"
    )
