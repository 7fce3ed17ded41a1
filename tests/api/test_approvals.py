"""The REST API: approvals (lists, detail) and deciding them (on SQLite and PostgreSQL)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.test import Client
from django.utils import timezone

from flowwarden_django.api.exceptions import exception_handler
from flowwarden_django.models import Approval, ApprovalEvent, WorkflowRun
from flowwarden_django.workflows import RunStatus
from flowwarden_django.workflows.waiting.approvals import (
    ApprovalConflictError,
    ApprovalExpiredError,
    ApprovalPermissionError,
    UnknownApprovalError,
)
from tests.api.helpers import (
    API,
    WORKFLOW,
    People,
    field_errors,
    make_people,
    pending,
    post_json,
    postgres_lane,
    token_client,
)
from tests.support.refund_workflow import seen_decisions as SEEN

pytest_plugins = ["tests.api.helpers"]  # the people and refunds fixtures
pytestmark = pytest.mark.django_db(transaction=True)


def ids(response: Any) -> list[str]:
    assert response.status_code == 200, response.content
    return [row["id"] for row in response.json()["results"]]


# -- lists and detail ------------------------------------------------------------------


def test_who_sees_which_approvals(refunds: Any, people: People) -> None:
    first = pending(refunds)
    second = pending(refunds, amount=900)
    newest_first = [str(second.pk), str(first.pk)]
    for name in ("alice", "bob", "auditor", "admin"):
        assert ids(people.client(name).get(f"{API}/approvals/")) == newest_first, name
    for name in ("carol", "viewer"):
        assert ids(people.client(name).get(f"{API}/approvals/")) == [], name
    # Mine: pending ones the user may decide: assigned by name or group, or all of them
    # with decide_approval (a superuser holds it); a viewer of approvals decides none.
    assert ids(people.client("alice").get(f"{API}/approvals/mine/")) == newest_first
    assert ids(people.client("bob").get(f"{API}/approvals/mine/")) == newest_first
    assert ids(people.client("admin").get(f"{API}/approvals/mine/")) == newest_first
    assert ids(people.client("auditor").get(f"{API}/approvals/mine/")) == []
    decided = post_json(token_client(people.alice), f"{API}/approvals/{first.pk}/approve/", {})
    assert decided.status_code == 200
    assert ids(people.client("bob").get(f"{API}/approvals/mine/")) == [str(second.pk)]


def test_approval_filters(refunds: Any, people: People) -> None:
    first = pending(refunds)
    second = pending(refunds)
    post_json(token_client(people.alice), f"{API}/approvals/{first.pk}/reject/", {})
    client = people.client("auditor")
    assert ids(client.get(f"{API}/approvals/?status=pending")) == [str(second.pk)]
    assert ids(client.get(f"{API}/approvals/?status=rejected")) == [str(first.pk)]
    assert ids(client.get(f"{API}/approvals/?coordination={first.coordination_id}")) == [
        str(first.pk)
    ]
    assert len(ids(client.get(f"{API}/approvals/?workflow={WORKFLOW}"))) == 2
    assert ids(client.get(f"{API}/approvals/?workflow=other")) == []
    assert ids(client.get(f"{API}/approvals/mine/?status=rejected")) == []
    response = client.get(f"{API}/approvals/?status=maybe")
    assert response.status_code == 400 and field_errors(response.json()) == ["status"]


def test_approval_detail(refunds: Any, people: People) -> None:
    approval = pending(refunds, expires_in=3600)
    response = people.client("bob").get(f"{API}/approvals/{approval.pk}/")
    assert response.status_code == 200
    body = response.json()
    assert body == {
        "id": str(approval.pk),
        "coordination_id": approval.coordination_id,
        "workflow": WORKFLOW,
        "step": "review",
        "snapshot_id": approval.snapshot_id,
        "prompt": "Refund 500?",
        "status": "pending",
        "assignees": ["alice"],
        "group": "finance",
        "permission": "",
        "requested_at": body["requested_at"],
        "expires_at": body["expires_at"],
        "on_expiry": "resume",
        "decided_at": None,
        "decided_by": None,
        "comment": "",
        "payload": None,
        "claimed_by": None,
        "claimed_at": None,
        "escalate_at": None,
        "escalated_at": None,
        "next_reminder_at": None,
        "reminders_sent": 0,
        "overdue": False,
        "state": {"amount": 500, "expires_in": 3600, "review": "manual"},
        "can_decide": True,
        "form": None,
        "events": [
            {
                "action": "requested",
                "actor": "",
                "at": body["events"][0]["at"],
                "comment": "Refund 500?",
                "payload": body["events"][0]["payload"],
                "detail": "",
            }
        ],
    }
    assert body["expires_at"] is not None
    assert body["events"][0]["payload"]["assignees"] == ["alice"]
    # Past its escalation time: overdue, in the list and the detail (issue 49).
    escalate_at = timezone.now() - timedelta(minutes=1)
    Approval.objects.filter(pk=approval.pk).update(escalate_at=escalate_at)
    body = people.client("bob").get(f"{API}/approvals/{approval.pk}/").json()
    assert body["overdue"] is True and body["escalate_at"] is not None
    listed = people.client("bob").get(f"{API}/approvals/").json()["results"]
    assert [(a["id"], a["overdue"]) for a in listed] == [(str(approval.pk), True)]
    assert ids(people.client("bob").get(f"{API}/approvals/?overdue=true")) == [str(approval.pk)]
    assert ids(people.client("bob").get(f"{API}/approvals/mine/?overdue=false")) == []
    calm = pending(refunds)  # no deadline at all (NULLs): not overdue
    assert ids(people.client("bob").get(f"{API}/approvals/?overdue=false")) == [str(calm.pk)]
    response = people.client("bob").get(f"{API}/approvals/?overdue=%00")
    assert response.status_code == 400 and field_errors(response.json()) == ["overdue"]
    assert (
        people.client("auditor").get(f"{API}/approvals/{approval.pk}/").json()["can_decide"]
        is False
    )


def test_hidden_and_unknown_approvals_are_404(refunds: Any, people: People) -> None:
    approval = pending(refunds)
    carol = token_client(people.carol)
    for url in (
        f"{API}/approvals/{approval.pk}/",
        f"{API}/approvals/{uuid.uuid4()}/",
        f"{API}/approvals/not-a-uuid/",
    ):
        response = carol.get(url)
        assert response.status_code == 404, url
        assert response.json()["code"] == "approval_not_found"
    for action in ("approve", "reject"):
        response = post_json(carol, f"{API}/approvals/{approval.pk}/{action}/", {})
        assert response.status_code == 404
        assert response.json()["code"] == "approval_not_found"
    admin = token_client(people.admin)
    assert post_json(admin, f"{API}/approvals/not-a-uuid/approve/", {}).status_code == 404
    assert Approval.objects.get(pk=approval.pk).status == "pending"


# -- deciding (SQLite here, PostgreSQL below) ------------------------------------------


def check_approve_resumes_once_and_replays(definition: Any, people: People) -> None:
    approval = pending(definition)
    client = token_client(people.alice)
    url = f"{API}/approvals/{approval.pk}/approve/"
    first = post_json(client, url, {"comment": "ok", "payload": {"note": "vip"}})
    assert first.status_code == 200, first.content
    body = first.json()
    assert body["status"] == "approved" and body["decided_by"] == "alice"
    assert body["comment"] == "ok" and body["payload"] == {"note": "vip"}
    # Decided: nobody may decide it any more, the decider included.
    assert body["decided_at"] is not None and body["can_decide"] is False
    detail = client.get(f"{API}/approvals/{approval.pk}/").json()
    assert detail["status"] == "approved" and detail["can_decide"] is False
    assert "events" not in body
    assert len(SEEN) == 1 and SEEN[0].payload == {"note": "vip"}
    run = WorkflowRun.objects.get(pk=approval.coordination_id)
    assert run.status == RunStatus.COMPLETED

    # The same decision again, by someone else, with another comment: the first one.
    again = post_json(token_client(people.bob), url, {"comment": "me too", "payload": {"x": 1}})
    assert again.status_code == 200
    assert again.json() == body
    assert len(SEEN) == 1  # the run resumed once
    actions = list(
        ApprovalEvent.objects.filter(approval_id=approval.pk).values_list("action", "actor")
    )
    assert actions == [("requested", ""), ("approved", "alice"), ("repeated", "bob")]


def check_reject_then_approve_conflicts(definition: Any, people: People) -> None:
    approval = pending(definition)
    client = token_client(people.bob)
    response = post_json(client, f"{API}/approvals/{approval.pk}/reject/", {"comment": "no"})
    assert response.status_code == 200 and response.json()["status"] == "rejected"
    assert SEEN[-1].rejected
    response = post_json(token_client(people.alice), f"{API}/approvals/{approval.pk}/approve/", {})
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "approval_already_decided" and "rejected" in body["detail"]
    assert set(body) == {"code", "detail"}
    assert Approval.objects.get(pk=approval.pk).status == "rejected"
    refused = ApprovalEvent.objects.get(approval_id=approval.pk, action="refused")
    assert refused.actor == "alice"


def check_a_late_decision_is_410(definition: Any, people: People) -> None:
    approval = pending(definition, expires_in=60)
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    url = f"{API}/approvals/{approval.pk}/approve/"
    response = post_json(token_client(people.alice), url, {})
    assert response.status_code == 410
    assert response.json()["code"] == "approval_expired"
    assert Approval.objects.get(pk=approval.pk).status == "expired"
    # Still expired the second time (and a rejection too).
    assert post_json(token_client(people.alice), url, {}).status_code == 410
    reject = f"{API}/approvals/{approval.pk}/reject/"
    assert post_json(token_client(people.bob), reject, {}).status_code == 410


DECISION_CHECKS = [
    check_approve_resumes_once_and_replays,
    check_reject_then_approve_conflicts,
    check_a_late_decision_is_410,
]


@pytest.mark.parametrize("check", DECISION_CHECKS, ids=lambda c: c.__name__[6:])
def test_decisions_on_sqlite(check: Any, refunds: Any, people: People) -> None:
    check(refunds, people)


@pytest.mark.parametrize("check", DECISION_CHECKS, ids=lambda c: c.__name__[6:])
@pytest.mark.parametrize("lane", [postgres_lane()])
def test_decisions_on_postgres(check: Any, lane: str, on_lane: None, refunds: Any) -> None:
    assert connections[WorkflowRun.objects.db].vendor == "postgresql"
    people = make_people()
    check(refunds, people)
    assert Approval.objects.using("default").count() == 0  # all of it went to PostgreSQL


# -- refusals and bodies ---------------------------------------------------------------


def test_a_visible_approval_the_user_may_not_decide_is_403(refunds: Any, people: People) -> None:
    approval = pending(refunds)
    for action in ("approve", "reject"):
        response = post_json(
            token_client(people.auditor), f"{API}/approvals/{approval.pk}/{action}/", {}
        )
        assert response.status_code == 403
        assert response.json()["code"] == "approval_forbidden"
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert SEEN == []


def test_an_approval_whose_run_moved_on_is_409_cancelled(refunds: Any, people: People) -> None:
    approval = pending(refunds)
    workflow = refunds.workflow(approval.coordination_id)
    workflow.fork(workflow.history()[0].id, {"amount": 1})  # an operator redoes the run
    WorkflowRun.objects.filter(pk=approval.coordination_id).update(status=RunStatus.HIBERNATED)
    response = post_json(token_client(people.alice), f"{API}/approvals/{approval.pk}/approve/", {})
    assert response.status_code == 409
    assert response.json()["code"] == "approval_cancelled"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"comment": "x" * 2001}, "comment"),
        ({"comment": None}, "comment"),
        ({"comment": ["a"]}, "comment"),
        ({"payload": [1, 2]}, "payload"),
        ({"payload": "text"}, "payload"),
        ([], "non_field_errors"),
    ],
)
def test_invalid_decision_bodies_are_400(
    refunds: Any, people: People, body: Any, field: str
) -> None:
    approval = pending(refunds)
    response = post_json(
        token_client(people.alice), f"{API}/approvals/{approval.pk}/approve/", body
    )
    assert response.status_code == 400
    errors = response.json()
    assert field_errors(errors) == [field] and isinstance(errors[field], list)
    assert Approval.objects.get(pk=approval.pk).status == "pending"


def test_an_empty_body_and_a_null_payload_are_fine(refunds: Any, people: People) -> None:
    approval = pending(refunds)
    client = token_client(people.alice)
    response = client.generic("POST", f"{API}/approvals/{approval.pk}/approve/")  # no body
    assert response.status_code == 200
    assert response.json()["comment"] == "" and response.json()["payload"] is None
    other = pending(refunds)
    response = post_json(
        client, f"{API}/approvals/{other.pk}/reject/", {"comment": "x" * 2000, "payload": None}
    )
    assert response.status_code == 200


def test_deciding_with_a_session_needs_the_csrf_token(refunds: Any, people: People) -> None:
    approval = pending(refunds)
    client = people.client("alice", csrf=True)
    client.get("/admin/login/")  # sets the CSRF cookie
    url = f"{API}/approvals/{approval.pk}/approve/"
    response = post_json(client, url, {})
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    response = post_json(client, url, {}, X_CSRFToken=client.cookies["csrftoken"].value)
    assert response.status_code == 200 and response.json()["status"] == "approved"
    assert client.get(f"{API}/approvals/{approval.pk}/").status_code == 200  # GET needs none


def test_a_refused_decision_keeps_its_audit_event_under_atomic_requests(
    refunds: Any, people: People
) -> None:
    approval = pending(refunds)
    post_json(token_client(people.bob), f"{API}/approvals/{approval.pk}/reject/", {})
    settings = connections["default"].settings_dict
    settings["ATOMIC_REQUESTS"] = True
    try:
        response = post_json(
            token_client(people.alice), f"{API}/approvals/{approval.pk}/approve/", {}
        )
    finally:
        settings["ATOMIC_REQUESTS"] = False
    assert response.status_code == 409
    assert ApprovalEvent.objects.filter(approval_id=approval.pk, action="refused").exists()


def test_session_and_token_clients_see_the_same(refunds: Any, people: People) -> None:
    approval = pending(refunds)
    by_session = Client()
    by_session.force_login(people.alice)
    url = f"{API}/approvals/{approval.pk}/"
    assert by_session.get(url).json() == token_client(people.alice).get(url).json()


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (UnknownApprovalError("x"), 404, "approval_not_found"),
        (ApprovalPermissionError("x"), 403, "approval_forbidden"),
        (ApprovalConflictError("x"), 409, "approval_already_decided"),
        (ApprovalConflictError("x", code="approval_cancelled"), 409, "approval_cancelled"),
        (ApprovalConflictError("x", code="run_busy"), 409, "run_busy"),
        (ApprovalExpiredError("x"), 410, "approval_expired"),
    ],
)
def test_core_errors_keep_their_codes(error: Exception, status: int, code: str) -> None:
    response = exception_handler(error, {})
    assert response is not None and response.status_code == status
    assert response.data == {"code": code, "detail": "x"}
