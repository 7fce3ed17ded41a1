"""The workflow runs' Prometheus metrics through ``/flowwarden/metrics/``: runs by
workflow and status and the oldest wait, read at scrape time, and the step-duration
histogram fed by the steps this process runs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

pytest.importorskip("prometheus_client")

from flowwarden_django.integrations.prometheus import FlowwardenCollector
from flowwarden_django.models import WorkflowRun
from flowwarden_django.workflows import Workflow, advance, done, step
from flowwarden_django.workflows.backends.memory import InMemorySnapshotStore

pytestmark = pytest.mark.django_db

METRICS = "/flowwarden/metrics/"


def run_row(cid: str, workflow: str, status: str, waited: float) -> None:
    at = timezone.now() - timedelta(seconds=waited)
    WorkflowRun.objects.create(
        coordination_id=cid,
        workflow_name=workflow,
        status=status,
        last_step="one",
        created_at=at,
        updated_at=at,
    )


def samples(client: Any, name: str, *labels: str) -> dict[tuple[str, ...], float]:
    """The samples of *name* on the metrics page, by the values of *labels*."""
    response = client.get(METRICS)
    assert response.status_code == 200
    found = {}
    for line in response.content.decode().splitlines():
        if line.startswith(name + "{"):
            pairs = line.split("{", 1)[1].rsplit("}", 1)[0].split(",")
            values = dict(pair.split("=", 1) for pair in pairs)
            found[tuple(values[label].strip('"') for label in labels)] = float(line.split()[-1])
    return found


def test_runs_by_workflow_and_status_and_the_oldest_wait(client: Any) -> None:
    run_row("s-1", "orders", "sleeping", 10)
    run_row("s-2", "orders", "sleeping", 100)
    run_row("a-1", "orders", "waiting", 40)
    run_row("m-1", "refunds", "waiting_message", 5)
    run_row("c-1", "refunds", "waiting_children", 7)
    run_row("r-1", "refunds", "running", 1)
    run_row("f-1", "refunds", "failed", 1)
    run_row("d-1", "refunds", "completed", 1)
    run_row("x-1", "refunds", "cancelled", 1)
    runs = samples(client, "flowwarden_workflow_runs", "workflow", "status")
    assert runs == {
        ("orders", "sleeping"): 2,
        ("orders", "waiting"): 1,
        ("refunds", "waiting_message"): 1,
        ("refunds", "waiting_children"): 1,
        ("refunds", "running"): 1,
        ("refunds", "failed"): 1,
    }
    oldest = samples(client, "flowwarden_workflow_oldest_wait_seconds", "workflow", "status")
    # Only paused statuses: not running, not failed.
    assert set(oldest) == {
        ("orders", "sleeping"),
        ("orders", "waiting"),
        ("refunds", "waiting_message"),
        ("refunds", "waiting_children"),
    }
    assert 100 <= oldest[("orders", "sleeping")] < 200
    assert 40 <= oldest[("orders", "waiting")] < 140


def test_runs_that_cannot_be_read_say_so(client: Any, monkeypatch: Any) -> None:
    from django.db.models import QuerySet

    def broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("db-1.internal.example:5432 refused")

    monkeypatch.setattr(QuerySet, "annotate", broken)
    body = client.get(METRICS).content.decode()
    assert "flowwarden_workflow_status_up 0.0" in body.splitlines()
    assert "internal.example" not in body


def test_step_durations_by_workflow_step_and_outcome(client: Any) -> None:
    tries = {"n": 0}

    @step(max_retries=1, retry_delay=0)
    def flaky(state: dict[str, Any], ctx: Any) -> Any:
        tries["n"] += 1
        if tries["n"] == 1:
            raise LookupError("first try")
        return advance(state)

    @step
    def finish(state: dict[str, Any], ctx: Any) -> Any:
        return done(state)

    Workflow("metered", "metered-1", [flaky, finish], InMemorySnapshotStore()).run({})
    counts = samples(
        client, "flowwarden_workflow_step_duration_seconds_count", "workflow", "step", "outcome"
    )
    assert counts[("metered", "flaky", "LookupError")] >= 1
    assert counts[("metered", "flaky", "ok")] >= 1
    assert counts[("metered", "finish", "ok")] >= 1


def test_described_without_reading() -> None:
    names = {family.name for family in FlowwardenCollector().describe()}
    assert {"flowwarden_workflow_runs", "flowwarden_workflow_oldest_wait_seconds"} <= names
    assert "flowwarden_workflow_step_duration_seconds" in names
    worker = {family.name for family in FlowwardenCollector(include_status=False).describe()}
    assert "flowwarden_workflow_runs" not in worker
    assert "flowwarden_workflow_step_duration_seconds" in worker
