"""Declaring queues: the setting's values, and what ``start`` accepts (a bad queue,
priority or key is refused before anything is written)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from flowwarden_django.models import WorkflowRun
from flowwarden_django.workflows import QueueConfig, UnknownQueueError, Workflow, workflow_registry
from flowwarden_django.workflows.queues.settings import build_queue, parse_rate, queue_config
from tests.support import queue_workflows

QUEUES = {
    "carrier-api": {"concurrency": 5, "worker_concurrency": 2, "rate": "100/m", "priority": True},
    "per-customer": {"concurrency": 1, "partitioned": True},
}


@pytest.mark.parametrize(
    ("text", "limit", "period"),
    [("20/s", 20, 1), ("100/m", 100, 60), ("5/h", 5, 3600), ("1/d", 1, 86400), ("10/30s", 10, 30)],
)
def test_rates_read_as_a_count_per_period(text: str, limit: int, period: float) -> None:
    rate = parse_rate(text)
    assert (rate.limit, rate.period, str(rate)) == (limit, period, text)


@pytest.mark.parametrize("text", ["20", "0/s", "20/fortnight", "x/s", 20, None, "20/0s"])
def test_a_bad_rate_says_the_form(text: Any) -> None:
    with pytest.raises(ValueError, match="invalid rate"):
        parse_rate(text)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "sets no limit"),
        ({"concurrency": 0}, "concurrency must be a whole number"),
        ({"concurrency": True}, "concurrency must be a whole number"),
        ({"concurency": 3}, "unknown option"),
        ({"concurrency": 1, "priority": "yes"}, "priority must be True or False"),
        ({"concurrency": 1, "scope": "workflows"}, "scope must be"),
        ({"rate": "5/s", "scope": "runs"}, "needs concurrency"),
        ({"rate": "often"}, "invalid rate"),
        ("5", "must be a dict"),
    ],
)
def test_a_bad_queue_is_refused_with_what_is_wrong(options: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_queue("q", options)


def test_the_issue_s_example_reads_as_its_limits() -> None:
    with override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": QUEUES}):
        carrier = queue_config("carrier-api")
        assert carrier == QueueConfig(
            "carrier-api", 5, 2, parse_rate("100/m"), priority=True, partitioned=False
        )
        assert queue_config("per-customer").partition_of("acme") == "acme"
        assert carrier.partition_of("acme") == ""
        with pytest.raises(UnknownQueueError, match="carrier-api, per-customer"):
            queue_config("carrier")


@pytest.fixture
def queued() -> Any:
    definition = queue_workflows.define()
    yield definition
    workflow_registry.unregister(queue_workflows.NAME)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("placing", "error", "message"),
    [
        ({"queue": "nowhere"}, UnknownQueueError, "no workflow queue 'nowhere'"),
        ({"queue": "per-customer", "priority": 1}, ValueError, "does not order by priority"),
        ({"queue": "carrier-api", "partition_key": "x"}, ValueError, "is not partitioned"),
        ({"queue": "carrier-api", "priority": -1}, ValueError, "priority must be"),
        ({"priority": 1}, ValueError, "need a queue"),
        ({"queue": ""}, ValueError, "non-blank"),
    ],
)
def test_start_refuses_what_the_queue_does_not_take_and_writes_nothing(
    queued: Any, placing: dict[str, Any], error: type[Exception], message: str
) -> None:
    queues = override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": QUEUES})
    with queues, pytest.raises(error, match=message):
        queued.start({"ms": 0}, **placing)
    assert not WorkflowRun.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_declared_queue_applies_to_every_run_and_a_start_may_name_another() -> None:
    definition = Workflow.define("declared", [queue_workflows.one], queue="carrier-api")
    try:
        assert definition.workflow("x").queue == "carrier-api"
        with override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": QUEUES}):
            started = Workflow.start("declared", {"ms": 0, "log": "/dev/null"}, priority=3)
            run = WorkflowRun.objects.get(pk=started.coordination_id)
            assert (run.status, run.queue_priority) == ("completed", 3)
            other = definition.start(
                {"ms": 0, "log": "/dev/null"}, queue="per-customer", partition_key="acme"
            )
            run = WorkflowRun.objects.get(pk=other.coordination_id)
            assert (run.queue, run.queue_partition) == ("per-customer", "acme")
    finally:
        workflow_registry.unregister("declared")
    with pytest.raises(ValueError, match="non-blank"):
        Workflow.define("bad", [queue_workflows.one], queue=" ", register=False)
