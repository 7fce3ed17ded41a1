"""What a scheduled start needs whatever runs the schedule (django-celery-beat or a
Temporal Schedule): the state template and the idempotency key of a tick.

A scheduled run's idempotency key is ``schedule:<schedule>:<tick>`` (the tick in ISO
8601), so a tick starts at most one run however often its start is delivered. The
tick is the schedule's latest due time at or before the moment the start was *sent*
(beat's send, Temporal's scheduled time), unless the start runs after the schedule
ticked again: then it is late, and starts the run of the current tick.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ..definition.registry import workflow_registry


class ScheduleError(ValueError):
    """A schedule cannot start a run: unknown, a schedule whose ticks cannot be
    placed (a solar or clocked one), or a state template that does not format."""


def render_state(template: Any, **values: str) -> Any:
    """*template* with every string (at any depth) formatted with *values* (``{{``
    for a brace)."""
    if isinstance(template, str):
        try:
            return template.format(**values)
        except (KeyError, IndexError, ValueError) as exc:
            raise ScheduleError(f"state template {template!r}: {exc}") from exc
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
