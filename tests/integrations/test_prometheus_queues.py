"""The workflow queues' Prometheus gauges, through ``/flowwarden/metrics/``: one series
per queue (partitions summed), read at scrape time; nothing read without queues."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

pytest.importorskip("prometheus_client")

from flowwarden_django.integrations import prometheus_queues
from flowwarden_django.integrations.prometheus import FlowwardenCollector
from tests.support.queue_rows import held_slot, waiting_run

pytestmark = pytest.mark.django_db

METRICS = "/flowwarden/metrics/"
QUEUES = {
    "carrier-api": {"concurrency": 5, "rate": "100/m"},
    "per-customer": {"concurrency": 1, "partitioned": True},
    "idle": {"concurrency": 2},
}


def metric_lines(response: Any) -> set[str]:
    assert response.status_code == 200
    return set(response.content.decode().splitlines())


@override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": QUEUES})
def test_slots_in_use_and_waiting_steps_per_queue(client: Any) -> None:
    held_slot("carrier-api", 0)
    held_slot("carrier-api", 1)
    held_slot("carrier-api", 2, for_seconds=-1)
    held_slot("carrier-api", 0, kind="rate")
    waiting_run("c-1", "carrier-api", waited=30)
    held_slot("per-customer", 0, partition="cust-1")
    held_slot("per-customer", 0, partition="cust-2")
    waiting_run("p-1", "per-customer", partition="cust-1")
    waiting_run("p-2", "per-customer", partition="cust-3")
    waiting_run("p-3", "per-customer", partition="cust-3")
    lines = metric_lines(client.get(METRICS))
    for expected in (
        'flowwarden_queue_slots_in_use{queue="carrier-api"} 2.0',
        'flowwarden_queue_waiting_steps{queue="carrier-api"} 1.0',
        'flowwarden_queue_recent_starts{queue="carrier-api"} 1.0',
        'flowwarden_queue_slots_in_use{queue="per-customer"} 2.0',
        'flowwarden_queue_waiting_steps{queue="per-customer"} 3.0',
        'flowwarden_queue_slots_in_use{queue="idle"} 0.0',
        'flowwarden_queue_waiting_steps{queue="idle"} 0.0',
        "flowwarden_queue_status_up 1.0",
    ):
        assert expected in lines, expected
    oldest = {
        line.split('"')[1]: float(line.split()[-1])
        for line in lines
        if line.startswith("flowwarden_queue_oldest_wait_seconds{")
    }
    # Only where a step waits.
    assert sorted(oldest) == ["carrier-api", "per-customer"]
    assert 30 <= oldest["carrier-api"] < 120 and 1 <= oldest["per-customer"] < 30
    body = "\n".join(lines)
    # No partition label (a key per customer would grow without bound); no rate: no sample.
    assert "cust-" not in body and "partition=" not in body
    assert 'flowwarden_queue_recent_starts{queue="idle"}' not in body


@override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": {}})
def test_without_queues_nothing_is_read(client: Any, django_assert_num_queries: Any) -> None:
    with django_assert_num_queries(0):
        assert list(prometheus_queues.collect_queues()) == []
    body = client.get(METRICS).content.decode()
    assert "flowwarden_queue_status_up " not in body
    assert "flowwarden_queue_slots_in_use{" not in body


@override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": QUEUES})
def test_queues_that_cannot_be_read_say_so(client: Any, monkeypatch: Any) -> None:
    from flowwarden_django.workflows.queues import stats

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("db-1.internal.example:5432 refused")

    monkeypatch.setattr(stats, "queue_stats", broken)
    body = client.get(METRICS).content.decode()
    assert "flowwarden_queue_status_up 0.0" in body.splitlines()
    assert "internal.example" not in body


def test_described_without_reading_and_left_out_of_a_worker_s_collector() -> None:
    names = {family.name for family in FlowwardenCollector().describe()}
    assert {"flowwarden_queue_slots_in_use", "flowwarden_queue_waiting_steps"} <= names
    worker = {family.name for family in FlowwardenCollector(include_status=False).describe()}
    assert not any(name.startswith("flowwarden_queue") for name in worker)
