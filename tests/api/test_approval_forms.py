"""The REST API and typed decision forms (issue 49): the detail describes the form,
approving validates the payload with it (400 with the form's field errors under
``payload``), the next step gets the cleaned data; hostile payloads never a 5xx."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections

from flowwarden_django.models import Approval
from flowwarden_django.workflows import Hibernated, workflow_registry
from tests.api.helpers import API, People, make_people, post_json, postgres_lane, token_client
from tests.support.typed_refund_workflow import define_typed_refunds, seen_payloads

pytest_plugins = ["tests.api.helpers"]  # the people fixture
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def typed() -> Iterator[Any]:
    yield define_typed_refunds("api-typed-refund")
    workflow_registry.unregister("api-typed-refund")


def pending(definition: Any) -> Approval:
    started = definition.start({"order": 7, "total": "120.00"})
    assert isinstance(started.result, Hibernated)
    return Approval.objects.get(coordination_id=started.coordination_id)


def test_the_detail_describes_the_form(typed: Any, people: People) -> None:
    approval = pending(typed)
    body = people.client("bob").get(f"{API}/approvals/{approval.pk}/").json()
    form = body["form"]
    assert form["path"] == "tests.testapp.forms.RefundDecisionForm" and form["error"] == ""
    assert [f["name"] for f in form["fields"]] == ["amount", "reason", "refund_on"]
    amount, reason, refund_on = form["fields"]
    assert amount == {
        "name": "amount",
        "type": "DecimalField",
        "required": True,
        "label": "Amount",
        "help_text": "",
        "choices": None,
        "multiple": False,
        "initial": "120.00",
    }
    assert reason["type"] == "ChoiceField"
    assert [c["value"] for c in reason["choices"]] == ["damaged", "late", "goodwill"]
    assert refund_on["required"] is False and refund_on["type"] == "DateField"


def test_an_invalid_payload_gets_the_form_errors(typed: Any, people: People) -> None:
    approval = pending(typed)
    url = f"{API}/approvals/{approval.pk}/approve/"
    client = token_client(people.alice)
    response = post_json(client, url, {"payload": {"amount": "500", "reason": "bored"}})
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid"
    assert set(body["payload"]) == {"amount", "reason"}
    assert body["payload"]["amount"] == ["At most the order's total, 120.00."]
    response = post_json(client, url, {})  # no payload at all
    assert response.status_code == 400 and set(response.json()["payload"]) == {"amount", "reason"}
    approval.refresh_from_db()
    assert approval.status == "pending"

    response = post_json(client, url, {"payload": {"amount": 80, "reason": "damaged"}})
    assert response.status_code == 200, response.content
    assert response.json()["payload"] == {"amount": "80", "reason": "damaged", "refund_on": None}
    assert seen_payloads == [{"amount": "80", "reason": "damaged", "refund_on": None}]


def test_rejecting_takes_any_payload(typed: Any, people: People) -> None:
    approval = pending(typed)
    response = post_json(
        token_client(people.alice),
        f"{API}/approvals/{approval.pk}/reject/",
        {"payload": {"why": "no"}},
    )
    assert response.status_code == 200 and seen_payloads == [{"why": "no"}]


def test_a_form_that_no_longer_imports(typed: Any, people: People) -> None:
    approval = pending(typed)
    Approval.objects.filter(pk=approval.pk).update(form="tests.testapp.forms.GoneForm")
    client = token_client(people.alice)
    body = client.get(f"{API}/approvals/{approval.pk}/").json()
    assert body["form"]["fields"] == [] and "GoneForm" in body["form"]["error"]
    response = post_json(
        client, f"{API}/approvals/{approval.pk}/approve/", {"payload": {"amount": "1"}}
    )
    assert response.status_code == 409
    assert response.json()["code"] == "approval_form_unavailable"
    Approval.objects.filter(pk=approval.pk).update(form="os.system")
    assert client.get(f"{API}/approvals/{approval.pk}/").json()["form"]["error"]
    response = post_json(client, f"{API}/approvals/{approval.pk}/approve/", {})
    assert response.status_code == 409


HOSTILE = [
    {"payload": {"amount": "1" * 100_000, "reason": "late"}},
    {"payload": {"amount": "1\x00", "reason": "late"}},
    {"payload": {"amount": "NaN", "reason": "late"}},
    {"payload": {"amount": "Infinity", "reason": "late"}},
    {"payload": {"amount": "1e999999", "reason": "late"}},
    {"payload": {"amount": 1e308, "reason": "late"}},
    {"payload": {"amount": True, "reason": False}},
    {"payload": {"amount": None, "reason": None}},
    {"payload": {"amount": [], "reason": {}}},
    {"payload": {"amount": {"a": {"b": {"c": [1, 2, [3]]}}}, "reason": "late"}},
    {"payload": {"amount": "5", "reason": "late", "refund_on": "99999-99-99"}},
    {"payload": {"amount": "5", "reason": "late", "refund_on": 12345678901234567890}},
    {"payload": {"amount": "5", "reason": "\ud800"}},
    {"payload": {"amount": "5", "reason": "late" * 1000}},
    {"payload": [1, 2]},
    {"payload": "text"},
    {"payload": 5},
    {"payload": {"__all__": "x", "amount": "-1", "reason": "late"}},
    {"payload": {"": 1}},
    {"comment": 5, "payload": {"amount": "5"}},
]


@pytest.mark.parametrize("body", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_payloads_never_a_5xx(typed: Any, people: People, body: Any) -> None:
    approval = pending(typed)
    response = post_json(
        token_client(people.alice), f"{API}/approvals/{approval.pk}/approve/", body
    )
    assert response.status_code == 400, (body, response.content)
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_a_deeply_nested_payload_is_a_400(typed: Any, people: People) -> None:
    approval = pending(typed)
    nested = "[" * 5000 + "]" * 5000
    response = token_client(people.alice).post(
        f"{API}/approvals/{approval.pk}/approve/",
        '{"payload": {"amount": ' + nested + "}}",
        content_type="application/json",
    )
    assert response.status_code == 400, response.content


def test_the_schema_documents_the_form(people: People) -> None:
    response = token_client(people.carol).get(f"{API}/schema/?format=json")
    assert response.status_code == 200
    schema = response.json()
    components = schema["components"]["schemas"]
    detail = components["ApprovalDetail"]["properties"]["form"]
    assert "ApprovalForm" in str(detail) and "null" in str(detail).lower()
    fields = components["FormField"]["properties"]
    assert {"name", "type", "required", "label", "help_text", "choices", "initial"} <= set(fields)
    approve = schema["paths"][f"{API}/approvals/{{id}}/approve/"]["post"]
    assert "form" in approve["description"] and "payload" in approve["description"]
    body = approve["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    payload = components[body.rsplit("/", 1)[1]]["properties"]["payload"]
    assert "form" in payload["description"]


@pytest.mark.parametrize("lane", [postgres_lane()])
def test_typed_decisions_on_postgres(lane: str, on_lane: None, typed: Any) -> None:
    assert connections[Approval.objects.db].vendor == "postgresql"
    people = make_people()
    approval = pending(typed)
    url = f"{API}/approvals/{approval.pk}/approve/"
    client = token_client(people.alice)
    bad = post_json(client, url, {"payload": {"amount": "500", "reason": "late"}})
    assert bad.status_code == 400 and "payload" in bad.json()
    assert client.get(f"{API}/approvals/{approval.pk}/").json()["form"]["fields"]
    good = post_json(client, url, {"payload": {"amount": "7.25", "reason": "late"}})
    assert good.status_code == 200, good.content
    assert Approval.objects.get(pk=approval.pk).payload == {
        "amount": "7.25",
        "reason": "late",
        "refund_on": None,
    }
    assert seen_payloads == [{"amount": "7.25", "reason": "late", "refund_on": None}]
    assert Approval.objects.using("default").count() == 0  # all of it went to PostgreSQL
