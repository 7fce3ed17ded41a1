"""The inbox and typed decision forms (issue 49): the approval page shows the
approval's form with its initial data, an invalid entry shows the form's errors and
keeps what was typed, a valid one approves with the cleaned data; a form that no
longer imports is a clear note on the page, never a 500."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from flowwarden_django.models import Approval
from flowwarden_django.workflows import Hibernated, workflow_registry
from tests.support.typed_refund_workflow import define_typed_refunds, seen_payloads

pytestmark = pytest.mark.django_db(transaction=True)

INBOX = "/approvals/"


@pytest.fixture
def typed() -> Any:
    yield define_typed_refunds("inbox-typed-refund")
    workflow_registry.unregister("inbox-typed-refund")


@pytest.fixture
def bob() -> Client:
    user = User.objects.create_user("bob", password="pw")  # not staff
    user.groups.add(Group.objects.create(name="finance"))
    client = Client()
    client.force_login(user)
    return client


def pending(definition: Any) -> Approval:
    started = definition.start({"order": 7, "total": "120.00"})
    assert isinstance(started.result, Hibernated)
    return Approval.objects.get(coordination_id=started.coordination_id)


def test_the_page_shows_the_form_with_its_initial_data(typed: Any, bob: Client) -> None:
    approval = pending(typed)
    page = bob.get(f"{INBOX}{approval.pk}/").content.decode()
    assert 'name="form-amount"' in page and 'value="120.00"' in page
    assert 'name="form-reason"' in page and "Arrived late" in page
    assert "Why the refund is granted." in page
    assert 'name="payload"' not in page  # the form takes the JSON payload's place
    assert 'name="approve"' in page


def test_an_invalid_entry_shows_the_errors_and_keeps_it(typed: Any, bob: Client) -> None:
    approval = pending(typed)
    url = f"{INBOX}{approval.pk}/"
    response = bob.post(
        url, {"approve": "1", "form-amount": "500", "form-reason": "late", "comment": "hm"}
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert "At most the order&#x27;s total, 120.00." in page
    assert re.search(
        r"name=\"form-amount\"[^>]*value=\"500\"|value=\"500\"[^>]*name=\"form-amount\"", page
    )
    assert "hm</textarea>" in page  # entries kept
    response = bob.post(url, {"approve": "1", "form-amount": "x", "form-reason": "bored"})
    assert response.status_code == 400
    assert "Enter a number." in response.content.decode()
    assert "Select a valid choice." in response.content.decode()
    assert Approval.objects.get(pk=approval.pk).status == "pending"

    response = bob.post(
        url,
        {"approve": "1", "form-amount": "99.50", "form-reason": "late", "form-refund_on": ""},
    )
    assert response.status_code == 302
    expected = {"amount": "99.50", "reason": "late", "refund_on": None}
    assert seen_payloads == [expected]
    assert Approval.objects.get(pk=approval.pk).payload == expected


def test_rejecting_needs_no_form(typed: Any, bob: Client) -> None:
    approval = pending(typed)
    response = bob.post(f"{INBOX}{approval.pk}/", {"reject": "1", "comment": "no"})
    assert response.status_code == 302
    assert Approval.objects.get(pk=approval.pk).status == "rejected"


@pytest.mark.parametrize("path", ["tests.testapp.forms.GoneForm", "os.system", "no such path"])
def test_a_form_that_no_longer_imports_is_a_clear_page(typed: Any, bob: Client, path: str) -> None:
    approval = pending(typed)
    Approval.objects.filter(pk=approval.pk).update(form=path)
    url = f"{INBOX}{approval.pk}/"
    response = bob.get(url)
    assert response.status_code == 200
    page = response.content.decode()
    assert "decision form cannot be loaded" in page and 'name="approve"' not in page
    response = bob.post(url, {"approve": "1", "form-amount": "1"})
    assert response.status_code == 400
    assert "decision form cannot be loaded" in response.content.decode()
    assert bob.post(url, {"reject": "1"}).status_code == 302


@pytest.mark.parametrize(
    "data",
    [
        {"form-amount": "1" * 100_000, "form-reason": "late"},
        {"form-amount": "1\x00", "form-reason": "late\x00"},
        {"form-amount": "NaN", "form-reason": "late"},
        {"form-amount": "1e999999", "form-reason": "late"},
        {"form-amount": ["1", "2"], "form-reason": ["late", "x"]},
        {"form-amount": "5", "form-reason": "late", "form-refund_on": "99999-99-99"},
    ],
)
def test_hostile_entries_never_a_5xx(typed: Any, bob: Client, data: dict[str, Any]) -> None:
    approval = pending(typed)
    response = bob.post(f"{INBOX}{approval.pk}/", {"approve": "1", **data})
    assert response.status_code in (302, 400), response.status_code
    if response.status_code == 302:  # the last of a list, say: then it is a valid entry
        assert Approval.objects.get(pk=approval.pk).status == "approved"
