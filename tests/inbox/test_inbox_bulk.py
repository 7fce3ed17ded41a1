"""Bulk approve and reject on the inbox's list (issue 49, item 5), through Django's
test client: each approval decided through the core (runs continue, audited); an
approval with a decision form is never decided in bulk (no checkbox, refused when
posted anyway); a non-decider decides nothing; an approval claimed by someone else
is skipped; more than ``MAX_BULK_IDS`` ids is a clear error; the filters are kept."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from flowwarden_django.inbox.bulk import MAX_BULK_IDS, MAX_SKIPPED_MESSAGES
from flowwarden_django.models import Approval, ApprovalEvent, WorkflowRun
from flowwarden_django.workflows import RunStatus, workflow_registry
from flowwarden_django.workflows.waiting.approvals import claim
from tests.inbox.test_inbox import INBOX, logged_in, pending, people, refunds  # noqa: F401
from tests.support.typed_refund_workflow import define_typed_refunds

pytestmark = pytest.mark.django_db(transaction=True)

BULK = f"{INBOX}bulk/"


@pytest.fixture
def typed() -> Any:
    yield define_typed_refunds("inbox-bulk-typed-refund")
    workflow_registry.unregister("inbox-bulk-typed-refund")


def typed_pending(definition: Any) -> Approval:
    started = definition.start({"order": 7, "total": "120.00"})
    return Approval.objects.get(coordination_id=started.coordination_id)


def bulk(client: Client, data: dict[str, Any], query: str = "") -> Any:
    """POST *data* to the bulk view and follow its redirect to the list (which shows,
    and so reads, its messages)."""
    response = client.post(f"{BULK}{query}", data, follow=True)
    assert response.redirect_chain[0][1] == 302, response.redirect_chain
    return response


def texts(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def statuses(*approvals: Approval) -> list[str]:
    return [Approval.objects.get(pk=a.pk).status for a in approvals]


def test_bulk_approve_of_three_continues_their_runs(refunds, people):  # noqa: F811
    approvals = [pending(refunds, n) for n in (10, 20, 30)]
    client = logged_in(people["bob"])
    page = client.get(INBOX).content.decode()
    assert page.count('name="ids"') == 3 and 'name="approve"' in page
    ids = [str(a.pk) for a in approvals]
    data = {"ids": ids, "approve": "1", "comment": "batch"}
    response = bulk(client, data, "?claim=unclaimed&due=&page=1&next=https://x")
    assert response.redirect_chain[0][0] == f"{INBOX}?claim=unclaimed&page=1"  # filters kept
    assert texts(response) == ["Approved 3 approvals."]
    for approval in approvals:
        decided = Approval.objects.get(pk=approval.pk)
        assert (decided.status, decided.decided_by, decided.comment) == ("approved", "bob", "batch")
        assert WorkflowRun.objects.get(pk=approval.coordination_id).status == RunStatus.COMPLETED
        # Audited as a decision on its page is.
        assert decided.events.filter(action="approved", actor="bob").count() == 1
    assert "Nothing waits" in client.get(INBOX).content.decode()


def test_bulk_reject_with_a_comment(refunds, people):  # noqa: F811
    first, second = pending(refunds, 1), pending(refunds, 2)
    client = logged_in(people["bob"])
    response = bulk(client, {"ids": [first.pk, second.pk], "reject": "1", "comment": "no"})
    assert response.redirect_chain[0][0] == INBOX and texts(response) == ["Rejected 2 approvals."]
    assert statuses(first, second) == ["rejected", "rejected"]
    final = refunds.workflow(first.coordination_id).current_result().final_state
    assert final["outcome"] == "rejected"


def test_a_typed_approval_is_never_decided_in_bulk(refunds, typed, people):  # noqa: F811
    plain = [pending(refunds, 1), pending(refunds, 2)]
    form_typed = typed_pending(typed)
    client = logged_in(people["bob"])
    page = client.get(INBOX).content.decode()
    assert page.count('name="ids"') == 2 and f'value="{form_typed.pk}"' not in page
    assert "needs its form" in page and f'href="{INBOX}{form_typed.pk}/"' in page
    for button in ("approve", "reject"):
        response = bulk(client, {"ids": [form_typed.pk], button: "1"})
        assert texts(response) == [
            "Skipped “Refund order 7?”: it needs its form: decide it on its own page."
        ]
    response = bulk(client, {"ids": [*(a.pk for a in plain), form_typed.pk], "approve": "1"})
    assert texts(response)[0] == "Approved 2 approvals."
    assert "it needs its form" in texts(response)[1]
    assert statuses(*plain, form_typed) == ["approved", "approved", "pending"]
    assert not form_typed.events.exclude(action__in=["requested", "assigned"]).exists()


def test_a_non_decider_decides_nothing(refunds, people):  # noqa: F811
    approvals = [pending(refunds, 1), pending(refunds, 2)]
    ids = [a.pk for a in approvals]
    carol = people["carol"]  # not in finance: she does not even see them
    response = bulk(logged_in(carol), {"ids": ids, "approve": "1"})
    assert all("no such approval, or not one of yours" in t for t in texts(response))
    assert statuses(*approvals) == ["pending", "pending"]
    assert not ApprovalEvent.objects.filter(actor="carol").exists()  # no trace of her

    carol.user_permissions.add(Permission.objects.get(codename="view_approval"))
    viewer = logged_in(User.objects.get(pk=carol.pk))
    assert 'name="ids"' not in viewer.get(INBOX, {"status": "all"}).content.decode()
    response = bulk(viewer, {"ids": ids, "approve": "1"})
    assert texts(response) == [
        "Skipped “Refund 1?”: you may not decide it.",
        "Skipped “Refund 2?”: you may not decide it.",
    ]
    assert statuses(*approvals) == ["pending", "pending"]
    # Refused and audited, as on the approval's page.
    assert ApprovalEvent.objects.filter(actor="carol", action="refused").count() == 2
    # Not logged in: the login page, nothing decided.
    anonymous = Client().post(BULK, {"ids": ids, "approve": "1"})
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    assert statuses(*approvals) == ["pending", "pending"]


def test_an_approval_claimed_by_someone_else_is_skipped(refunds, people):  # noqa: F811
    theirs, free = pending(refunds, 1), pending(refunds, 2)
    ann = User.objects.create_user("ann", password="pw")
    ann.groups.add(*people["bob"].groups.all())
    claim(theirs.pk, ann)
    client = logged_in(people["bob"])
    page = client.get(INBOX).content.decode()
    assert f'value="{theirs.pk}"' not in page and f'value="{free.pk}"' in page
    response = bulk(client, {"ids": [theirs.pk, free.pk], "approve": "1"})
    assert texts(response) == [
        "Approved 1 approval.",
        "Skipped “Refund 1?”: someone else claimed it: only they decide it.",
    ]
    assert statuses(theirs, free) == ["pending", "approved"]
    assert theirs.events.filter(action="refused", actor="bob").count() == 1


def test_more_than_the_limit_is_a_clear_error(refunds, people):  # noqa: F811
    approval = pending(refunds, 1)
    client = logged_in(people["bob"])
    ids = [approval.pk] + [uuid.uuid4() for _ in range(MAX_BULK_IDS)]
    response = bulk(client, {"ids": ids, "approve": "1"})
    assert texts(response) == [
        f"Select at most {MAX_BULK_IDS} approvals at a time ({MAX_BULK_IDS + 1} sent)."
    ]
    assert statuses(approval) == ["pending"]


def test_many_skipped_are_named_up_to_a_limit(refunds, people):  # noqa: F811
    approval = pending(refunds, 1)
    unknown = [uuid.uuid4() for _ in range(MAX_BULK_IDS - 1)]
    response = bulk(logged_in(people["bob"]), {"ids": [approval.pk, *unknown], "reject": "1"})
    said = texts(response)
    assert said[0] == "Rejected 1 approval." and len(said) == 1 + MAX_SKIPPED_MESSAGES + 1
    assert said[-1] == f"…and {MAX_BULK_IDS - 1 - MAX_SKIPPED_MESSAGES} more skipped."
    assert statuses(approval) == ["rejected"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"approve": "1"}, "Select at least one approval."),
        ({"ids": ["nope"], "approve": "1"}, "Not an approval id: nope"),
        ({"ids": [str(uuid.uuid4())]}, "Choose Approve selected or Reject selected."),
        ({"ids": [str(uuid.uuid4())], "approve": "1", "comment": "x" * 2001}, "2000"),
    ],
)
def test_bad_requests_decide_nothing(refunds, people, data, message):  # noqa: F811
    approval = pending(refunds, 1)
    response = bulk(logged_in(people["bob"]), data)
    assert any(message in text for text in texts(response)), texts(response)
    assert statuses(approval) == ["pending"]


def test_post_only_and_csrf_protected(refunds, people):  # noqa: F811
    approval = pending(refunds, 1)
    client = logged_in(people["bob"])
    assert client.get(BULK).status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(people["bob"])
    assert strict.post(BULK, {"ids": [approval.pk], "approve": "1"}).status_code == 403
    assert statuses(approval) == ["pending"]
    page = client.get(INBOX).content.decode()
    assert 'name="csrfmiddlewaretoken"' in page and f'action="{BULK}"' in page
