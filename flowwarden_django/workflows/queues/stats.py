"""What each workflow queue holds and waits for, read from the database: for
``manage.py flowwarden_workflows queues``, the admin, the Prometheus gauges and
``/flowwarden/health/``.

Two grouped queries per database, whatever the number of runs: the slots held now
(``WorkflowQueueSlot`` rows whose lease runs on the database's clock) and the runs in
``waiting_slot`` (through the ``fw_run_queued`` index), each by queue and partition.

* *slots in use*: concurrency slots held now (a step runs, or a dispatched run is
  about to start);
* *waiting*: runs whose next step waits for a slot, and since when the oldest waits;
* *recent starts*: rate slots spent within the last period of the queue's rate (a
  step started, or a dispatched run paid for its start): ``None`` without a rate.

Every configured queue is listed (idle ones too), and a queue that is no longer
configured while runs still wait in it (``configured`` false: nothing admits them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.db.models import Count, Min
from django.db.models.functions import Now
from django.utils import timezone

from ...common.app_models import models
from ..runs.status import RunStatus
from . import slots
from .settings import QueueConfig, queue_configs


@dataclasses.dataclass(kw_only=True)
class Counts:
    """What a queue, or one partition of it, holds and waits for."""

    slots_in_use: int = 0
    waiting: int = 0
    oldest_queued_at: datetime | None = None
    #: Rate slots spent within the last period; ``None``: the queue has no rate.
    recent_starts: int | None = None

    def oldest_wait_seconds(self, now: datetime | None = None) -> float | None:
        """How long the oldest waiting run has waited (``None``: none waits)."""
        if self.oldest_queued_at is None:
            return None
        return max(((now or timezone.now()) - self.oldest_queued_at).total_seconds(), 0.0)

    def add(self, other: Counts) -> None:
        """Count *other* in too (a partition, or the same one in another database)."""
        self.slots_in_use += other.slots_in_use
        self.waiting += other.waiting
        if other.recent_starts is not None:
            self.recent_starts = (self.recent_starts or 0) + other.recent_starts
        oldest = other.oldest_queued_at
        if oldest is not None and (self.oldest_queued_at is None or oldest < self.oldest_queued_at):
            self.oldest_queued_at = oldest

    def counts_dict(self, now: datetime | None = None) -> dict[str, Any]:
        """The counts as JSON, with the oldest wait's start and age."""
        oldest = self.oldest_queued_at
        return {
            "slots_in_use": self.slots_in_use,
            "waiting": self.waiting,
            "oldest_queued_at": None if oldest is None else oldest.isoformat(),
            "oldest_wait_seconds": self.oldest_wait_seconds(now),
            "recent_starts": self.recent_starts,
        }


@dataclasses.dataclass(kw_only=True)
class PartitionStats(Counts):
    """One partition of a partitioned queue (a ``start(partition_key=...)``)."""

    partition: str

    def as_dict(self, now: datetime | None = None) -> dict[str, Any]:
        return {"partition": self.partition, **self.counts_dict(now)}


@dataclasses.dataclass(kw_only=True)
class QueueStats(Counts):
    """One queue: its limits (``config``; ``None`` when it is no longer configured),
    its totals over every partition and, on a partitioned queue, each partition with
    activity (a slot held or a run waiting)."""

    name: str
    config: QueueConfig | None = None
    partitions: list[PartitionStats] = dataclasses.field(default_factory=list)

    @property
    def configured(self) -> bool:
        return self.config is not None

    def limits(self) -> dict[str, Any]:
        """The queue's options as configured (``{}`` when it is not)."""
        config = self.config
        if config is None:
            return {}
        return {
            "concurrency": config.concurrency,
            "worker_concurrency": config.worker_concurrency,
            "rate": None if config.rate is None else str(config.rate),
            "priority": config.priority,
            "partitioned": config.partitioned,
            "scope": config.scope,
        }

    def as_dict(self, now: datetime | None = None) -> dict[str, Any]:
        return {
            "queue": self.name,
            "configured": self.configured,
            **self.limits(),
            **self.counts_dict(now),
            "partitions": [p.as_dict(now) for p in self.partitions],
        }


def queue_stats(using: str | Sequence[str] | None = None) -> list[QueueStats]:
    """Every configured queue, then each unconfigured one runs wait in, by name, with
    the counts of database *using* (several: summed; ``None``: every database a
    workflow this process defines keeps its runs in). ``ValueError`` when
    ``FLOWWARDEN["WORKFLOW_QUEUES"]`` is wrong (``manage.py check`` says how)."""
    configs = queue_configs()
    if using is None:
        from ..definition.databases import workflow_databases

        databases: Sequence[str] = workflow_databases()
    elif isinstance(using, str):
        databases = [using]
    else:
        databases = using
    parts: dict[tuple[str, str], PartitionStats] = {}
    for db in databases:
        _read_slots(db, parts)
        _read_waiting(db, parts)
    return _by_queue(configs, parts)


def stale_queues(
    stats: Iterable[QueueStats], stale_after: float, now: datetime | None = None
) -> list[QueueStats]:
    """The queues whose oldest waiting run has waited longer than *stale_after* seconds."""
    now = now or timezone.now()
    return [
        queue
        for queue in stats
        if (wait := queue.oldest_wait_seconds(now)) is not None and wait > stale_after
    ]


def _part(parts: dict[tuple[str, str], PartitionStats], queue: str, partition: str) -> Any:
    return parts.setdefault((queue, partition), PartitionStats(partition=partition))


def _read_slots(db: str, parts: dict[tuple[str, str], PartitionStats]) -> None:
    held = (
        models.WorkflowQueueSlot.objects.using(db)
        .filter(held_until__gt=Now())
        .values_list("queue", "partition", "kind")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for queue, partition, kind, count in held:
        part = _part(parts, queue, partition)
        if kind == slots.CONCURRENCY:
            part.slots_in_use += count
        elif kind == slots.RATE:
            part.recent_starts = (part.recent_starts or 0) + count


def _read_waiting(db: str, parts: dict[tuple[str, str], PartitionStats]) -> None:
    waiting = (
        models.WorkflowRun.objects.using(db)
        .filter(status=RunStatus.WAITING_SLOT)
        .values_list("queue", "queue_partition")
        .annotate(n=Count("pk"), oldest=Min("queued_at"))
        .order_by()
    )
    for queue, partition, count, oldest in waiting:
        _part(parts, queue, partition).add(Counts(waiting=count, oldest_queued_at=oldest))


def _by_queue(
    configs: dict[str, QueueConfig], parts: dict[tuple[str, str], PartitionStats]
) -> list[QueueStats]:
    found = {name: QueueStats(name=name, config=config) for name, config in configs.items()}
    for (queue, _partition), part in sorted(parts.items()):
        if queue not in found:
            if not part.waiting:
                continue  # slots of a queue gone from the settings that nothing waits for
            found[queue] = QueueStats(name=queue)
        stats = found[queue]
        rated = stats.config is not None and stats.config.rate is not None
        if stats.config is not None:
            # Rate rows of a rate since taken out of the settings are no rate of the queue.
            part.recent_starts = (part.recent_starts or 0) if rated else None
        if stats.config is not None and stats.config.partitioned:
            stats.partitions.append(part)
        stats.add(part)
    for stats in found.values():
        if stats.config is not None and stats.config.rate is not None:
            stats.recent_starts = stats.recent_starts or 0
    return sorted(found.values(), key=lambda s: (not s.configured, s.name))
