"""Scheduled starts on Temporal: a Temporal Schedule that starts a flowwarden run at
every tick.

``schedule_workflow(schedule_id, workflow, every=timedelta(hours=1), state=...)``
creates (or updates) the Temporal Schedule *schedule_id*. At each tick it starts a
``flowwarden.ScheduledStart`` workflow on the worker's task queue, whose one activity
starts the run with the idempotency key ``schedule:<schedule_id>:<tick>`` (the tick:
the latest multiple of the period since the epoch, UTC), the state rendered from its
template (``{tick}``, ``{date}``, ``{schedule}``). The run then runs as any other.

Missed ticks: Temporal catches up the actions of a window (``catchup_window``,
default one period, at least 10 s) once the server or the workers are back, and each of them starts
the run of the *current* tick: the backlog starts one run; ticks older than the
window are skipped. The schedule is Temporal's (see it with ``temporal schedule
list`` or the Temporal UI); ``delete_schedule`` removes it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from ...workflows.operations.schedule_ticks import (
    TEMPORAL,
    ListedSchedule,
    ScheduleError,
    check_state_template,
    interval_text,
)
from .config import TemporalConfig
from .connection import TemporalConnection
from .messages import SCHEDULED_START_TYPE, ScheduledStart


def schedule_workflow(
    schedule_id: str,
    workflow: str,
    *,
    every: timedelta,
    state: Any = None,
    catchup_window: timedelta | None = None,
    config: TemporalConfig | None = None,
) -> None:
    """Create or update Temporal Schedule *schedule_id* starting *workflow* every
    *every* (at least a second; see the module)."""
    from temporalio.client import (
        Schedule,
        ScheduleActionStartWorkflow,
        ScheduleAlreadyRunningError,
        ScheduleIntervalSpec,
        SchedulePolicy,
        ScheduleSpec,
        ScheduleUpdate,
    )

    if every < timedelta(seconds=1):
        raise ScheduleError(f"every must be at least a second, not {every}")
    check_state_template(state)
    config = config or TemporalConfig.from_settings()
    action = ScheduleActionStartWorkflow(
        SCHEDULED_START_TYPE,
        ScheduledStart(schedule_id, workflow, state, every.total_seconds()),
        id=f"flowwarden-schedule-{schedule_id}",
        task_queue=config.task_queue,
    )
    schedule = Schedule(
        action=action,
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)]),
        policy=SchedulePolicy(catchup_window=catchup_window or max(every, timedelta(seconds=10))),
    )

    async def create(client: Any) -> None:
        try:
            await client.create_schedule(schedule_id, schedule)
        except ScheduleAlreadyRunningError:
            handle = client.get_schedule_handle(schedule_id)
            await handle.update(lambda _: ScheduleUpdate(schedule=schedule))

    _call(config, create)


def delete_schedule(schedule_id: str, *, config: TemporalConfig | None = None) -> None:
    """Delete Temporal Schedule *schedule_id* (its runs stay as they are)."""

    async def delete(client: Any) -> None:
        await client.get_schedule_handle(schedule_id).delete()

    _call(config or TemporalConfig.from_settings(), delete)


def listed_schedules(*, config: TemporalConfig | None = None) -> list[ListedSchedule]:
    """The Temporal Schedules that start flowwarden runs (those whose action is a
    ``flowwarden.ScheduledStart``), by id: the workflow, the spec in words, paused or
    not, the latest action's scheduled time and the next one. Errors are the SDK's (a
    server that does not answer: ``RuntimeError`` or ``TimeoutError``)."""

    async def read(client: Any) -> list[ListedSchedule]:
        found = []
        async for listed in await client.list_schedules():
            action = getattr(listed.schedule, "action", None)
            if getattr(action, "workflow", None) != SCHEDULED_START_TYPE:
                continue
            found.append(await _listed(await client.get_schedule_handle(listed.id).describe()))
        return sorted(found, key=lambda schedule: schedule.name)

    return _call(config or TemporalConfig.from_settings(), read)


async def _listed(described: Any) -> ListedSchedule:
    """A described Temporal Schedule as listed: its action's argument (a
    ``ScheduledStart``, decoded) names the workflow."""
    schedule = described.schedule
    arguments = list(getattr(schedule.action, "args", None) or ())
    if arguments and not isinstance(arguments[0], dict | ScheduledStart):
        arguments = await described.data_converter.decode(arguments[:1])
    start = arguments[0] if arguments else {}
    workflow = start.get("workflow") if isinstance(start, dict) else start.workflow
    info = described.info
    return ListedSchedule(
        described.id,
        str(workflow or ""),
        spec_text(schedule.spec),
        not schedule.state.paused,
        TEMPORAL,
        max((action.scheduled_at for action in info.recent_actions), default=None),
        min(info.next_action_times, default=None),
    )


def spec_text(spec: Any) -> str:
    """A ``ScheduleSpec`` in words: ``"every 1h"``, ``"cron 0 2 * * *"``, ``"3
    calendars"``, joined by ``"; "`` (with its time zone when it has one)."""
    parts = [interval_text(interval.every.total_seconds()) for interval in spec.intervals]
    parts += [f"cron {expression}" for expression in spec.cron_expressions]
    if spec.calendars:
        count = len(spec.calendars)
        parts.append(f"{count} calendar{'s' if count > 1 else ''}")
    text = "; ".join(parts) or "—"
    return f"{text} ({spec.time_zone_name})" if spec.time_zone_name else text


def _call(config: TemporalConfig, operation: Any) -> Any:
    connection = TemporalConnection(config)
    try:
        return connection.call(operation)
    finally:
        connection.close()
