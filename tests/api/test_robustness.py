"""The REST API: inputs that only fail when written or queried become 400/404, never
500, on SQLite and on PostgreSQL (NUL characters, unpaired surrogates, deep nesting,
forged cursors, out-of-range dates)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from flowwarden_django.models import Approval, SnapshotRecord, WorkflowMessage
from tests.api.helpers import (
    API,
    field_errors,
    make_people,
    pending,
    postgres_lane,
    token_client,
)

pytest_plugins = ["tests.api.helpers"]  # the refunds and on_lane fixtures
pytestmark = pytest.mark.django_db(transaction=True)

LANES = [pytest.param("sqlite", id="sqlite"), postgres_lane()]

BAD_BODIES = [
    '{"state": "a\\u0000b"}',
    '{"state": {"k\\u0000": 1}}',
    '{"state": "\\ud800"}',
    '{"payload": {"a": "\\udfff"}, "state": 1}',
    "[" * 100_000 + "]" * 100_000,
]


def cursor(mark: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(mark).encode()).decode()


FORGED_CURSORS = [
    cursor({"id": "a", "c": "b", "s": 10**30, "t": "2030-01-01T00:00:00+00:00"}),
    cursor({"id": "a", "c": "b", "s": -1, "t": "2030-01-01T00:00:00+00:00"}),
    cursor({"id": 5, "c": "b", "s": 1, "t": "2030-01-01T00:00:00+00:00"}),
    cursor({"id": "a", "c": "b", "s": 1, "t": "2030-01-01T00:00:00"}),
    cursor({"id": "a", "c": "b" * 300, "s": 1, "t": "2030-01-01T00:00:00+00:00"}),
    cursor({"id": "a", "s": 1}),
    cursor([1]),
    "%%%",
]


@pytest.mark.parametrize("lane", LANES)
def test_unstorable_bodies_are_400(lane: str, on_lane: None, refunds: Any) -> None:
    people = make_people()
    approval = pending(refunds)
    client = token_client(people.admin)
    for url in (
        f"{API}/snapshots/{approval.snapshot_id}/fork/",
        f"{API}/approvals/{approval.pk}/approve/",
        f"{API}/approvals/{approval.pk}/reject/",
        f"{API}/runs/{approval.coordination_id}/messages/",
    ):
        for body in BAD_BODIES:
            response = client.post(url, body, content_type="application/json")
            assert response.status_code == 400, (url, body[:30], response.content)
            assert response.json()["code"] == "parse_error"
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert SnapshotRecord.objects.filter(coordination_id=approval.coordination_id).count() == 2
    assert not WorkflowMessage.objects.exists()


@pytest.mark.parametrize("lane", LANES)
def test_odd_queries_are_400_or_404(lane: str, on_lane: None, refunds: Any) -> None:
    people = make_people()
    pending(refunds)
    client = token_client(people.admin)
    for forged in FORGED_CURSORS:
        response = client.get(f"{API}/snapshots/?cursor={forged}")
        assert response.status_code == 400, forged
        assert response.json()["cursor"] == ["Invalid cursor."]
        assert field_errors(response.json()) == ["cursor"]
    for url, status in [
        ("/runs/%00/", 404),
        ("/runs/" + "x" * 300 + "/", 404),
        ("/approvals/%00/", 404),
        ("/snapshots/%00/", 404),
        ("/snapshots/%00/fork/", 405),  # GET: not allowed before anything is looked up
        ("/runs/?workflow=%00", 400),
        ("/runs/%00/messages/", 404),
        ("/runs/" + "x" * 300 + "/events/", 404),
        ("/runs/x/messages/?topic=%00", 404),  # the run first
        ("/runs/?page=0", 404),
        ("/approvals/?coordination=%00", 400),
        ("/snapshots/?agent=%00", 400),
        ("/snapshots/?since=0001-01-01T00:00:00%2B01:00", 400),
        ("/snapshots/?until=9999-12-31T23:59:59-14:00", 400),
        ("/snapshots/?coordination=%ED%A0%80", 200),  # not UTF-8: read as U+FFFD
        ("/snapshots/?page_size=-3&coordination=x", 200),
    ]:
        assert client.get(API + url).status_code == status, url
    for url in (
        "/snapshots/%00/fork/",
        "/approvals/%00/approve/",
        "/approvals/%00/reject/",
        "/runs/%00/messages/",
    ):
        response = client.post(API + url, {"state": 1}, content_type="application/json")
        assert response.status_code == 404, url
