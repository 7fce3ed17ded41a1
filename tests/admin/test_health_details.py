"""With ``FLOWWARDEN["HEALTH_DETAILS"] = "none"`` no admin page shows an instance id
(``<hostname>:<pid>``) or an error text to a staff user who may view the rows: not
the stream worker's page (reached by its sequential id) nor its history, not the
checkpoints' list, page or history, not a run's runner nor its tree's store error,
not a store's error on an approval's page, its confirmation page or a failed
decision, a fork or a dead-letter operation, nor the API's unreadable snapshot, nor
the run's messages and events (on its page, in their lists and on their pages).
They show the instance's key instead, as the Streams console and the health report
do; whom ``HEALTH_DETAILS`` names still sees the ids. A message's payload and an
event's value are the run's data, not details: shown to whoever may view the run."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.test.utils import override_settings
from django.urls import reverse
from django.utils import timezone

from flowwarden_django.admin import approvals as approvals_admin
from flowwarden_django.admin import dead_letters as dead_letters_admin
from flowwarden_django.admin.runs import WorkflowRunAdmin
from flowwarden_django.models import (
    Approval,
    StreamCheckpoint,
    StreamWorker,
    WorkflowEvent,
    WorkflowMessage,
    WorkflowRun,
)
from flowwarden_django.streams.dlq import ErrorInfo
from flowwarden_django.streams.operations.status import instance_key
from flowwarden_django.workflows import Hibernated, workflow_registry
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.storage.encryption import SnapshotDecryptionError
from flowwarden_django.workflows.waiting.approvals import deciding
from tests.admin.test_dead_letters import park
from tests.admin.test_dead_letters import run_action as dlq_action
from tests.admin.test_runs import chain_run, fork_url
from tests.api.helpers import API
from tests.support.refund_workflow import define_refunds

pytestmark = pytest.mark.django_db

HOST = "db-primary.corp.internal:4242"
PASSWORD = "hunter2-not-for-you"
LAST_ERROR = f"OperationalError: connection to postgres://app:{PASSWORD}@db failed"
PARKED = "order-7781-parked"
RUNNER = f"{HOST}:139872:0a1b2c3d4e5f"


def client_with(*codenames: str, staff: bool = True) -> Client:
    user = User.objects.create_user("viewer", password="pw", is_staff=staff)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def superuser_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


@pytest.fixture
def rows() -> dict[str, Any]:
    now = timezone.now()
    worker = StreamWorker.objects.create(
        stream_name="orders",
        instance_id=HOST,
        state="crashed",
        last_error=LAST_ERROR,
        error_kind="OperationalError",
        parked_keys=[PARKED],
        updated_at=now,
    )
    StreamCheckpoint.objects.create(stream_name="orders", instance_id=HOST, last_heartbeat_at=now)
    run = WorkflowRun.objects.create(
        coordination_id="order-7781",
        workflow_name="refunds",
        runner=RUNNER,
        created_at=now,
        updated_at=now,
    )
    message = WorkflowMessage.objects.create(
        coordination_id=run.pk,
        topic="payment",
        payload={"amount": 4200},
        sender="psp",
        sent_at=now,
        idempotency_key="pi_7781",
    )
    event = WorkflowEvent.objects.create(
        coordination_id=run.pk, key="stage", value={"paid": 4200}, updated_at=now
    )
    return {"worker": worker, "run": run, "message": message, "event": event}


def pages(rows: dict[str, Any]) -> list[str]:
    worker, run = rows["worker"].pk, rows["run"].pk
    return [
        reverse("admin:flowwarden_django_streamworker_change", args=[worker]),
        reverse("admin:flowwarden_django_streamworker_history", args=[worker]),
        reverse("admin:flowwarden_django_streamcheckpoint_changelist"),
        reverse("admin:flowwarden_django_streamcheckpoint_change", args=["orders"]),
        reverse("admin:flowwarden_django_streamcheckpoint_history", args=["orders"]),
        reverse("admin:flowwarden_django_workflowrun_change", args=[run]),
        reverse("admin:flowwarden_django_workflowrun_history", args=[run]),
        reverse("admin:flowwarden_django_workflowmessage_changelist"),
        reverse("admin:flowwarden_django_workflowmessage_change", args=[rows["message"].pk]),
        reverse("admin:flowwarden_django_workflowevent_changelist"),
        reverse("admin:flowwarden_django_workflowevent_change", args=[rows["event"].pk]),
    ]


VIEWER = ("view_streamworker", "view_streamcheckpoint", "view_workflowrun")
#: What the pages of the run's messages and events show without the details.
RUN_DATA = ("&quot;amount&quot;: 4200", "&quot;paid&quot;: 4200", "psp", "pi_7781")


@override_settings(FLOWWARDEN={"HEALTH_DETAILS": "none"})
def test_no_admin_page_shows_an_instance_id_or_an_error_text_without_the_details(rows):
    client = client_with(*VIEWER)
    for page in pages(rows):
        response = client.get(page)
        assert response.status_code == 200, page
        body = response.content.decode()
        for secret in ("db-primary", PASSWORD, "postgres://", PARKED):
            assert secret not in body, (page, secret)
    key = instance_key(HOST)
    worker_page = client.get(pages(rows)[0]).content.decode()
    assert key in worker_page and "OperationalError" in worker_page  # its kind, not its text
    assert key in client.get(pages(rows)[2]).content.decode()
    assert f"{key}:139872:0a1b2c3d4e5f" in client.get(pages(rows)[5]).content.decode()
    # The run's messages and events are its data, not details.
    run_page = client.get(pages(rows)[5]).content.decode()
    assert all(text in run_page for text in RUN_DATA)
    message_page = client.get(pages(rows)[8]).content.decode()
    assert "&quot;amount&quot;: 4200" in message_page and "pi_7781" in message_page
    assert "&quot;paid&quot;: 4200" in client.get(pages(rows)[10]).content.decode()


@override_settings(FLOWWARDEN={"HEALTH_DETAILS": "none"})
def test_a_superuser_sees_no_instance_id_when_nobody_may(rows):
    client = superuser_client()
    for page in pages(rows):
        body = client.get(page).content.decode()
        assert "db-primary" not in body and PASSWORD not in body, page


@override_settings(FLOWWARDEN={"HEALTH_DETAILS": "flowwarden_django.control_stream"})
def test_the_holders_of_the_detail_permission_see_the_ids_and_the_error(rows):
    detailed = client_with(*VIEWER, "control_stream")
    worker_page = detailed.get(pages(rows)[0]).content.decode()
    assert HOST in worker_page and PASSWORD in worker_page
    assert HOST in detailed.get(pages(rows)[2]).content.decode()
    assert RUNNER in detailed.get(pages(rows)[5]).content.decode()


@override_settings(FLOWWARDEN={"HEALTH_DETAILS": "none"})
def test_a_store_error_on_the_run_tree_names_its_class_only(rows, monkeypatch):
    def broken(self, run):
        raise RuntimeError(f"cannot reach mongodb://app:{PASSWORD}@snapshots.corp.internal")

    monkeypatch.setattr(WorkflowRunAdmin, "store_of", broken)
    client = client_with(*VIEWER, "view_snapshotrecord")
    run = rows["run"].pk
    tree = client.get(reverse("admin:flowwarden_django_workflowrun_tree", args=[run]))
    nodes = client.get(reverse("admin:flowwarden_django_workflowrun_tree_nodes", args=[run]))
    for body in (tree.content.decode(), nodes.content.decode()):
        assert PASSWORD not in body and "snapshots.corp" not in body
        assert "RuntimeError" in body


# -- store and driver errors in messages and pages ---------------------------------------

STORE_ERROR = f"cannot reach mongodb://app:{PASSWORD}@snapshots.corp.internal"


def assert_class_only(body: str, kind: str = "RuntimeError") -> None:
    assert PASSWORD not in body and "snapshots.corp" not in body
    assert kind in body and "the server log has the details" in body


@pytest.fixture
def refunds() -> Any:
    definition = define_refunds("health-refund", OrmSnapshotStore())
    yield definition
    workflow_registry.unregister("health-refund")


def pending_approval(definition: Any) -> Approval:
    started = definition.start({"amount": 500})
    assert isinstance(started.result, Hibernated)
    return Approval.objects.get(coordination_id=started.coordination_id)


@pytest.mark.django_db(transaction=True)
@override_settings(FLOWWARDEN={"HEALTH_DETAILS": "none"})
def test_the_approval_pages_name_a_store_errors_class_only(refunds, monkeypatch):
    approval = pending_approval(refunds)

    def broken(*args: Any) -> Any:
        raise RuntimeError(STORE_ERROR)

    monkeypatch.setattr(approvals_admin, "run_store", broken)
    client = superuser_client()
    change = client.get(reverse("admin:flowwarden_django_approval_change", args=[approval.pk]))
    confirm = client.get(reverse("admin:flowwarden_django_approval_approve", args=[approval.pk]))
    for response in (change, confirm):
        assert response.status_code == 200
        assert_class_only(response.content.decode())


@pytest.mark.django_db(transaction=True)
@override_settings(FLOWWARDEN={"HEALTH_DETAILS": "none"})
def test_a_failed_decision_names_the_errors_class_only(refunds, monkeypatch):
    approval = pending_approval(refunds)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(STORE_ERROR)

    monkeypatch.setattr(deciding, "decide", broken)
    url = reverse("admin:flowwarden_django_approval_approve", args=[approval.pk])
    response = superuser_client().post(url, {"post": "yes"}, follow=True)
    body = response.content.decode()
    assert "Could not approve" in body
    assert_class_only(body)


@pytest.mark.django_db(transaction=True)
@override_settings(FLOWWARDEN={"HEALTH_DETAILS": "flowwarden_django.control_stream"})
def test_with_the_details_the_approval_page_shows_the_store_error(refunds, monkeypatch):
    approval = pending_approval(refunds)

    def broken(*args: Any) -> Any:
        raise RuntimeError(STORE_ERROR)

    monkeypatch.setattr(approvals_admin, "run_store", broken)
    body = (
        superuser_client()
        .get(reverse("admin:flowwarden_django_approval_change", args=[approval.pk]))
        .content.decode()
    )
    assert f"RuntimeError: {STORE_ERROR}" in body


@override_settings(FLOWWARDEN={"HEALTH_DETAILS": "none"})
def test_the_fork_page_hides_a_store_error_but_not_a_refused_state(monkeypatch):
    chain = chain_run("health-fork", 2)
    url = fork_url("health-fork", chain[0].id)
    client = superuser_client()

    def store_down(*args: Any) -> Any:
        raise RuntimeError(STORE_ERROR)

    monkeypatch.setattr(OrmSnapshotStore, "fork", store_down)
    failed = client.post(url, {"state": '{"n": 1}', "post": "yes"})
    assert failed.status_code == 200
    assert_class_only(failed.content.decode())

    def refuse_state(*args: Any) -> Any:
        raise ValueError("n must be positive")

    monkeypatch.setattr(OrmSnapshotStore, "fork", refuse_state)
    refused = client.post(url, {"state": '{"n": -1}', "post": "yes"})
    assert "The fork failed: ValueError: n must be positive" in refused.content.decode()


@override_settings(FLOWWARDEN={"HEALTH_DETAILS": "none"})
def test_a_dead_letter_store_error_names_its_class_only(monkeypatch):
    entry = park("health-dlq", 1, error=ErrorInfo("PaymentRejectedError", "no"))

    def store_down(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError(STORE_ERROR)

    monkeypatch.setattr(dead_letters_admin, "acknowledge_dead_letter", store_down)
    body = dlq_action(superuser_client(), "acknowledge_selected", entry).content.decode()
    assert "could not be acknowledged" in body
    assert_class_only(body, "ConnectionError")


@override_settings(FLOWWARDEN={"HEALTH_DETAILS": "none"})
def test_the_apis_unreadable_snapshot_names_no_store_error(monkeypatch):
    chain = chain_run("health-api", 1)

    def undecryptable(self: Any, snapshot_id: str) -> Any:
        raise SnapshotDecryptionError(STORE_ERROR)

    monkeypatch.setattr(OrmSnapshotStore, "load", undecryptable)
    response = superuser_client().get(f"{API}/snapshots/{chain[0].id}/")
    assert response.status_code == 409 and response.json()["code"] == "snapshot_unreadable"
    assert PASSWORD not in response.content.decode()
    with override_settings(FLOWWARDEN={"HEALTH_DETAILS": "staff"}):
        detailed = superuser_client_named("root2").get(f"{API}/snapshots/{chain[0].id}/")
    assert PASSWORD in detailed.json()["detail"]


def superuser_client_named(name: str) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser(name, f"{name}@example.com", "pw"))
    return client
