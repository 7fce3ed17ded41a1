"""The approver's inbox (``flowwarden_django.inbox``): pages for non-staff deciders.

Through Django's test client: the login page, "my approvals" and its filters, one
approval's page with its state, deciding it (and the run going on), the refusals (a
non-decider sees no form and gets 403 on POST; a stranger gets 404; bad JSON is a
form error). ``tests/inbox/test_inbox_browser.py`` does the same in Chromium.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from flowwarden_django.models import Approval, WorkflowRun
from flowwarden_django.workflows import (
    RunStatus,
    Workflow,
    await_approval,
    done,
    step,
    workflow_registry,
)
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore

pytestmark = pytest.mark.django_db(transaction=True)

INBOX = "/approvals/"
WORKFLOW = "inbox-refund"


@step
def review(state: dict[str, Any]) -> Any:
    return await_approval({**state, "checked": True}, f"Refund {state['amount']}?", group="finance")


@step
def settle(state: dict[str, Any], ctx: Any) -> Any:
    decision = ctx.decision
    return done({**state, "outcome": decision.decision, "payload": decision.payload})


@pytest.fixture
def refunds() -> Any:
    definition = Workflow.define(WORKFLOW, [review, settle], OrmSnapshotStore())
    yield definition
    workflow_registry.unregister(WORKFLOW)


@pytest.fixture
def people() -> dict[str, User]:
    finance = Group.objects.create(name="finance")
    bob = User.objects.create_user("bob", password="pw")  # not staff
    bob.groups.add(finance)
    return {"bob": bob, "carol": User.objects.create_user("carol", password="pw")}


def pending(definition: Any, amount: int = 120) -> Approval:
    cid = f"refund-{uuid.uuid4().hex[:8]}"
    definition.workflow(cid).run({"amount": amount})
    return Approval.objects.get(coordination_id=cid)


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_anonymous_users_are_sent_to_the_inbox_login(refunds):
    response = Client().get(INBOX)
    assert response.status_code == 302
    assert response["Location"] == f"{INBOX}login/?next={INBOX}"
    login = Client().get(f"{INBOX}login/")
    assert login.status_code == 200 and b'id="login-form"' in login.content


def test_a_non_staff_approver_logs_in_and_sees_their_approvals(refunds, people):
    mine = pending(refunds, 120)
    client = Client()
    response = client.post(
        f"{INBOX}login/", {"username": "bob", "password": "pw", "next": INBOX}, follow=True
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert "My approvals" in page and "Refund 120?" in page
    assert f"{INBOX}{mine.pk}/" in page
    assert "Signed in as <strong>bob</strong>" in page


def test_filters_by_status_workflow_and_text(refunds, people):
    first, second = pending(refunds, 120), pending(refunds, 999)
    client = logged_in(people["bob"])
    assert "Refund 999?" in client.get(INBOX, {"q": "999"}).content.decode()
    assert "Refund 120?" not in client.get(INBOX, {"q": "999"}).content.decode()
    assert "Nothing waits" in client.get(INBOX, {"workflow": "other"}).content.decode()
    client.post(f"{INBOX}{first.pk}/", {"approve": "Approve"}, follow=True)  # its message shown
    pending_page = client.get(INBOX).content.decode()
    assert "Refund 120?" not in pending_page and "Refund 999?" in pending_page
    approved = client.get(INBOX, {"status": "approved"}).content.decode()
    assert "Refund 120?" in approved and "Refund 999?" not in approved
    assert second.status == Approval.Status.PENDING
    # A bad filter value is ignored, not an error.
    assert client.get(INBOX, {"status": "nonsense"}).status_code == 200


def test_deciding_on_the_approval_page_continues_the_run(refunds, people):
    approval = pending(refunds)
    client = logged_in(people["bob"])
    page = client.get(f"{INBOX}{approval.pk}/").content.decode()
    assert "Refund 120?" in page and "&quot;checked&quot;: true" in page  # the state
    assert 'name="approve"' in page and 'name="reject"' in page

    response = client.post(
        f"{INBOX}{approval.pk}/",
        {"reject": "Reject", "comment": "too much", "payload": '{"note": "call them"}'},
        follow=True,
    )
    assert response.status_code == 200
    assert "Rejected: Refund 120?" in response.content.decode()
    decided = Approval.objects.get(pk=approval.pk)
    assert (decided.status, decided.decided_by, decided.comment) == ("rejected", "bob", "too much")
    run = WorkflowRun.objects.get(pk=approval.coordination_id)
    assert run.status == RunStatus.COMPLETED
    final = refunds.workflow(approval.coordination_id).current_result().final_state
    assert (final["outcome"], final["payload"]) == ("rejected", {"note": "call them"})
    # Decided: no form any more.
    assert 'name="approve"' not in client.get(f"{INBOX}{approval.pk}/").content.decode()


def test_bad_input_is_a_form_error_and_decides_nothing(refunds, people):
    approval = pending(refunds)
    client = logged_in(people["bob"])
    for data, error in [
        ({"approve": "1", "payload": "{nope"}, "not valid JSON"),
        ({"approve": "1", "payload": '{"x": "\\u0000"}'}, "NUL"),
        # A payload is a JSON object, through the API's validator: no list, no 500.
        ({"approve": "1", "payload": "[1, 2]"}, "must be a JSON object, not an array"),
        ({"reject": "1", "payload": '"text"'}, "must be a JSON object, not a string"),
        ({"approve": "1", "payload": '{"a":' * 2000 + "1" + "}" * 2000}, "nests"),
        ({"approve": "1", "payload": "[" * 2000 + "]" * 2000}, "nests"),
        ({"approve": "1", "payload": '{"x": NaN}'}, "numbers must be finite"),
        ({"comment": "x"}, "Choose Approve or Reject."),
        ({"approve": "1", "comment": "x" * 2001}, "at most 2000"),
    ]:
        response = client.post(f"{INBOX}{approval.pk}/", data)
        assert response.status_code == 400, data
        assert error in response.content.decode(), (data, error)
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.PENDING


def test_who_may_not_decide_gets_no_form_and_403(refunds, people):
    approval = pending(refunds)
    carol = people["carol"]
    client = logged_in(carol)
    # Not hers to see: 404, and nothing in her list.
    assert client.get(f"{INBOX}{approval.pk}/").status_code == 404
    assert client.post(f"{INBOX}{approval.pk}/", {"approve": "1"}).status_code == 404
    assert "Nothing waits" in client.get(INBOX).content.decode()
    assert not approval.events.filter(action="refused").exists()  # no trace of her
    # A viewer of every approval sees it, without a form, and may not decide it.
    from django.contrib.auth.models import Permission

    carol.user_permissions.add(Permission.objects.get(codename="view_approval"))
    client = logged_in(User.objects.get(pk=carol.pk))
    page = client.get(f"{INBOX}{approval.pk}/").content.decode()
    assert "Refund 120?" in page and 'name="approve"' not in page
    assert "may see this approval, but not decide it" in page
    assert client.post(f"{INBOX}{approval.pk}/", {"approve": "1"}).status_code == 403
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.PENDING
    # Refused and audited, as in the API and the admin.
    assert list(approval.events.filter(action="refused").values_list("actor", flat=True)) == [
        "carol"
    ]


def test_the_decided_page_shows_the_payload_escaped_and_indented(refunds, people):
    approval = pending(refunds)
    client = logged_in(people["bob"])
    payload = '{"note": "<script>alert(1)</script>", "refund": {"cents": 120}}'
    client.post(f"{INBOX}{approval.pk}/", {"approve": "1", "comment": "ok", "payload": payload})
    page = client.get(f"{INBOX}{approval.pk}/").content.decode()
    assert "Payload" in page and "<script>alert(1)" not in page
    assert (
        "{\n  &quot;note&quot;: &quot;&lt;script&gt;alert(1)&lt;/script&gt;&quot;,\n"
        "  &quot;refund&quot;: {\n    &quot;cents&quot;: 120\n  }\n}"
    ) in page
