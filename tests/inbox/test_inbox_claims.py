"""The inbox's claim and release buttons and its "assigned to me" / "unclaimed"
filter (issue 49), through Django's test client."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth.models import Group, Permission, User

from flowwarden_django.models import Approval, ApprovalEvent
from tests.inbox.test_inbox import INBOX, logged_in, pending, refunds  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def people() -> dict[str, User]:
    finance = Group.objects.create(name="finance")
    made = {name: User.objects.create_user(name, password="pw") for name in ("bob", "ann", "carol")}
    for name in ("bob", "ann"):
        made[name].groups.add(finance)
    manager = User.objects.create_user("meg", password="pw")
    manager.groups.add(finance)
    manager.user_permissions.add(Permission.objects.get(codename="reassign_approval"))
    made["meg"] = User.objects.get(pk=manager.pk)
    return made


def test_claim_then_only_the_claimant_decides(refunds, people):  # noqa: F811
    approval = pending(refunds)
    bob, ann = logged_in(people["bob"]), logged_in(people["ann"])
    page = bob.get(f"{INBOX}{approval.pk}/").content.decode()
    assert 'name="claim"' in page and 'name="release"' not in page

    response = bob.post(f"{INBOX}{approval.pk}/claim/", follow=True)
    assert (
        response.status_code == 200 and "Claimed: only you decide it" in response.content.decode()
    )
    page = bob.get(f"{INBOX}{approval.pk}/").content.decode()
    assert 'name="release"' in page and 'name="approve"' in page and 'name="claim"' not in page

    page = ann.get(f"{INBOX}{approval.pk}/").content.decode()
    assert "bob claimed this approval" in page
    assert 'name="approve"' not in page and 'name="claim"' not in page
    taken = ann.post(f"{INBOX}{approval.pk}/claim/", follow=True).content.decode()
    assert "Not done" in taken and "claimed by bob" in taken
    refused = ann.post(f"{INBOX}{approval.pk}/", {"approve": "Approve"}, follow=True)
    assert "claimed by bob" in refused.content.decode()
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.PENDING
    assert ApprovalEvent.objects.filter(approval_id=approval.pk, action="refused").count() == 1

    bob.post(f"{INBOX}{approval.pk}/release/")
    assert Approval.objects.get(pk=approval.pk).claimed_by == ""
    ann.post(f"{INBOX}{approval.pk}/claim/")
    ann.post(f"{INBOX}{approval.pk}/", {"approve": "Approve"})
    assert Approval.objects.get(pk=approval.pk).decided_by == "ann"


def test_a_manager_releases_anyones_claim(refunds, people):  # noqa: F811
    approval = pending(refunds)
    logged_in(people["bob"]).post(f"{INBOX}{approval.pk}/claim/")
    page = logged_in(people["meg"]).get(f"{INBOX}{approval.pk}/").content.decode()
    assert "Release the claim of bob" in page
    logged_in(people["meg"]).post(f"{INBOX}{approval.pk}/release/")
    event = ApprovalEvent.objects.get(approval_id=approval.pk, action="released")
    assert event.actor == "meg" and event.payload == {"claimed_by": "bob"}


def test_refusals(refunds, people):  # noqa: F811
    approval = pending(refunds)
    carol = logged_in(people["carol"])
    assert carol.post(f"{INBOX}{approval.pk}/claim/").status_code == 404
    assert carol.post(f"{INBOX}{uuid.uuid4()}/claim/").status_code == 404
    assert logged_in(people["bob"]).get(f"{INBOX}{approval.pk}/claim/").status_code == 405
    from django.test import Client

    anonymous = Client().post(f"{INBOX}{approval.pk}/claim/")
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    assert Approval.objects.get(pk=approval.pk).claimed_by == ""


def test_assigned_to_me_and_unclaimed_filters(refunds, people):  # noqa: F811
    mine, theirs, free = pending(refunds, 101), pending(refunds, 202), pending(refunds, 303)
    bob = logged_in(people["bob"])
    bob.post(f"{INBOX}{mine.pk}/claim/")
    logged_in(people["ann"]).post(f"{INBOX}{theirs.pk}/claim/")
    assigned = bob.get(INBOX, {"claim": "mine"}).content.decode()
    assert "Refund 101?" in assigned and "Refund 202?" not in assigned
    assert "Refund 303?" not in assigned
    unclaimed = bob.get(INBOX, {"claim": "unclaimed"}).content.decode()
    assert "Refund 303?" in unclaimed and "Refund 101?" not in unclaimed
    assert "Refund 202?" not in unclaimed
    everything = bob.get(INBOX).content.decode()
    assert all(f"Refund {n}?" in everything for n in (101, 202, 303))
    assert "claimed by ann" in everything
    assert bob.get(INBOX, {"claim": "bogus\x00"}).status_code == 200  # ignored
    assert free.claimed_by == ""
