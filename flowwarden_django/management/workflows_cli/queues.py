"""``queues``: each workflow queue's limits, the slots in use, the steps waiting for one,
how long the oldest has waited and the recent rate (``workflows.queues.stats``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.management.base import CommandError
from django.utils import timezone

from ...common.durations import parse_duration
from ...common.formatting import NONE_TEXT, age_text, dump_json, format_table
from ...conf import fw_settings
from ...workflows.queues.settings import QueueConfig
from ...workflows.queues.stats import (
    Counts,
    PartitionStats,
    QueueStats,
    queue_stats,
    stale_queues,
)
from ..base import ActionCommand
from .output import COMMAND

QUEUE_HEADERS = (
    "QUEUE",
    "CONCURRENCY",
    "PER WORKER",
    "RATE",
    "OPTIONS",
    "SLOTS IN USE",
    "WAITING",
    "OLDEST WAIT",
    "RECENT STARTS",
)
#: How a partition's line is indented under its queue's.
PARTITION_INDENT = "  · "


class QueueActions(ActionCommand):
    """``queues`` of ``manage.py flowwarden_workflows``."""

    def handle_queues(self, *, database: str | None, json: bool, **options: Any) -> None:
        try:
            found = queue_stats(database)
        except ValueError as exc:
            raise CommandError(f"{exc}. Run `manage.py check` for the fix.") from exc
        now = timezone.now()
        stale_after = _stale_after()
        stale = {queue.name for queue in stale_queues(found, stale_after, now)}
        if json:
            self.stdout.write(
                dump_json([{**queue.as_dict(now), "stale": queue.name in stale} for queue in found])
            )
            return
        if not found:
            self.stdout.write(
                'No workflow queues: FLOWWARDEN["WORKFLOW_QUEUES"] is empty and no run '
                "waits for a slot."
            )
            return
        rows: list[tuple[str, ...]] = []
        for queue in found:
            rows.append(_queue_row(queue, now))
            rows.extend(_partition_row(queue, part, now) for part in queue.partitions)
        self.write_table(format_table(QUEUE_HEADERS, rows))
        for queue in found:
            if not queue.configured:
                self.stdout.write(
                    self.style.WARNING(
                        f"{queue.waiting} run(s) wait for a slot of queue {queue.name!r}, "
                        'which FLOWWARDEN["WORKFLOW_QUEUES"] does not configure: nothing '
                        f"admits them. Configure it again, or `{COMMAND} cancel` them."
                    )
                )
            elif queue.name in stale:
                self.stdout.write(
                    self.style.WARNING(
                        f"Queue {queue.name!r}: its oldest waiting step has waited "
                        f"{_wait_text(queue, now)}, longer than "
                        'FLOWWARDEN["WORKFLOW_QUEUE_STALE_AFTER"] '
                        f"({fw_settings.WORKFLOW_QUEUE_STALE_AFTER}): /flowwarden/health/ "
                        "reports it."
                    )
                )


def _stale_after() -> float:
    try:
        return parse_duration(fw_settings.WORKFLOW_QUEUE_STALE_AFTER)
    except ValueError as exc:
        raise CommandError(
            f'FLOWWARDEN["WORKFLOW_QUEUE_STALE_AFTER"]: {exc}. Run `manage.py check`.'
        ) from exc


def _queue_row(queue: QueueStats, now: datetime) -> tuple[str, ...]:
    config = queue.config
    if config is None:
        limits = (NONE_TEXT, NONE_TEXT, NONE_TEXT, "not configured")
        return (queue.name, *limits, NONE_TEXT, *_waits(queue, now), NONE_TEXT)
    options = ["priority"] if config.priority else []
    options += ["partitioned"] if config.partitioned else []
    options += [f"scope {config.scope}"] if config.holds_runs else []
    limits = (
        _number(config.concurrency),
        _number(config.worker_concurrency),
        str(config.rate) if config.rate else NONE_TEXT,
        ", ".join(options) or NONE_TEXT,
    )
    # A partitioned queue's limits hold per partition: its own line shows the sums.
    per = None if config.partitioned else config
    in_use = _in_use(queue, config.concurrency if per else None, config)
    recent = _recent(queue, config.rate.limit if per and config.rate else None)
    return (queue.name, *limits, in_use, *_waits(queue, now), recent)


def _partition_row(queue: QueueStats, part: PartitionStats, now: datetime) -> tuple[str, ...]:
    config = queue.config
    assert config is not None  # only a configured, partitioned queue lists partitions
    name = f"{PARTITION_INDENT}{part.partition}"
    in_use = _in_use(part, config.concurrency, config)
    recent = _recent(part, config.rate.limit if config.rate else None)
    return (name, "", "", "", "", in_use, *_waits(part, now), recent)


def _number(value: int | None) -> str:
    return NONE_TEXT if value is None else str(value)


def _in_use(counts: Counts, limit: int | None, config: QueueConfig) -> str:
    if config.concurrency is None:
        return NONE_TEXT  # no concurrency slots: only a rate, or a per-process limit
    return f"{counts.slots_in_use}/{limit}" if limit else str(counts.slots_in_use)


def _recent(counts: Counts, limit: int | None) -> str:
    """Starts within the rate's period (``NONE_TEXT``: no rate)."""
    if counts.recent_starts is None:
        return NONE_TEXT
    return f"{counts.recent_starts}/{limit}" if limit else str(counts.recent_starts)


def _waits(counts: Counts, now: datetime) -> tuple[str, str]:
    return str(counts.waiting), _wait_text(counts, now)


def _wait_text(counts: Counts, now: datetime) -> str:
    if counts.oldest_queued_at is None:
        return NONE_TEXT
    return age_text(counts.oldest_queued_at, now).removesuffix(" ago")
