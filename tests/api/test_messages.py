"""The REST API's messages to runs and events of runs:
``POST /api/v1/runs/{cid}/messages/`` (201, 200 for a repeated key, 400 with the
core validator's words, 403 without ``send_message_workflowrun``, 404 for a run
unknown or not visible, 409 for a completed or cancelled run) and the two lists,
``GET .../messages/`` and ``GET .../events/``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from flowwarden_django.common.user_input import MAX_PAYLOAD_BYTES
from flowwarden_django.models import WorkflowMessage, WorkflowRun
from flowwarden_django.workflows import RunStatus, Workflow, WorkflowDefinition, workflow_registry
from tests.api.helpers import (
    API,
    People,
    field_errors,
    pending,
    perms,
    post_json,
    postgres_lane,
    token_client,
)
from tests.support.payments_workflow import define_payments

pytest_plugins = ["tests.api.helpers"]  # the people and refunds fixtures
pytestmark = pytest.mark.django_db(transaction=True)

WORKFLOW = "api-payments"


@pytest.fixture
def payments() -> Iterator[WorkflowDefinition]:
    definition = define_payments(WORKFLOW)
    yield definition
    workflow_registry.unregister(WORKFLOW)


def waiting_run(payments: WorkflowDefinition, cid: str) -> str:
    payments.start({"order": cid}, coordination_id=cid)
    assert WorkflowRun.objects.get(pk=cid).status == RunStatus.WAITING_MESSAGE
    return cid


def sender_client(people: People) -> Client:
    """A token client of a user who may view runs and send them messages."""
    return token_client(perms(people.viewer, "send_message_workflowrun"))


def messages_url(cid: str) -> str:
    return f"{API}/runs/{cid}/messages/"


def test_a_message_wakes_the_waiting_run_and_a_repeat_returns_the_first(
    payments: Any, people: People
) -> None:
    cid = waiting_run(payments, "order:7.v1")
    client = sender_client(people)
    body = {"topic": "payment", "payload": {"amount": 42}, "idempotency_key": "psp-1"}
    sent = post_json(client, messages_url(cid), body)
    assert sent.status_code == 201, sent.content
    first = sent.json()
    row = WorkflowMessage.objects.get()
    assert first == {
        "id": row.pk,
        "coordination_id": cid,
        "topic": "payment",
        "payload": {"amount": 42},
        "sender": "user:viewer",
        "sent_at": first["sent_at"],
        "idempotency_key": "psp-1",
    }
    # Woken after the commit: the next step ran with the message.
    run = WorkflowRun.objects.get(pk=cid)
    assert run.status == RunStatus.COMPLETED
    assert Workflow.for_coordination(cid).current_result().final_state["paid"] == {"amount": 42}

    # The same key again (another payload): nothing stored, the first message back.
    again = post_json(client, messages_url(cid), {**body, "payload": {"amount": 1}})
    assert (again.status_code, again.json()) == (200, first)
    assert WorkflowMessage.objects.count() == 1

    # A new message to the completed run: refused, nothing stored.
    late = post_json(client, messages_url(cid), {"topic": "payment", "payload": {}})
    assert late.status_code == 409
    assert late.json()["code"] == "run_finished" and "completed" in late.json()["detail"]
    assert WorkflowMessage.objects.count() == 1


def test_a_message_before_the_wait_is_kept_and_listed_with_its_delivery(
    payments: Any, people: People
) -> None:
    cid = waiting_run(payments, "order-8")
    client = sender_client(people)
    other = post_json(client, messages_url(cid), {"topic": "refund", "payload": {"n": 1}})
    assert other.status_code == 201
    assert WorkflowRun.objects.get(pk=cid).status == RunStatus.WAITING_MESSAGE  # not its topic
    paid = post_json(
        client, messages_url(cid), {"topic": "payment", "payload": {"amount": 5}, "sender": "psp"}
    )
    assert paid.status_code == 201 and paid.json()["sender"] == "psp"

    listed = people.client("viewer").get(messages_url(cid)).json()
    assert listed["count"] == 2
    refund, payment = listed["results"]
    assert (refund["topic"], refund["delivered_to"], refund["delivered_at"]) == (
        "refund",
        None,
        None,
    )
    head = WorkflowMessage.objects.get(topic="payment").delivered_to
    assert payment["delivered_to"] == head and payment["delivered_at"]
    assert payment["payload"] == {"amount": 5} and payment["sender"] == "psp"
    pending_only = people.client("viewer").get(f"{messages_url(cid)}?delivered=false").json()
    assert [m["topic"] for m in pending_only["results"]] == ["refund"]
    by_topic = people.client("viewer").get(f"{messages_url(cid)}?topic=payment").json()
    assert [m["topic"] for m in by_topic["results"]] == ["payment"]
    paged = people.client("viewer").get(f"{messages_url(cid)}?page_size=1").json()
    assert len(paged["results"]) == 1 and paged["next"]

    events = people.client("viewer").get(f"{API}/runs/{cid}/events/").json()
    assert events["count"] == 1
    (stage,) = events["results"]
    assert (stage["key"], stage["value"]) == ("stage", {"paid": 5})
    assert stage["updated_at"]


def test_a_cancelled_run_refuses_messages(payments: Any, people: People) -> None:
    cid = waiting_run(payments, "order-9")
    Workflow.for_coordination(cid).cancel("withdrawn")
    response = post_json(sender_client(people), messages_url(cid), {"topic": "t", "payload": {}})
    assert response.status_code == 409 and response.json()["code"] == "run_cancelled"
    assert not WorkflowMessage.objects.exists()


def test_sending_needs_the_permission_and_a_visible_run(
    payments: Any, refunds: Any, people: People
) -> None:
    cid = waiting_run(payments, "order-10")
    body = {"topic": "payment", "payload": {"amount": 1}}
    # Not visible: 404, as GET says, for the run, its messages and its events.
    for name in ("carol", "alice"):
        client = people.client(name)
        response = post_json(client, messages_url(cid), body)
        assert (response.status_code, response.json()["code"]) == (404, "run_not_found"), name
        assert client.get(f"{API}/runs/{cid}/").status_code == 404
        assert client.get(messages_url(cid)).status_code == 404
        assert client.get(f"{API}/runs/{cid}/events/").status_code == 404
    # Not visible even with the permission.
    carol = perms(people.carol, "send_message_workflowrun")
    assert post_json(token_client(carol), messages_url(cid), body).status_code == 404
    # Visible, without the permission: 403, before the body is judged.
    refused = post_json(people.client("viewer"), messages_url(cid), {"topic": ""})
    assert (refused.status_code, refused.json()["code"]) == (403, "send_message_forbidden")
    # Unknown run.
    unknown = post_json(sender_client(people), messages_url("nope"), body)
    assert (unknown.status_code, unknown.json()["code"]) == (404, "run_not_found")
    assert not WorkflowMessage.objects.exists()
    # An approver sees the runs of their approvals: with the permission, sends to them.
    approval = pending(refunds)
    alice = token_client(perms(people.alice, "send_message_workflowrun"))
    sent = post_json(alice, messages_url(approval.coordination_id), body)
    assert sent.status_code == 201 and sent.json()["sender"] == "user:alice"
    # Anonymous: 401.
    anonymous = post_json(Client(), messages_url(cid), body)
    assert anonymous.status_code == 401
    # The session needs its CSRF token for a POST.
    csrf = people.client("admin", csrf=True)
    assert post_json(csrf, messages_url(cid), body).status_code == 403


def deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


BAD_BODIES = [
    pytest.param({"topic": "t", "payload": [1]}, "payload", "must be a JSON object", id="list"),
    pytest.param({"topic": "t", "payload": None}, "payload", "must be a JSON object", id="null"),
    pytest.param({"topic": "t", "payload": "paid"}, "payload", "not a string", id="string"),
    pytest.param(
        {"topic": "t", "payload": {"b": "x" * MAX_PAYLOAD_BYTES}},
        "payload",
        f"the most is {MAX_PAYLOAD_BYTES}",
        id="too-big",
    ),
    pytest.param({"topic": "t"}, "payload", "required", id="no-payload"),
    pytest.param({"payload": {}}, "topic", "required", id="no-topic"),
    pytest.param({"topic": "   ", "payload": {}}, "topic", "must not be blank", id="blank"),
    pytest.param({"topic": "t" * 256, "payload": {}}, "topic", "255", id="long-topic"),
    pytest.param({"topic": 5, "payload": {}}, None, None, id="topic-number-is-text"),
    pytest.param(
        {"topic": "t", "payload": {}, "idempotency_key": " "},
        "idempotency_key",
        "must not be blank",
        id="blank-key",
    ),
    pytest.param(
        {"topic": "t", "payload": {}, "sender": "user:admin"},
        "sender",
        '"user:" names the authenticated user',
        id="another-user",
    ),
    pytest.param({"topic": "t", "payload": {}, "sender": "s" * 256}, "sender", "255", id="long"),
]


@pytest.mark.parametrize(("body", "field", "words"), BAD_BODIES)
def test_a_bad_body_is_400_with_the_fields_error_and_nothing_is_sent(
    payments: Any, people: People, body: dict[str, Any], field: str | None, words: str | None
) -> None:
    cid = waiting_run(payments, "order-11")
    response = post_json(sender_client(people), messages_url(cid), body)
    if field is None:  # DRF reads a number as its text, as it does for every text field
        assert response.status_code == 201
        return
    assert response.status_code == 400, response.content
    assert field_errors(response.json()) == [field]
    assert words in response.json()[field][0], response.json()
    assert not WorkflowMessage.objects.exists()
    assert WorkflowRun.objects.get(pk=cid).status == RunStatus.WAITING_MESSAGE


def test_a_nul_in_the_payload_is_refused_by_the_parser(payments: Any, people: People) -> None:
    cid = waiting_run(payments, "order-12")
    client = sender_client(people)
    for raw in ('{"topic": "t", "payload": {"a": "x\\u0000"}}', '{"topic": "t\\u0000"}'):
        response = client.post(messages_url(cid), raw, content_type="application/json")
        assert (response.status_code, response.json()["code"]) == (400, "parse_error")
    nul_run = post_json(client, f"{API}/runs/%00/messages/", {"topic": "t", "payload": {}})
    assert nul_run.status_code == 404
    assert client.get(f"{API}/runs/%00/events/").status_code == 404
    assert client.get(f"{messages_url(cid)}?topic=%00").status_code == 400
    # The body nests deeper than the validator allows: the parser refuses it first.
    nested = post_json(client, messages_url(cid), {"topic": "t", "payload": deep(64)})
    assert (nested.status_code, nested.json()["code"]) == (400, "parse_error")
    assert "deeper than 64" in nested.json()["detail"]
    assert not WorkflowMessage.objects.exists()


def test_the_own_user_sender_and_a_blank_one_are_the_default(payments: Any, people: People):
    cid = waiting_run(payments, "order-13")
    client = sender_client(people)
    for sender, key in (("user:viewer", "a"), ("", "b")):
        body = {"topic": "other", "payload": {}, "sender": sender, "idempotency_key": key}
        response = post_json(client, messages_url(cid), body)
        assert response.status_code == 201 and response.json()["sender"] == "user:viewer"


def test_a_waiting_run_shows_its_topic(payments: Any, people: People) -> None:
    cid = waiting_run(payments, "order-14")
    body = people.client("viewer").get(f"{API}/runs/{cid}/").json()
    assert (body["status"], body["waiting_topic"], body["wake_at"]) == (
        "waiting_message",
        "payment",
        None,
    )


@pytest.mark.parametrize("lane", [pytest.param("sqlite", id="sqlite"), postgres_lane()])
def test_a_repeated_key_under_load_stores_one_message(
    lane: str, on_lane: None, payments: Any, people: People
) -> None:
    cid = waiting_run(payments, "order-15")
    client = sender_client(people)
    body = {"topic": "other", "payload": {"n": 1}, "idempotency_key": "k"}
    statuses = [post_json(client, messages_url(cid), body).status_code for _ in range(3)]
    assert statuses == [201, 200, 200]
    assert WorkflowMessage.objects.filter(coordination_id=cid).count() == 1
