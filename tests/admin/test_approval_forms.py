"""The approvals admin and typed decision forms (issue 49): Approve on an approval's
page shows its form (with its initial data), refuses an invalid entry with the
form's errors and approves with the cleaned data; bulk approval skips typed
approvals; a form that no longer imports is a clear note, never a 500."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin import helpers
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from flowwarden_django.models import Approval
from flowwarden_django.workflows import Hibernated, workflow_registry
from tests.support.typed_refund_workflow import define_typed_refunds, seen_payloads

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = reverse("admin:flowwarden_django_approval_changelist")


def decision_url(approval: Approval, decision: str) -> str:
    return reverse(f"admin:flowwarden_django_approval_{decision}", args=[approval.pk])


@pytest.fixture
def typed() -> Any:
    yield define_typed_refunds("admin-typed-refund")
    workflow_registry.unregister("admin-typed-refund")


@pytest.fixture
def bob() -> Client:
    user = User.objects.create_user("bob", password="pw", is_staff=True)
    user.groups.add(Group.objects.create(name="finance"))
    client = Client()
    client.force_login(user)
    return client


def pending(definition: Any) -> Approval:
    started = definition.start({"order": 7, "total": "120.00"})
    assert isinstance(started.result, Hibernated)
    return Approval.objects.get(coordination_id=started.coordination_id)


def test_approve_shows_the_form_and_validates_it(typed: Any, bob: Client) -> None:
    approval = pending(typed)
    url = decision_url(approval, "approve")
    body = bob.get(url).content.decode()
    assert 'name="form-amount"' in body and 'value="120.00"' in body
    assert 'name="form-reason"' in body and 'name="payload"' not in body
    response = bob.post(url, {"post": "yes", "form-amount": "121", "form-reason": "late"})
    assert response.status_code == 200
    body = response.content.decode()
    assert "Please correct the error below." in body
    assert "At most the order&#x27;s total, 120.00." in body and 'value="121"' in body
    assert Approval.objects.get(pk=approval.pk).status == "pending"

    response = bob.post(url, {"post": "yes", "form-amount": "12.5", "form-reason": "damaged"})
    assert response.status_code == 302
    expected = {"amount": "12.5", "reason": "damaged", "refund_on": None}
    assert seen_payloads == [expected]
    assert Approval.objects.get(pk=approval.pk).payload == expected


def test_reject_needs_no_form(typed: Any, bob: Client) -> None:
    approval = pending(typed)
    url = decision_url(approval, "reject")
    assert 'name="form-amount"' not in bob.get(url).content.decode()
    assert bob.post(url, {"post": "yes", "payload": '{"why": "no"}'}).status_code == 302
    assert Approval.objects.get(pk=approval.pk).payload == {"why": "no"}


def test_bulk_approval_skips_typed_approvals(typed: Any, bob: Client) -> None:
    approval = pending(typed)
    selected = {helpers.ACTION_CHECKBOX_NAME: [str(approval.pk)]}
    confirmation = bob.post(CHANGELIST, {"action": "approve_selected", "index": "0", **selected})
    assert "it has a decision form" in confirmation.content.decode()
    done = bob.post(
        CHANGELIST, {"action": "approve_selected", "post": "yes", **selected}, follow=True
    )
    assert done.status_code == 200 and "it has a decision form" in done.content.decode()
    assert Approval.objects.get(pk=approval.pk).status == "pending"


@pytest.mark.parametrize("path", ["tests.testapp.forms.GoneForm", "tests.testapp.forms.NotAForm"])
def test_a_form_that_no_longer_imports(typed: Any, bob: Client, path: str) -> None:
    approval = pending(typed)
    Approval.objects.filter(pk=approval.pk).update(form=path)
    url = decision_url(approval, "approve")
    response = bob.get(url)
    assert response.status_code == 200
    body = response.content.decode()
    assert "decision form cannot be loaded" in body and " disabled" in body
    response = bob.post(url, {"post": "yes", "form-amount": "1", "form-reason": "late"})
    assert (
        response.status_code == 200
        and "decision form cannot be loaded" in response.content.decode()
    )
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert (
        bob.get(reverse("admin:flowwarden_django_approval_change", args=[approval.pk])).status_code
        == 200
    )
    assert bob.post(decision_url(approval, "reject"), {"post": "yes"}).status_code == 302


@pytest.mark.parametrize(
    "data",
    [
        {"form-amount": "1" * 100_000, "form-reason": "late"},
        {"form-amount": "1\x00", "form-reason": "late\x00"},
        {"form-amount": "Infinity", "form-reason": "late"},
        {"form-amount": ["1", "2"], "form-reason": ["x", "late"]},
        {"form-amount": "5", "form-reason": "late", "form-refund_on": "0000-00-00"},
    ],
)
def test_hostile_entries_never_a_5xx(typed: Any, bob: Client, data: dict[str, Any]) -> None:
    approval = pending(typed)
    response = bob.post(decision_url(approval, "approve"), {"post": "yes", **data})
    assert response.status_code in (200, 302)
    if response.status_code == 200:
        assert Approval.objects.get(pk=approval.pk).status == "pending"


# -- issue 49, item 5: a typed approval is never decided in bulk, rejected neither ------


def test_bulk_rejection_skips_typed_approvals_with_a_message(typed: Any, bob: Client) -> None:
    approval = pending(typed)
    selected = {helpers.ACTION_CHECKBOX_NAME: [str(approval.pk)]}
    confirmation = bob.post(CHANGELIST, {"action": "reject_selected", "index": "0", **selected})
    assert "it has a decision form: decide it on its own page" in confirmation.content.decode()
    done = bob.post(
        CHANGELIST, {"action": "reject_selected", "post": "yes", **selected}, follow=True
    )
    body = done.content.decode()
    assert done.status_code == 200
    assert "Skipped “Refund order 7?”: it has a decision form: decide it on its own page." in body
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert not approval.events.filter(action__in=["rejected", "refused"]).exists()
