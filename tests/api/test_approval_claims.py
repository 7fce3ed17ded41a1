"""The REST API's claim, release and reassign of approvals (issue 49): statuses,
the claim in the representation, the list filters, and hostile inputs (never 5xx),
on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from flowwarden_django.models import Approval, ApprovalEvent
from tests.api.helpers import (
    API,
    People,
    field_errors,
    make_people,
    pending,
    perms,
    post_json,
    postgres_lane,
    token_client,
)

pytest_plugins = ["tests.api.helpers"]  # the people, refunds and on_lane fixtures
pytestmark = pytest.mark.django_db(transaction=True)

LANES = [pytest.param("sqlite", id="sqlite"), postgres_lane()]


def url(approval: Approval, what: str) -> str:
    return f"{API}/approvals/{approval.pk}/{what}/"


def ids(response: Any) -> list[str]:
    assert response.status_code == 200, response.content
    return [row["id"] for row in response.json()["results"]]


def test_claim_release_and_the_claimant_only_decision(refunds: Any, people: People) -> None:
    approval = pending(refunds)
    alice, bob = token_client(people.alice), token_client(people.bob)
    claimed = post_json(bob, url(approval, "claim"), {"comment": "on it"})
    assert claimed.status_code == 200, claimed.content
    assert claimed.json()["claimed_by"] == "bob" and claimed.json()["claimed_at"]
    assert post_json(bob, url(approval, "claim"), {}).status_code == 200  # again: no-op
    detail = alice.get(f"{API}/approvals/{approval.pk}/").json()
    assert detail["claimed_by"] == "bob" and detail["can_decide"] is False
    assert bob.get(f"{API}/approvals/{approval.pk}/").json()["can_decide"] is True

    taken = post_json(alice, url(approval, "claim"), {})
    assert taken.status_code == 409 and taken.json()["code"] == "approval_claimed"
    refused = post_json(alice, url(approval, "approve"), {"comment": "mine"})
    assert refused.status_code == 409 and refused.json()["code"] == "approval_claimed"
    not_hers = post_json(alice, url(approval, "release"), {})
    assert not_hers.status_code == 409 and not_hers.json()["code"] == "approval_claimed"

    released = bob.post(url(approval, "release"), content_type="application/json")  # no body
    assert released.status_code == 200 and released.json()["claimed_by"] is None
    assert post_json(alice, url(approval, "claim"), {}).status_code == 200
    assert post_json(alice, url(approval, "approve"), {}).status_code == 200
    late = post_json(bob, url(approval, "claim"), {})
    assert late.status_code == 409 and late.json()["code"] == "approval_already_decided"
    trail = list(
        ApprovalEvent.objects.filter(approval_id=approval.pk)
        .order_by("at", "pk")
        .values_list("action", "actor", "comment")
    )
    assert trail[1:] == [
        ("claimed", "bob", "on it"),
        ("refused", "alice", "mine"),
        ("released", "bob", ""),
        ("claimed", "alice", ""),
        ("approved", "alice", ""),
    ]


def test_who_may_claim_and_reassign(refunds: Any, people: People) -> None:
    approval = pending(refunds)
    carol, auditor = token_client(people.carol), token_client(people.auditor)
    for what in ("claim", "release", "reassign"):
        response = post_json(carol, url(approval, what), {"to_users": ["carol"]})
        assert response.status_code == 404, what  # carol cannot see it
    forbidden = post_json(auditor, url(approval, "claim"), {})  # sees it, may not decide
    assert forbidden.status_code == 403 and forbidden.json()["code"] == "approval_forbidden"
    body = {"to_users": ["carol"]}
    no_right = post_json(token_client(people.alice), url(approval, "reassign"), body)
    assert no_right.status_code == 403
    assert post_json(token_client(people.bob), url(approval, "claim"), {}).status_code == 200

    manager = perms(people.auditor, "reassign_approval")
    client = token_client(manager)
    moved = post_json(client, url(approval, "reassign"), {**body, "comment": "holiday"})
    assert moved.status_code == 200, moved.content
    assert moved.json()["assignees"] == ["carol"] and moved.json()["group"] == ""
    assert moved.json()["claimed_by"] is None
    event = ApprovalEvent.objects.get(approval_id=approval.pk, action="reassigned")
    assert event.actor == "auditor" and event.comment == "holiday"
    assert post_json(token_client(people.carol), url(approval, "claim"), {}).status_code == 200
    freed = post_json(client, url(approval, "release"), {})  # a reassigner frees anyone's
    assert freed.status_code == 200 and freed.json()["claimed_by"] is None
    to_group = post_json(client, url(approval, "reassign"), {"to_group": "finance"})
    assert to_group.status_code == 200 and to_group.json()["group"] == "finance"


def test_claim_filters(refunds: Any, people: People) -> None:
    first, second, third = pending(refunds), pending(refunds), pending(refunds)
    assert post_json(token_client(people.alice), url(first, "claim"), {}).status_code == 200
    assert post_json(token_client(people.bob), url(second, "claim"), {}).status_code == 200
    alice = token_client(people.alice)
    assert ids(alice.get(f"{API}/approvals/?claimed_by=me")) == [str(first.pk)]
    assert ids(alice.get(f"{API}/approvals/mine/?claimed_by=me")) == [str(first.pk)]
    assert ids(alice.get(f"{API}/approvals/?claimed_by=bob")) == [str(second.pk)]
    assert ids(alice.get(f"{API}/approvals/?unclaimed=true")) == [str(third.pk)]
    assert set(ids(alice.get(f"{API}/approvals/?unclaimed=false"))) == {
        str(first.pk),
        str(second.pk),
    }
    assert ids(alice.get(f"{API}/approvals/?claimed_by=nobody")) == []
    for bad in ("unclaimed=maybe", "claimed_by=" + "x" * 151, "claimed_by=a%00b"):
        response = alice.get(f"{API}/approvals/?{bad}")
        assert response.status_code == 400, (bad, response.content)


HOSTILE_REASSIGN_BODIES = [
    ({}, ["non_field_errors"]),
    ({"to_users": []}, ["non_field_errors"]),
    ({"to_users": "carol"}, ["to_users"]),
    ({"to_users": [["carol"]]}, ["to_users"]),
    ({"to_users": [{"a": 1}]}, ["to_users"]),
    ({"to_users": [None]}, ["to_users"]),
    ({"to_users": ["nobody"]}, ["to_users"]),
    ({"to_users": ["ca\x00rol"]}, ["to_users"]),
    ({"to_users": ["x" * 151]}, ["to_users"]),
    ({"to_users": [f"u{i}" for i in range(10_000)]}, ["to_users"]),
    ({"to_group": "no-such-group"}, ["to_group"]),
    ({"to_group": "fi\x00nance"}, ["to_group"]),
    ({"to_group": 5}, ["to_group"]),
    ({"to_group": ["finance"]}, ["to_group"]),
    ({"to_group": "finance", "comment": "a\x00b"}, ["comment"]),
    ({"to_group": "finance", "comment": "x" * 100_000}, ["comment"]),
    ([1, 2], ["non_field_errors"]),
]


@pytest.mark.parametrize("lane", LANES)
def test_hostile_inputs_are_never_5xx(lane: str, on_lane: None, refunds: Any) -> None:
    people = make_people()
    approval = pending(refunds)
    admin = token_client(people.admin)
    for body, fields in HOSTILE_REASSIGN_BODIES:
        response = post_json(admin, url(approval, "reassign"), body)
        assert response.status_code == 400, (str(body)[:60], response.content[:200])
        if "\\x00" in str(body):  # the parser refuses NUL anywhere in a body
            assert response.json()["code"] == "parse_error"
        else:
            assert field_errors(response.json()) == fields, str(body)[:60]
    for what in ("claim", "release"):
        for body in ('{"comment": "a\\u0000b"}', '{"comment": {"a": 1}}', "[1]", '"x"', "{"):
            response = admin.post(url(approval, what), body, content_type="application/json")
            assert response.status_code == 400, (what, body, response.content)
        for odd in (str(uuid.uuid4()), "not-a-uuid", "%00", "x" * 5000):
            response = post_json(admin, f"{API}/approvals/{odd}/{what}/", {})
            assert response.status_code == 404, (what, odd[:20], response.status_code)
    for query in ("claimed_by=a%00b", "claimed_by=" + "x" * 151, "unclaimed=%00", "unclaimed=1"):
        for listing in ("", "mine/"):
            response = admin.get(f"{API}/approvals/{listing}?{query}")
            assert response.status_code == 400, (listing, query[:30], response.status_code)
    approval.refresh_from_db()
    assert approval.assignees == ["alice"] and approval.claimed_by == ""
    assert not ApprovalEvent.objects.filter(
        approval_id=approval.pk, action__in=["claimed", "released", "reassigned"]
    ).exists()
    response = post_json(admin, url(approval, "reassign"), {"to_users": ["bob", "bob", "carol"]})
    assert response.status_code == 200 and response.json()["assignees"] == ["bob", "carol"]


def test_a_session_claim_needs_its_csrf_token(refunds: Any, people: People) -> None:
    approval = pending(refunds)
    session = people.client("admin", csrf=True)
    assert post_json(session, url(approval, "claim"), {}).status_code == 403
    assert Approval.objects.get(pk=approval.pk).claimed_by == ""
