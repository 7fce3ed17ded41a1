"""Messages and events in the admin: the run's page lists the run's messages (topic,
sender, when, delivered or pending, idempotency key, payload) and the values it
published, and links to the read-only lists of both, which filter by run and
delivery; who may view runs may read them, nobody adds, edits or deletes them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.test import Client
from django.urls import reverse

from flowwarden_django.admin.messages import WorkflowEventAdmin, WorkflowMessageAdmin
from flowwarden_django.admin.run_mailbox import PAGE_ROWS
from flowwarden_django.models import WorkflowEvent, WorkflowMessage, WorkflowRun
from flowwarden_django.workflows import (
    RunStatus,
    Workflow,
    WorkflowDefinition,
    send_message,
    workflow_registry,
)
from tests.admin.test_runs import page, run_url, staff
from tests.support.payments_workflow import define_payments

pytestmark = pytest.mark.django_db(transaction=True)

MESSAGES = reverse("admin:flowwarden_django_workflowmessage_changelist")
EVENTS = reverse("admin:flowwarden_django_workflowevent_changelist")


@pytest.fixture
def payments() -> Iterator[WorkflowDefinition]:
    definition = define_payments("admin-payments")
    yield definition
    workflow_registry.unregister("admin-payments")


def logged_in(*codenames: str, name: str = "viewer") -> Client:
    client = Client()
    client.force_login(staff(name, *codenames))
    return client


def paid_run(payments: WorkflowDefinition, cid: str = "order:31.v2") -> str:
    """A run with a pending message on another topic and its delivered payment."""
    payments.start({}, coordination_id=cid)
    send_message(cid, "refund", {"note": "<b>later</b>"}, sender="crm", idempotency_key="crm-9")
    Workflow.for_coordination(cid).send("payment", {"amount": 4200}, sender="psp")
    assert WorkflowRun.objects.get(pk=cid).status == RunStatus.COMPLETED
    return cid


def test_the_runs_page_lists_its_messages_and_events(payments: Any) -> None:
    cid = paid_run(payments)
    body = page(logged_in("view_workflowrun").get(run_url(cid)))
    assert 'id="flowwarden-messages"' in body and 'id="flowwarden-events"' in body
    refund, payment = WorkflowMessage.objects.filter(coordination_id=cid).order_by("id")
    # In the order sent: the refund, pending, then the payment, delivered.
    assert body.index(">refund<") < body.index(">payment<")
    assert 'class="flowwarden-message-pending"' in body
    assert 'class="flowwarden-message-delivered"' in body
    for text in ("crm", "psp", "crm-9", "&quot;amount&quot;: 4200", "&lt;b&gt;later&lt;/b&gt;"):
        assert text in body, text
    assert "<b>later</b>" not in body  # escaped
    assert refund.sent_at.strftime("%Y-%m-%d %H:%M:%S") in body
    assert payment.delivered_at.strftime("%Y-%m-%d %H:%M:%S") in body
    # The events: the latest value of "stage".
    assert ">stage<" in body and "&quot;paid&quot;: 4200" in body
    # The links to the whole lists, filtered to the run.
    assert f"{MESSAGES}?coordination_id=order%3A31.v2" in body


def test_a_waiting_run_says_what_it_waits_for(payments: Any) -> None:
    payments.start({}, coordination_id="order-32")
    body = page(logged_in("view_workflowrun").get(run_url("order-32")))
    assert "Waiting for a message on “payment”." in body
    assert "No messages yet." in body
    assert "waiting for a message" in body.lower()  # the status badge, with its topic
    assert 'title="payment">payment</span>' in body


def test_a_run_without_messages_shows_no_section(payments: Any) -> None:
    run = WorkflowRun.objects.create(
        coordination_id="plain", workflow_name="plain", created_at=_now(), updated_at=_now()
    )
    body = page(logged_in("view_workflowrun").get(run_url(run.pk)))
    assert 'id="flowwarden-messages"' not in body and 'id="flowwarden-events"' not in body


def test_a_long_mailbox_shows_its_newest_messages_and_links_to_the_rest(payments: Any) -> None:
    payments.start({}, coordination_id="order-33")
    for number in range(PAGE_ROWS + 5):
        send_message("order-33", "note", {"n": number}, idempotency_key=f"note-{number}")
    body = page(logged_in("view_workflowrun").get(run_url("order-33")))
    assert f"The newest {PAGE_ROWS} messages of {PAGE_ROWS + 5}." in body
    assert "note-4<" not in body and f"note-{PAGE_ROWS + 4}<" in body
    assert f"{MESSAGES}?coordination_id=order-33" in body


def test_the_lists_filter_by_run_and_delivery(payments: Any) -> None:
    cid = paid_run(payments)
    other = paid_run(payments, "order-34")
    client = logged_in("view_workflowrun")
    listed = page(client.get(MESSAGES))
    assert listed.count('class="flowwarden-delivery"') == 4
    one_run = page(client.get(f"{MESSAGES}?coordination_id={cid}"))
    assert one_run.count('class="flowwarden-delivery"') == 2 and other not in one_run
    pending = page(client.get(f"{MESSAGES}?delivery=pending"))
    assert pending.count('data-status="pending"') == 2 and 'data-status="delivered"' not in pending
    assert page(client.get(f"{MESSAGES}?q=crm-9")).count('class="flowwarden-delivery"') == 2
    events = page(client.get(f"{EVENTS}?coordination_id={other}"))
    assert "stage" in events and "&quot;paid&quot;: 4200" in events
    # A filter the page does not offer, or a NUL: Django's ?e=1, never a server error.
    for url in (f"{MESSAGES}?payload__contains=x", f"{MESSAGES}?coordination_id=%00"):
        response = client.get(url)
        assert response.status_code == 302 and "e=1" in response.url


def test_a_messages_page_and_an_events_page(payments: Any) -> None:
    cid = paid_run(payments)
    payment = WorkflowMessage.objects.get(coordination_id=cid, topic="payment")
    url = reverse("admin:flowwarden_django_workflowmessage_change", args=[payment.pk])
    body = page(logged_in("view_workflowrun").get(url))
    assert "&quot;amount&quot;: 4200" in body and "psp" in body
    assert payment.delivered_to in body
    snapshot_page = reverse(
        "admin:flowwarden_django_workflowrun_snapshot", args=[quote(cid), payment.delivered_to]
    )
    assert snapshot_page not in body  # who may not read snapshots gets no link to one
    with_snapshots = page(
        logged_in("view_workflowrun", "view_snapshotrecord", name="reader").get(url)
    )
    assert snapshot_page in with_snapshots
    event = WorkflowEvent.objects.get(coordination_id=cid)
    event_page = page(
        logged_in("view_workflowrun", name="third").get(
            reverse("admin:flowwarden_django_workflowevent_change", args=[event.pk])
        )
    )
    assert "&quot;paid&quot;: 4200" in event_page


def test_they_are_read_only_and_need_a_view_permission(payments: Any) -> None:
    cid = paid_run(payments)
    message = WorkflowMessage.objects.filter(coordination_id=cid).first()
    change = reverse("admin:flowwarden_django_workflowmessage_change", args=[message.pk])
    nobody = logged_in()
    assert nobody.get(MESSAGES).status_code == 403
    assert nobody.get(EVENTS).status_code == 403
    own = logged_in("view_workflowmessage", name="own")  # the model's own permission
    assert own.get(MESSAGES).status_code == 200
    viewer = logged_in("view_workflowrun", name="runs")
    assert viewer.get(change).status_code == 200
    assert viewer.get(reverse("admin:flowwarden_django_workflowmessage_add")).status_code == 403
    deleted = viewer.post(
        reverse("admin:flowwarden_django_workflowmessage_delete", args=[message.pk])
    )
    assert deleted.status_code == 403 and WorkflowMessage.objects.filter(pk=message.pk).exists()
    # An id the primary key cannot hold is "not found" (a redirect with a message).
    hostile = reverse("admin:flowwarden_django_workflowmessage_change", args=["0x\x00"])
    assert viewer.get(hostile).status_code == 302


def test_they_are_registered() -> None:
    assert isinstance(admin.site._registry[WorkflowMessage], WorkflowMessageAdmin)
    assert isinstance(admin.site._registry[WorkflowEvent], WorkflowEventAdmin)


def _now() -> Any:
    from django.utils import timezone

    return timezone.now()
