"""The REST API: authentication, the root, and workflow runs."""

from __future__ import annotations

import base64
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client, override_settings
from django.utils import timezone

from flowwarden_django.models import WorkflowRun
from tests.api.helpers import (
    API,
    WORKFLOW,
    People,
    field_errors,
    pending,
    token_client,
)

pytest_plugins = ["tests.api.helpers"]  # the people and refunds fixtures
pytestmark = pytest.mark.django_db(transaction=True)


# -- authentication --------------------------------------------------------------------


ALL_GETS = ["/", "/runs/", "/runs/x/", "/runs/x/messages/", "/runs/x/events/"]
ALL_GETS += ["/snapshots/", "/snapshots/x/"]
ALL_GETS += ["/approvals/", "/approvals/mine/", "/approvals/00000000-0000-0000-0000-000000000000/"]


@pytest.mark.parametrize("url", ALL_GETS)
def test_anonymous_requests_are_401_naming_the_accepted_schemes(url: str) -> None:
    response = Client().get(API + url)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Token"
    body = response.json()
    assert body["code"] == "not_authenticated"
    assert body["accepted"] == ["Token", "Basic", "Session"]
    assert "Authorization: Token <key>" in body["hint"]
    assert "Authorization: Basic" in body["hint"]


def test_the_schema_and_its_pages_are_open_to_anyone() -> None:
    client = Client()
    schema = client.get(f"{API}/schema/?format=json")
    assert schema.status_code == 200 and schema.json()["info"]["title"]
    for page, marker in (("docs", "SwaggerUIBundle"), ("redoc", "redoc.standalone.js")):
        response = client.get(f"{API}/{page}/")
        assert response.status_code == 200, page
        html = response.content.decode()
        assert marker in html
        # The scripts come with the package (the sidecar), not from a CDN.
        assert "/static/drf_spectacular_sidecar/" in html and "cdn.jsdelivr" not in html
        assert f"{API}/schema/" in html


def test_basic_authentication_and_a_token_from_the_token_endpoint(people: People) -> None:
    basic = base64.b64encode(b"viewer:pw").decode()
    client = Client(headers={"Authorization": f"Basic {basic}"})
    assert client.get(f"{API}/runs/").status_code == 200

    response = Client().post(f"{API}/token/", {"username": "viewer", "password": "pw"})
    assert response.status_code == 200
    key = response.json()["token"]
    assert Client(headers={"Authorization": f"Token {key}"}).get(f"{API}/runs/").status_code == 200

    refused = Client().post(f"{API}/token/", {"username": "viewer", "password": "no"})
    assert refused.status_code == 400
    assert refused.json()["code"] == "invalid"


