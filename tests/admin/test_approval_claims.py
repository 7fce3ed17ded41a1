"""The approval admin's claim, release and reassign (issue 49): the page's buttons,
the reassign page, the changelist column, filter and actions, and the refusals."""

from __future__ import annotations

import pytest
from django.contrib.admin import helpers
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from flowwarden_django.models import Approval, ApprovalEvent
from tests.admin.test_approvals import (
    CHANGELIST,
    change_url,
    logged_in,
    page,
    pending,
    people,  # noqa: F401
    refunds,  # noqa: F401
)

pytestmark = pytest.mark.django_db(transaction=True)


def url(approval: Approval, name: str) -> str:
    return reverse(f"admin:flowwarden_django_approval_{name}", args=[approval.pk])


def manager() -> User:
    user = User.objects.create_user("meg", password="pw", is_staff=True)
    for codename in ("reassign_approval", "view_approval"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return User.objects.get(pk=user.pk)


def test_claim_and_release_buttons(refunds, people):  # noqa: F811
    _, approval = pending(refunds)
    bob, alice = logged_in(people["bob"]), logged_in(people["alice"])
    body = page(bob.get(change_url(approval)))
    assert f'action="{url(approval, "claim")}"' in body and "flowwarden-release" not in body
    response = bob.post(url(approval, "claim"), follow=True)
    assert "Claimed “Refund 500?”." in page(response)
    body = page(bob.get(change_url(approval)))
    assert f'action="{url(approval, "release")}"' in body and "flowwarden-approve" in body
    assert "flowwarden-reassign" not in body  # bob may not reassign

    body = page(alice.get(change_url(approval)))  # held by bob: no decision, no claim
    assert "flowwarden-approve" not in body and "flowwarden-claim" not in body
    assert "bob" in body
    refused = page(alice.post(url(approval, "claim"), follow=True))
    assert "someone else claimed it" in refused
    assert alice.post(url(approval, "release")).status_code == 302  # refused, told
    assert Approval.objects.get(pk=approval.pk).claimed_by == "bob"
    assert bob.get(url(approval, "claim")).status_code == 302  # GET changes nothing
    bob.post(url(approval, "release"))
    assert Approval.objects.get(pk=approval.pk).claimed_by == ""
    assert logged_in(people["carol"]).post(url(approval, "claim")).status_code == 302
    assert Approval.objects.get(pk=approval.pk).claimed_by == ""  # carol cannot see it
    actions = ApprovalEvent.objects.filter(approval_id=approval.pk).values_list("action", "actor")
    assert list(actions.order_by("at", "pk"))[1:] == [("claimed", "bob"), ("released", "bob")]


def test_reassign_page(refunds, people):  # noqa: F811
    _, approval = pending(refunds)
    logged_in(people["bob"]).post(url(approval, "claim"))
    assert logged_in(people["bob"]).get(url(approval, "reassign")).status_code == 403
    client = logged_in(manager())
    body = page(client.get(change_url(approval)))
    assert f'href="{url(approval, "reassign")}"' in body
    assert f'action="{url(approval, "release")}"' in body  # anyone's claim
    form = client.get(url(approval, "reassign"))
    assert form.status_code == 200 and 'value="alice"' in page(form)
    assert "It is claimed by bob now." in page(form)
    for bad in (
        {"to_users": "", "to_group": ""},
        {"to_users": "nobody"},
        {"to_group": "no-such"},
        {"to_users": "x" * 200},
        {"to_users": "carol", "comment": "a\x00b"},
        {"to_users": ",".join(f"u{i}" for i in range(101))},
    ):
        response = client.post(url(approval, "reassign"), bad)
        body = page(response)
        assert response.status_code == 200, bad
        assert "errornote" in body or "errorlist" in body, bad
    response = client.post(
        url(approval, "reassign"), {"to_users": "carol, alice", "comment": "cover"}, follow=True
    )
    assert "Reassigned “Refund 500?”." in page(response)
    approval.refresh_from_db()
    assert approval.assignees == ["alice", "carol"] and approval.group == ""
    assert approval.claimed_by == ""
    event = ApprovalEvent.objects.get(approval_id=approval.pk, action="reassigned")
    assert event.actor == "meg" and event.comment == "cover"


def test_changelist_column_filter_and_actions(admin_client, refunds, people):  # noqa: F811
    _, first = pending(refunds)
    _, second = pending(refunds, amount=600)
    bob = logged_in(people["bob"])
    selected = {helpers.ACTION_CHECKBOX_NAME: [str(first.pk), str(second.pk)]}
    response = bob.post(CHANGELIST, {"action": "claim_selected", "index": "0", **selected})
    assert response.status_code == 302
    assert set(Approval.objects.values_list("claimed_by", flat=True)) == {"bob"}
    body = page(admin_client.get(CHANGELIST))
    assert "Claimed by" in body and 'title="bob"' in body
    assert 'value="claim_selected"' in body and 'value="release_selected"' in body
    assert page(bob.get(CHANGELIST, {"claimed": "me"})).count('title="bob"') == 2
    assert "0 approvals" in page(admin_client.get(CHANGELIST, {"claimed": "no"}))
    alice = logged_in(people["alice"])
    response = alice.post(
        CHANGELIST, {"action": "release_selected", "index": "0", **selected}, follow=True
    )
    assert "someone else claimed it" in page(response)
    assert set(Approval.objects.values_list("claimed_by", flat=True)) == {"bob"}
    bob.post(CHANGELIST, {"action": "release_selected", "index": "0", **selected})
    assert set(Approval.objects.values_list("claimed_by", flat=True)) == {""}
