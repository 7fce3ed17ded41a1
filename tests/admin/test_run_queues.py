"""The workflow queues in the runs admin, through the Django test client: the filter
by queue, "waiting for a slot" with its queue in the list, and the run page's queue,
partition, priority and wait."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from flowwarden_django.models import WorkflowRun
from flowwarden_django.workflows import Workflow, advance, step, workflow_registry
from flowwarden_django.workflows.backends.memory import InMemorySnapshotStore
from tests.support.queue_rows import held_slot, waiting_run

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = reverse("admin:flowwarden_django_workflowrun_changelist")
QUEUES = {
    "carrier-api": {"concurrency": 2, "priority": True},
    "per-customer": {"concurrency": 1, "partitioned": True},
}


def run_url(cid: str) -> str:
    return reverse("admin:flowwarden_django_workflowrun_change", args=[cid])


def readonly(body: str, field: str) -> str:
    """What the run page shows in read-only field *field*."""
    found = re.search(rf'field-{field}".*?<div class="readonly">(.*?)</div>', body, re.DOTALL)
    assert found, field
    return found.group(1)


def page(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


@step("go")
def go(state: Any) -> Any:
    return advance(state)


@pytest.fixture
def declared() -> Any:
    """Workflow ``adm-shipping`` declares queue ``carrier-api`` (version 1 only)."""
    Workflow.define("adm-shipping", [go], InMemorySnapshotStore(), queue="carrier-api")
    Workflow.define("adm-shipping", [go], InMemorySnapshotStore(), version=2)
    yield
    workflow_registry.unregister("adm-shipping")


def plain_run(cid: str, workflow: str, version: int = 1, **fields: Any) -> WorkflowRun:
    now = timezone.now()
    return WorkflowRun.objects.create(
        coordination_id=cid,
        workflow_name=workflow,
        workflow_version=version,
        status=WorkflowRun.Status.COMPLETED,
        created_at=now,
        updated_at=now,
        **fields,
    )


@override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": QUEUES})
def test_the_list_filters_by_queue_and_shows_waiting_for_a_slot(
    admin_client: Any, declared: Any
) -> None:
    waiting_run("run-waiting", "carrier-api", waited=90, workflow="adm-shipping")
    plain_run("run-declared", "adm-shipping")  # on its workflow's queue, never waited
    plain_run("run-v2", "adm-shipping", version=2)  # version 2 declares no queue
    plain_run("run-started-on", "adm-other", queue="carrier-api")
    plain_run("run-customer", "adm-other", queue="per-customer", queue_partition="c-1")
    plain_run("run-none", "adm-other")
    held_slot("bulk-old", 0)  # a queue whose slots exist, since taken out of the settings

    body = page(admin_client.get(CHANGELIST))
    # The status, as the other waiting statuses: the clock icon, the label, the queue.
    assert 'data-status="waiting_slot"' in body and "Waiting for a slot" in body
    assert (
        '<small>(<span class="flowwarden-token" title="carrier-api">carrier-api</span>)</small>'
        in body
    )
    # The queue filter: configured queues, queues with slots, declared queues.
    assert "By queue" in body
    for name in ("carrier-api", "per-customer", "bulk-old"):
        assert f'href="?queue={name}"' in body, name
    assert 'href="?status__exact=waiting_slot"' in body

    body = page(admin_client.get(CHANGELIST, {"queue": "carrier-api"}))
    shown = {
        cid
        for cid in (
            "run-waiting",
            "run-declared",
            "run-v2",
            "run-started-on",
            "run-customer",
            "run-none",
        )
        if run_url(cid) in body
    }
    assert shown == {"run-waiting", "run-declared", "run-started-on"}
    body = page(admin_client.get(CHANGELIST, {"queue": "per-customer"}))
    assert run_url("run-customer") in body and run_url("run-waiting") not in body
    body = page(admin_client.get(CHANGELIST, {"queue": "nope"}))
    assert run_url("run-waiting") not in body and run_url("run-none") not in body


@override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": QUEUES})
def test_the_run_page_shows_the_queue_partition_priority_and_wait(
    admin_client: Any, declared: Any
) -> None:
    waiting_run("run-waiting", "per-customer", partition="cust-7", priority=3, waited=125)
    body = page(admin_client.get(run_url("run-waiting")))
    assert 'class="fieldset-heading">Queue</h2>' in body
    assert readonly(body, "queue_text") == "<code>per-customer</code>"
    assert readonly(body, "queue_partition_text") == "<code>cust-7</code>"
    assert readonly(body, "queue_priority_text") == "3"
    queued_at = WorkflowRun.objects.get(pk="run-waiting").queued_at
    since = readonly(body, "queued_at_text")
    assert since.startswith(queued_at.isoformat()) and "2\xa0minutes ago" in since
    assert "<label>Waiting for a slot since:</label>" in body


@override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": QUEUES})
def test_a_run_on_its_workflow_s_queue_says_so(admin_client: Any, declared: Any) -> None:
    plain_run("run-declared", "adm-shipping")
    body = page(admin_client.get(run_url("run-declared")))
    assert "<code>carrier-api</code> (its workflow&#x27;s)" in body
    # Not waiting: no "since".
    assert readonly(body, "queued_at_text") == "—"


@override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": QUEUES})
def test_a_run_on_no_queue_has_no_queue_fields(admin_client: Any, declared: Any) -> None:
    plain_run("run-none", "adm-other")
    plain_run("run-v2", "adm-shipping", version=2)
    for cid in ("run-none", "run-v2"):
        body = page(admin_client.get(run_url(cid)))
        assert "Waiting for a slot since" not in body and "Queue partition" not in body


@override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": {}})
def test_a_queue_no_longer_configured_is_named_so(admin_client: Any) -> None:
    waiting_run("run-stuck", "retired", waited=900)
    body = page(admin_client.get(run_url("run-stuck")))
    assert "<code>retired</code> (not configured: nothing admits its steps)" in body
    assert 'href="?queue=retired"' not in page(admin_client.get(CHANGELIST))  # no slot rows


@override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": "broken"})
def test_a_broken_setting_does_not_break_the_list(admin_client: Any) -> None:
    waiting_run("run-waiting", "carrier-api")
    body = page(admin_client.get(CHANGELIST))
    assert run_url("run-waiting") in body
    assert "<code>carrier-api</code>" in page(admin_client.get(run_url("run-waiting")))


def test_a_hostile_queue_parameter_is_refused_without_an_error(admin_client: Any) -> None:
    response = admin_client.get(CHANGELIST, {"queue": "a\x00b"})
    assert response.status_code == 302 and "e=1" in response["Location"]
