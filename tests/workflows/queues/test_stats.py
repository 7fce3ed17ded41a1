"""``queue_stats``: what each queue holds and waits for, as the command, the admin,
the metrics and the health report read it (rows written straight to the tables)."""

from __future__ import annotations

import pytest
from django.test import override_settings
from django.utils import timezone

from flowwarden_django.models import WorkflowQueueSlot
from flowwarden_django.workflows.queues.stats import queue_stats, stale_queues
from tests.support.lanes import on_lane
from tests.support.queue_rows import held_slot, waiting_run

QUEUES = {
    "carrier": {"concurrency": 3, "rate": "10/m", "priority": True},
    "per-customer": {"concurrency": 1, "partitioned": True},
    "idle": {"worker_concurrency": 2},
}


def by_name(stats):
    return {queue.name: queue for queue in stats}


@pytest.mark.django_db
@override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": QUEUES})
def test_every_queue_with_its_slots_in_use_waiting_runs_and_recent_starts() -> None:
    held_slot("carrier", 0)
    held_slot("carrier", 1)
    held_slot("carrier", 2, for_seconds=-5)  # its lease ran out: free
    for n in range(4):
        held_slot("carrier", n, kind="rate")
    waiting_run("w-1", "carrier", waited=30)
    waiting_run("w-2", "carrier", waited=90, priority=5)
    held_slot("per-customer", 0, partition="cust-1")
    waiting_run("w-3", "per-customer", partition="cust-1", waited=10)
    waiting_run("w-4", "per-customer", partition="cust-2", waited=20)
    waiting_run("w-5", "removed", waited=400)  # a queue taken out of the settings
    held_slot("gone", 0)  # nothing waits in it: not listed

    stats = queue_stats("default")
    assert [q.name for q in stats] == ["carrier", "idle", "per-customer", "removed"]
    found = by_name(stats)
    carrier = found["carrier"]
    assert (carrier.slots_in_use, carrier.waiting, carrier.recent_starts) == (2, 2, 4)
    assert 89 <= carrier.oldest_wait_seconds() < 120 and carrier.partitions == []
    assert carrier.limits() == {
        "concurrency": 3,
        "worker_concurrency": None,
        "rate": "10/m",
        "priority": True,
        "partitioned": False,
        "scope": "steps",
    }
    idle = found["idle"]
    assert (idle.slots_in_use, idle.waiting, idle.recent_starts) == (0, 0, None)
    assert idle.oldest_wait_seconds() is None
    customers = found["per-customer"]
    assert (customers.slots_in_use, customers.waiting) == (1, 2)
    assert [(p.partition, p.slots_in_use, p.waiting) for p in customers.partitions] == [
        ("cust-1", 1, 1),
        ("cust-2", 0, 1),
    ]
    assert 19 <= customers.oldest_wait_seconds() < 60
    removed = found["removed"]
    assert not removed.configured and removed.waiting == 1 and removed.limits() == {}

    as_json = carrier.as_dict()
    assert as_json["queue"] == "carrier" and as_json["configured"] is True
    assert as_json["rate"] == "10/m" and as_json["slots_in_use"] == 2
    assert as_json["oldest_queued_at"].startswith(str(timezone.now().year))
    assert [q.name for q in stale_queues(stats, 300)] == ["removed"]
    assert [q.name for q in stale_queues(stats, 60)] == ["carrier", "removed"]


@pytest.mark.django_db
@override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": {}})
def test_nothing_configured_and_nothing_waiting_is_an_empty_list() -> None:
    held_slot("gone", 0)
    assert queue_stats("default") == []


@on_lane("postgres", databases=["postgres"])
@override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": QUEUES})
def test_held_slots_are_judged_by_the_database_clock_on_postgresql() -> None:
    held_slot("carrier", 0, using="postgres")
    held_slot("carrier", 1, for_seconds=-1, using="postgres")
    held_slot("carrier", 0, kind="rate", using="postgres")
    waiting_run("pg-1", "carrier", waited=5, using="postgres")
    carrier = by_name(queue_stats("postgres"))["carrier"]
    assert (carrier.slots_in_use, carrier.waiting, carrier.recent_starts) == (1, 1, 1)
    assert WorkflowQueueSlot.objects.using("postgres").count() == 3
