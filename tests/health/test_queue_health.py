"""``/flowwarden/health/`` and the workflow queues: a queue whose oldest waiting step
waits longer than ``WORKFLOW_QUEUE_STALE_AFTER`` makes the report ``degraded`` (the
status code stays the streams'); anonymous callers get counts, never queue names."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import OperationalError
from django.test import override_settings

from flowwarden_django.workflows.queues import health
from tests.support.queue_rows import held_slot, waiting_run

pytestmark = pytest.mark.django_db

HEALTH = "/flowwarden/health/"
QUEUES = {
    "carrier-api": {"concurrency": 2},
    "per-customer": {"concurrency": 1, "partitioned": True},
}
SETTINGS = {"WORKFLOW_QUEUES": QUEUES, "WORKFLOW_QUEUE_STALE_AFTER": "2m"}


def backlog() -> None:
    held_slot("carrier-api", 0)
    held_slot("carrier-api", 1)
    waiting_run("c-1", "carrier-api", waited=600)
    waiting_run("c-2", "carrier-api", waited=5)
    waiting_run("p-1", "per-customer", partition="cust-1", waited=30)


def staff_client(client: Any) -> Any:
    client.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    return client


def test_without_queues_the_report_is_unchanged(client: Any) -> None:
    with override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": {}}):
        waiting_run("c-1", "carrier-api", waited=600)
        report = client.get(HEALTH).json()
    assert "queues" not in report and "degraded" not in report


@override_settings(FLOWWARDEN=SETTINGS)
def test_a_stale_queue_degrades_the_report_and_anonymous_callers_get_counts(client: Any) -> None:
    backlog()
    response = client.get(HEALTH)
    assert response.status_code == 200  # no stream is down: a backlog is no outage
    report = response.json()
    assert report["healthy"] is True and report["degraded"] is True
    queues = report["queues"]
    assert queues["stale"] == 1 and queues["waiting"] == 3
    assert queues["stale_after_seconds"] == 120.0
    assert 600 <= queues["oldest_wait_seconds"] < 700
    assert "by_queue" not in queues
    body = response.content.decode()
    assert "carrier-api" not in body and "per-customer" not in body and "cust-1" not in body


@override_settings(FLOWWARDEN=SETTINGS)
def test_callers_with_details_get_each_queue(client: Any) -> None:
    backlog()
    report = staff_client(client).get(HEALTH).json()
    by_queue = report["queues"]["by_queue"]
    assert sorted(by_queue) == ["carrier-api", "per-customer"]
    carrier = by_queue["carrier-api"]
    assert (carrier["slots_in_use"], carrier["waiting"], carrier["stale"]) == (2, 2, True)
    assert carrier["configured"] is True and carrier["oldest_wait_seconds"] >= 600
    assert by_queue["per-customer"]["stale"] is False
    # "none": nobody gets the details over HTTP, staff neither.
    with override_settings(FLOWWARDEN={**SETTINGS, "HEALTH_DETAILS": "none"}):
        assert "by_queue" not in client.get(HEALTH).json()["queues"]


@override_settings(FLOWWARDEN=SETTINGS)
def test_a_queue_no_longer_configured_counts(client: Any) -> None:
    waiting_run("r-1", "retired", waited=900)
    report = staff_client(client).get(HEALTH).json()
    assert report["degraded"] is True
    assert report["queues"]["by_queue"]["retired"]["configured"] is False


@override_settings(FLOWWARDEN=SETTINGS)
def test_waiting_under_the_threshold_is_not_degraded(client: Any) -> None:
    waiting_run("c-1", "carrier-api", waited=60)
    report = client.get(HEALTH).json()
    assert report["degraded"] is False
    assert report["queues"]["stale"] == 0 and report["queues"]["waiting"] == 1
    # An idle queue has no oldest wait.
    with override_settings(FLOWWARDEN={**SETTINGS, "WORKFLOW_QUEUE_STALE_AFTER": "30s"}):
        assert client.get(HEALTH).json()["degraded"] is True


@override_settings(FLOWWARDEN=SETTINGS)
def test_queues_that_cannot_be_read(client: Any, monkeypatch: Any) -> None:
    def down(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError('could not connect to server "db-9.internal.example" port 5432')

    monkeypatch.setattr(health, "queue_stats", down)
    report = client.get(HEALTH).json()
    assert report["queues"] == {"error": "database unavailable (OperationalError)"}
    assert report["degraded"] is True
    detailed = staff_client(client).get(HEALTH).json()
    assert "db-9.internal.example" in detailed["queues"]["error"]


def test_a_bad_threshold_falls_back_to_the_default() -> None:
    with override_settings(FLOWWARDEN={"WORKFLOW_QUEUE_STALE_AFTER": "soon"}):
        assert health.stale_after() == 300.0
    with override_settings(FLOWWARDEN={"WORKFLOW_QUEUE_STALE_AFTER": 0}):
        assert health.stale_after() == 300.0
    with override_settings(FLOWWARDEN={"WORKFLOW_QUEUE_STALE_AFTER": "90s"}):
        assert health.stale_after() == 90.0