def test_the_browsable_api_answers_a_browser(people: People) -> None:
    client = people.client("viewer")
    response = client.get(f"{API}/runs/", headers={"Accept": "text/html"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    assert "Run List" in response.content.decode() or "runs" in response.content.decode()
    assert client.get(f"{API}/runs/").json()["results"] == []  # JSON stays the default


def test_the_schemes_are_a_setting(people: People) -> None:
    basic_only = {"API_AUTHENTICATION": ["rest_framework.authentication.BasicAuthentication"]}
    with override_settings(FLOWWARDEN=basic_only):
        response = Client().get(f"{API}/runs/")
        assert response.headers["WWW-Authenticate"].startswith("Basic")
        assert response.json()["accepted"] == ["Basic"]
        # The session is not accepted any more.
        assert people.client("viewer").get(f"{API}/runs/").status_code == 401


def test_anonymous_posts_are_401_too() -> None:
    client = Client(enforce_csrf_checks=True)
    posts = ("/snapshots/x/fork/", "/approvals/x/approve/", "/approvals/x/reject/")
    for url in (*posts, "/runs/x/cancel/", "/runs/x/messages/"):
        response = client.post(API + url, {}, content_type="application/json")
        assert response.status_code == 401, url


def test_a_bad_token_is_401(people: People) -> None:
    client = Client(headers={"Authorization": "Token nope"})
    response = client.get(f"{API}/runs/")
    assert response.status_code == 401
    body = response.json()
    assert (body["code"], body["detail"]) == ("authentication_failed", "Invalid token.")
    assert body["accepted"] == ["Token", "Basic", "Session"]


def test_token_and_session_authentication(people: People) -> None:
    assert token_client(people.viewer).get(f"{API}/runs/").status_code == 200
    assert people.client("viewer").get(f"{API}/runs/").status_code == 200


def test_options_and_head_work_everywhere(refunds: Any, people: People) -> None:
    approval = pending(refunds)
    client = token_client(people.admin)
    urls = [
        *ALL_GETS,
        f"/runs/{approval.coordination_id}/",
        f"/runs/{approval.coordination_id}/messages/",
        f"/runs/{approval.coordination_id}/events/",
        f"/snapshots/{approval.snapshot_id}/",
        f"/snapshots/{approval.snapshot_id}/fork/",
        f"/approvals/{approval.pk}/",
        f"/approvals/{approval.pk}/approve/",
    ]
    for url in urls:
        assert client.options(API + url).status_code == 200, url
        assert client.delete(API + url).status_code == 405, url
    assert client.head(f"{API}/runs/").status_code == 200


def test_the_root_links_everything(people: People) -> None:
    body = people.client("carol").get(f"{API}/").json()
    assert body == {
        "runs": "http://testserver/api/v1/runs/",
        "snapshots": "http://testserver/api/v1/snapshots/",
        "approvals": "http://testserver/api/v1/approvals/",
        "my_approvals": "http://testserver/api/v1/approvals/mine/",
        "schema": "http://testserver/api/v1/schema/",
        "docs": "http://testserver/api/v1/docs/",
        "redoc": "http://testserver/api/v1/redoc/",
    }


# -- runs ------------------------------------------------------------------------------


def _runs(client: Client, query: str = "") -> Any:
    response = client.get(f"{API}/runs/{query}")
    assert response.status_code == 200, response.content
    return response.json()


def test_runs_newest_updated_first_with_filters(refunds: Any, people: People) -> None:
    waiting = pending(refunds).coordination_id
    completed = refunds.start({"amount": 5}).coordination_id
    other = WorkflowRun.objects.create(
        coordination_id="legacy-1",
        workflow_name="legacy",
        status="failed",
        failure_reason="boom",
        created_at=timezone.now(),
        updated_at=timezone.now() - timedelta(days=1),
    ).coordination_id
    client = people.client("viewer")
    body = _runs(client)
    assert body["count"] == 3
    assert [r["coordination_id"] for r in body["results"]] == [completed, waiting, other]
    assert body["results"][2] == {
        "coordination_id": "legacy-1",
        "workflow": "legacy",
        "version": 1,
        "status": "failed",
        "last_step": "",
        "head_snapshot_id": None,
        "failure_reason": "boom",
        "wake_at": None,
        "waiting_topic": None,
        "parent": None,
        "created_at": body["results"][2]["created_at"],
        "updated_at": body["results"][2]["updated_at"],
    }
    assert [r["coordination_id"] for r in _runs(client, "?status=waiting")["results"]] == [waiting]
    assert [r["coordination_id"] for r in _runs(client, f"?workflow={WORKFLOW}")["results"]] == [
        completed,
        waiting,
    ]
    assert _runs(client, "?workflow=nope")["results"] == []
    paged = _runs(client, "?page_size=2")
    assert len(paged["results"]) == 2 and paged["next"].endswith("page=2&page_size=2")
    assert len(_runs(client, "?page_size=2&page=2")["results"]) == 1


def test_a_bad_run_filter_is_400(people: People) -> None:
    response = people.client("viewer").get(f"{API}/runs/?status=snoozing")
    assert response.status_code == 400
    assert field_errors(response.json()) == ["status"]
    assert people.client("viewer").get(f"{API}/runs/?page=9").status_code == 404


def test_run_detail(refunds: Any, people: People) -> None:
    approval = pending(refunds, coordination_id="order:42.v1")
    response = people.client("alice").get(f"{API}/runs/order:42.v1/")
    assert response.status_code == 200
    body = response.json()
    run = WorkflowRun.objects.get(pk="order:42.v1")
    assert body == {
        "coordination_id": "order:42.v1",
        "workflow": WORKFLOW,
        "version": 1,
        "status": "waiting",
        "last_step": "review",
        "head_snapshot_id": run.head_snapshot_id,
        "failure_reason": "",
        "wake_at": None,
        "waiting_topic": None,
        "parent": None,
        "created_at": body["created_at"],
        "updated_at": body["updated_at"],
        "pending_approvals": [str(approval.pk)],
    }
    assert run.head_snapshot_id == approval.snapshot_id
    # A viewer of runs who may not see approvals sees the run without them.
    viewer = people.client("viewer").get(f"{API}/runs/order:42.v1/").json()
    assert viewer["pending_approvals"] == []


def test_runs_of_an_approver_and_hidden_runs(refunds: Any, people: People) -> None:
    mine = pending(refunds).coordination_id
    unrelated = refunds.start({"amount": 5}).coordination_id
    for name in ("alice", "bob"):  # assignee, group member
        assert [r["coordination_id"] for r in _runs(people.client(name))["results"]] == [mine]
    assert _runs(people.client("carol"))["results"] == []
    response = people.client("alice").get(f"{API}/runs/{unrelated}/")
    assert response.status_code == 404
    assert response.json()["code"] == "run_not_found"
    assert people.client("carol").get(f"{API}/runs/{mine}/").status_code == 404
    assert people.client("viewer").get(f"{API}/runs/nope/").status_code == 404


def test_run_ids_with_slashes_are_not_addressable(people: People) -> None:
    assert people.client("viewer").get(f"{API}/runs/a/b/").status_code == 404


# -- cancel ----------------------------------------------------------------------------


def test_cancel_needs_the_permission_and_cancels_the_run_and_its_approval(
    refunds: Any, people: People
) -> None:
    from flowwarden_django.models import Approval, ApprovalEvent
    from tests.api.helpers import perms, post_json

    approval = pending(refunds, coordination_id="order:77")
    url = f"{API}/runs/order:77/cancel/"
    # Not visible to carol: 404; visible to the viewer, who may not cancel: 403.
    assert post_json(people.client("carol"), url, {}).status_code == 404
    refused = post_json(people.client("viewer"), url, {"reason": "no"})
    assert (refused.status_code, refused.json()["code"]) == (403, "cancel_forbidden")
    assert WorkflowRun.objects.get(pk="order:77").status == "waiting"
    # A bad body: 400 with the field's error, nothing changed.
    bad = post_json(people.client("admin"), url, {"reason": "x" * 1001})
    assert bad.status_code == 400 and field_errors(bad.json()) == ["reason"]
    assert WorkflowRun.objects.get(pk="order:77").status == "waiting"

    canceller = perms(people.viewer, "cancel_workflowrun")
    response = post_json(token_client(canceller), url, {"reason": "customer withdrew"})
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["failure_reason"]) == ("cancelled", "customer withdrew")
    assert body["pending_approvals"] == []
    approval.refresh_from_db()
    assert approval.status == Approval.Status.CANCELLED
    event = ApprovalEvent.objects.filter(approval=approval, action="cancelled").get()
    assert event.actor == "viewer"
    again = post_json(token_client(canceller), url, {})
    assert (again.status_code, again.json()["code"]) == (409, "run_finished")


def test_a_sleeping_run_shows_its_wake_time(people: People) -> None:
    import uuid

    from flowwarden_django.workflows import Workflow, sleep, step, workflow_registry

    name = f"api-sleepy-{uuid.uuid4().hex[:6]}"
    Workflow.define(name, [step("nap")(lambda s: sleep(s, timedelta(hours=2)))])
    try:
        started = Workflow.start(name, {})
        body = people.client("viewer").get(f"{API}/runs/{started.coordination_id}/").json()
    finally:
        workflow_registry.unregister(name)
    run = WorkflowRun.objects.get(pk=started.coordination_id)
    assert body["status"] == "sleeping"
    assert body["wake_at"].startswith(run.wake_at.isoformat()[:19])
