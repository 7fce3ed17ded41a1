"""Prometheus gauges of the workflow queues, read at scrape time from
``workflows.queues.stats.queue_stats()`` (the database every process shares), for
:class:`~flowwarden_django.integrations.prometheus.FlowwardenCollector`.

One series per queue and gauge (label ``queue``): a partitioned queue's partitions are
summed, since a label per partition key (a customer id, say) would grow without
bound. Nothing is read while ``FLOWWARDEN["WORKFLOW_QUEUES"]`` is empty.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, TypeVar

from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric

from ..conf import fw_settings

logger = logging.getLogger("flowwarden_django.prometheus")

T = TypeVar("T")

#: Gauge name -> help; each has the label ``queue``.
QUEUE_GAUGES = {
    "flowwarden_queue_slots_in_use": (
        "Concurrency slots of the queue held now (steps running, or dispatched and "
        "starting), over every partition."
    ),
    "flowwarden_queue_waiting_steps": "Runs whose next step waits for a slot of the queue.",
    "flowwarden_queue_oldest_wait_seconds": (
        "How long the oldest step waiting for a slot of the queue has waited (no sample "
        "when none waits)."
    ),
    "flowwarden_queue_recent_starts": (
        "Step starts within the last period of the queue's rate (no sample without a rate)."
    ),
}
#: 1 when the queues could be read, 0 when not (no sample without queues).
UP = "flowwarden_queue_status_up"


def queue_families() -> dict[str, Any]:
    """Fresh, empty metric families of the queue gauges, by name."""
    families: dict[str, Any] = {
        name: GaugeMetricFamily(name, doc, labels=["queue"]) for name, doc in QUEUE_GAUGES.items()
    }
    families[UP] = GaugeMetricFamily(UP, "1 when the workflow queues could be read.", labels=[])
    return families


def read_or_down(families: dict[str, Any], up: str, what: str, read: Callable[[], T]) -> T | None:
    """*read()*, with the family *up* set to 1; when it raises, *up* is set to 0, a
    warning names *what* and ``None`` is returned (then only *up* is collected)."""
    try:
        found = read()
    except Exception:
        logger.warning("cannot read %s for Prometheus", what, exc_info=True)
        families[up].add_metric([], 0)
        return None
    families[up].add_metric([], 1)
    return found


def collect_queues(now: datetime | None = None) -> Iterator[Metric]:
    """The queue gauges as of *now* (nothing when no queue is configured)."""
    from ..workflows.queues.stats import queue_stats

    if not fw_settings.WORKFLOW_QUEUES:
        return
    now = now or timezone.now()
    families = queue_families()
    found = read_or_down(families, UP, "the workflow queues", queue_stats)
    if found is None:
        yield families[UP]
        return
    for queue in found:
        name = [queue.name]
        families["flowwarden_queue_slots_in_use"].add_metric(name, queue.slots_in_use)
        families["flowwarden_queue_waiting_steps"].add_metric(name, queue.waiting)
        wait = queue.oldest_wait_seconds(now)
        if wait is not None:
            families["flowwarden_queue_oldest_wait_seconds"].add_metric(name, wait)
        if queue.recent_starts is not None:
            families["flowwarden_queue_recent_starts"].add_metric(name, queue.recent_starts)
    yield from families.values()
