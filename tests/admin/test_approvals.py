"""The approvals admin, through the Django test client: who sees what, the audit
trail, and Approve / Reject (page buttons and changelist actions) through the core,
with their confirmation pages and refusals."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin import helpers
from django.contrib.auth.models import Group, Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from flowwarden_django.models import Approval, WorkflowRun
from flowwarden_django.workflows import (
    Hibernated,
    Workflow,
    await_approval,
    step,
    workflow_registry,
)
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.waiting.approvals import reject
from tests.support.refund_workflow import define_refunds, settle
from tests.support.refund_workflow import seen_decisions as SEEN

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = reverse("admin:flowwarden_django_approval_changelist")


def change_url(approval: Approval) -> str:
    return reverse("admin:flowwarden_django_approval_change", args=[approval.pk])


def decision_url(approval: Approval, decision: str) -> str:
    return reverse(f"admin:flowwarden_django_approval_{decision}", args=[approval.pk])


def run_url(cid: str) -> str:
    return reverse("admin:flowwarden_django_workflowrun_change", args=[cid])


def page(response: Any) -> str:
    return response.content.decode()


@pytest.fixture
def refunds() -> Any:
    """``review`` asks alice or the finance group when the amount is 100 or more;
    ``settle`` records the decision."""
    definition = define_refunds("refund", OrmSnapshotStore())
    yield definition
    workflow_registry.unregister("refund")


@pytest.fixture
def people() -> dict[str, User]:
    """alice (assignee), bob (in finance), carol (neither), victor (may view all),
    all staff without model permissions unless said."""
    finance = Group.objects.create(name="finance")
    made = {
        name: User.objects.create_user(name, password="pw", is_staff=True)
        for name in ("alice", "bob", "carol", "victor")
    }
    made["bob"].groups.add(finance)
    made["victor"].user_permissions.add(Permission.objects.get(codename="view_approval"))
    return made


@step("review")
def ask_zed(state: dict[str, Any]) -> Any:
    return await_approval(state, "Zed?", assignees=["zed"])


def pending(definition: Any, amount: int = 500, **extra: Any) -> tuple[str, Approval]:
    started = definition.start({"amount": amount, **extra})
    assert isinstance(started.result, Hibernated)
    approval = Approval.objects.get(coordination_id=started.coordination_id)
    return started.coordination_id, approval


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def run_action(client: Client, action: str, *approvals: Approval, **extra: Any) -> Any:
    """POST a changelist action, then its confirmation (``post=yes``)."""
    selected = {helpers.ACTION_CHECKBOX_NAME: [str(a.pk) for a in approvals]}
    confirmation = client.post(CHANGELIST, {"action": action, "index": "0", **selected})
    data = {"action": action, "post": "yes", **selected, **extra}
    return confirmation, client.post(CHANGELIST, data, follow=True)


class TestChangelist:
    def test_lists_approvals_with_filters(self, admin_client, refunds, people):
        cid, approval = pending(refunds)
        response = admin_client.get(CHANGELIST)
        assert response.status_code == 200
        body = page(response)
        assert "<h1>Select approval to view</h1>" in body
        for header in ("Prompt", "Coordination", "Status", "Who may decide", "Requested"):
            assert header in body
        assert '<span title="Refund 500?">Refund 500?</span>' in body  # the full prompt
        assert f'href="{change_url(approval)}' in body and "Refund 500?" in body
        short = cid[:11] + "…"  # cut to fit 1280 px; the whole id is the tooltip
        assert (
            f'href="{run_url(cid)}" class="flowwarden-run-link" title="{cid}">{short}</a>' in body
        )
        assert "alice, group <em>finance</em>" in body
        assert 'data-status="pending"' in body
        assert 'href="?status__exact=approved"' in body
        assert 'href="?workflow_name=refund"' in body
        assert 'value="approve_selected"' in body and 'value="reject_selected"' in body

    def test_non_superusers_see_only_what_they_may_decide(self, refunds, people):
        _, mine = pending(refunds)
        Workflow.define("other", [ask_zed, settle], OrmSnapshotStore())
        try:
            _, other = pending(workflow_registry.get("other"))
        finally:
            workflow_registry.unregister("other")

        def listed(user: User) -> set[str]:
            response = logged_in(user).get(CHANGELIST)
            assert response.status_code == 200
            return {str(a.pk) for a in response.context["cl"].result_list}

        assert listed(people["alice"]) == {str(mine.pk)}  # assignee
        assert listed(people["bob"]) == {str(mine.pk)}  # group
        assert listed(people["carol"]) == set()
        assert listed(people["victor"]) == {str(mine.pk), str(other.pk)}  # view_approval
        # Approvals one may not see are not there at all.
        response = logged_in(people["carol"]).get(change_url(mine), follow=True)
        assert "doesn\u2019t exist" in page(response)
        # A staff user with no permission still finds the page on the admin index.
        assert "Approvals" in page(logged_in(people["carol"]).get(reverse("admin:index")))

    def test_read_only(self, admin_client, refunds, people):
        _, approval = pending(refunds)
        assert admin_client.get(reverse("admin:flowwarden_django_approval_add")).status_code == 403
        response = admin_client.post(change_url(approval), {"status": "approved"})
        assert response.status_code == 403
        assert "delete_selected" not in page(admin_client.get(CHANGELIST))
        assert Approval.objects.get(pk=approval.pk).status == "pending"


class TestDetail:
    def test_shows_prompt_state_audit_and_buttons(self, client, refunds, people):
        cid, approval = pending(refunds)
        client.force_login(people["alice"])
        body = page(client.get(change_url(approval)))
        assert '<p class="flowwarden-prompt">Refund 500?</p>' in body
        assert "&quot;review&quot;: &quot;manual&quot;" in body  # the paused state
        assert f'href="{run_url(cid)}"' in body
        snapshot = reverse(
            "admin:flowwarden_django_workflowrun_snapshot", args=[cid, approval.snapshot_id]
        )
        assert f'href="{snapshot}"' in body
        assert 'id="flowwarden-audit"' in body and 'class="flowwarden-event-requested"' in body
        assert f'href="{decision_url(approval, "approve")}" class="flowwarden-approve"' in body
        assert f'href="{decision_url(approval, "reject")}" class="flowwarden-reject"' in body

    def test_a_future_expiry_reads_as_time_to_come(self, client, refunds, people):
        _, approval = pending(refunds, expires_in=2 * 86400 + 60)
        client.force_login(people["alice"])
        body = page(client.get(change_url(approval)))
        expires = body[body.index("field-expires_at_text") :]
        expires = expires[: expires.index("</time>")]
        assert "in 2\xa0days" in expires and "ago" not in expires, expires

    def test_a_decided_approval_has_no_expiry_to_come(self, client, refunds, people):
        _, approval = pending(refunds, expires_in=2 * 86400 + 60)
        reject(approval.pk, people["alice"], comment="no")
        client.force_login(people["alice"])
        body = page(client.get(change_url(approval)))
        expires = body[body.index("field-expires_at_text") :]
        assert "no longer applies: the approval is rejected" in expires[:800]
        listed = page(client.get(CHANGELIST))
        assert "expires" not in listed[listed.index('id="result_list"') :]

    def test_no_buttons_for_viewers_or_decided_approvals(self, client, refunds, people):
        _, approval = pending(refunds)
        client.force_login(people["victor"])
        body = page(client.get(change_url(approval)))
        assert "Refund 500?" in body and "/approve/" not in body and "/reject/" not in body
        reject(approval.pk, people["alice"], comment="too much")
        client.force_login(people["alice"])
        body = page(client.get(change_url(approval)))
        assert "/approve/" not in body and "/reject/" not in body
        assert 'class="flowwarden-event-rejected"' in body and "too much" in body


class TestApprove:
    def test_confirmation_then_approve_resumes_the_run(self, client, refunds, people):
        cid, approval = pending(refunds)
        client.force_login(people["alice"])
        url = decision_url(approval, "approve")
        confirmation = page(client.get(url))
        assert "<h1>Approve</h1>" in confirmation and 'class="breadcrumbs"' in confirmation
        # The question does not quote the prompt (which may end with "?" itself).
        assert "<strong>Approve the request below?" in confirmation
        assert 'name="comment"' in confirmation and 'name="payload"' in confirmation
        assert '<input type="hidden" name="post" value="yes">' in confirmation
        assert "&quot;amount&quot;: 500" in confirmation
        assert Approval.objects.get(pk=approval.pk).status == "pending"

        response = client.post(
            url, {"post": "yes", "comment": " ok ", "payload": '{"note": "vip"}'}, follow=True
        )
        assert response.redirect_chain == [(change_url(approval), 302)]
        body = page(response)
        assert (
            f'<li class="success">Approved “Refund 500?”. Run {cid} is completed now.</li>' in body
        )
        stored = Approval.objects.get(pk=approval.pk)
        assert stored.status == "approved" and stored.decided_by == "alice"
        assert (stored.comment, stored.payload) == ("ok", {"note": "vip"})
        assert WorkflowRun.objects.get(pk=cid).status == "completed"
        assert SEEN[0].approved and SEEN[0].payload == {"note": "vip"}
        # The audit trail on the page; the decision in the admin history.
        assert 'class="flowwarden-event-approved"' in body and "<td>alice</td>" in body
        history = reverse("admin:flowwarden_django_approval_history", args=[approval.pk])
        assert "Approved from the admin." in page(client.get(history))

    def test_invalid_payload_decides_nothing(self, client, refunds, people):
        _, approval = pending(refunds)
        client.force_login(people["bob"])
        url = decision_url(approval, "approve")
        response = client.post(url, {"post": "yes", "comment": "c", "payload": "{nope"})
        assert response.status_code == 200
        body = page(response)
        assert (
            '<ul class="errorlist" id="id_payload_error"><li>The payload is not valid JSON:' in body
        )
        assert "{nope</textarea>" in body and "\nc</textarea>" in body
        assert Approval.objects.get(pk=approval.pk).status == "pending"

    def test_conflict_is_a_message_not_an_error(self, client, refunds, people):
        _, approval = pending(refunds)
        reject(approval.pk, people["alice"])
        client.force_login(people["bob"])
        response = client.post(decision_url(approval, "approve"), {"post": "yes"}, follow=True)
        assert response.status_code == 200
        assert (
            '<li class="error">Could not approve “Refund 500?”: it was already rejected.</li>'
            in page(response)
        )
        assert Approval.objects.get(pk=approval.pk).status == "rejected"
        assert approval.events.filter(action="refused", actor="bob").exists()
        # Opening the decision page of a decided approval says so.
        response = client.get(decision_url(approval, "reject"), follow=True)
        assert "This approval is rejected: there is nothing to decide." in page(response)

    def test_expired_is_a_message(self, client, refunds, people):
        _, approval = pending(refunds, expires_in=60)
        Approval.objects.filter(pk=approval.pk).update(
            expires_at=timezone.now() - timedelta(seconds=1)
        )
        client.force_login(people["alice"])
        response = client.post(decision_url(approval, "approve"), {"post": "yes"}, follow=True)
        assert "Could not approve “Refund 500?”: it expired before it was decided." in page(
            response
        )
        assert Approval.objects.get(pk=approval.pk).status == "expired"

    def test_the_same_decision_again_changes_nothing(self, client, refunds, people):
        _, approval = pending(refunds)
        client.force_login(people["alice"])
        url = decision_url(approval, "approve")
        client.post(url, {"post": "yes"})
        response = client.post(url, {"post": "yes"}, follow=True)
        assert "“Refund 500?” was already approved: nothing changed." in page(response)
        assert len(SEEN) == 1

    def test_non_deciders_are_refused(self, client, refunds, people):
        _, approval = pending(refunds)
        client.force_login(people["victor"])  # sees everything, decides nothing
        for decision in ("approve", "reject"):
            assert client.get(decision_url(approval, decision)).status_code == 403
            response = client.post(decision_url(approval, decision), {"post": "yes"})
            assert response.status_code == 403
        assert 'name="action"' not in page(client.get(CHANGELIST))
        run_action(client, "approve_selected", approval)
        assert Approval.objects.get(pk=approval.pk).status == "pending"

    def test_csrf_is_required(self, refunds, people):
        _, approval = pending(refunds)
        client = Client(enforce_csrf_checks=True)
        client.force_login(people["alice"])
        response = client.post(decision_url(approval, "approve"), {"post": "yes"})
        assert response.status_code == 403
        assert Approval.objects.get(pk=approval.pk).status == "pending"


class TestActions:
    def test_reject_selected_with_a_comment(self, client, refunds, people):
        first_cid, first = pending(refunds, amount=300)
        second_cid, second = pending(refunds, amount=400)
        client.force_login(people["bob"])
        confirmation, response = run_action(
            client, "reject_selected", first, second, comment="not this month"
        )
        body = page(confirmation)
        assert "<h1>Reject</h1>" in body and "Refund 300?" in body and "Refund 400?" in body
        assert 'name="comment"' in body and 'name="payload"' not in body
        assert '<input type="hidden" name="action" value="reject_selected">' in body
        body = page(response)
        assert response.redirect_chain[-1][0].startswith(CHANGELIST)
        assert "Rejected 2 approvals." in body
        assert f"{first_cid} is completed" in body and f"{second_cid} is completed" in body
        for approval in (first, second):
            stored = Approval.objects.get(pk=approval.pk)
            assert (stored.status, stored.comment) == ("rejected", "not this month")
        assert sorted(d.decision for d in SEEN) == ["rejected", "rejected"]

    def test_approve_selected_skips_what_cannot_be_decided(self, client, refunds, people):
        _, decided = pending(refunds, amount=300)
        _, open_ = pending(refunds, amount=400)
        reject(decided.pk, people["alice"])
        client.force_login(people["alice"])
        confirmation, response = run_action(client, "approve_selected", decided, open_)
        assert "not pending: rejected: will be skipped" in page(confirmation)
        body = page(response)
        assert "Approved “Refund 400?”." in body
        assert "Could not approve “Refund 300?”: it was already rejected." in body
        assert Approval.objects.get(pk=open_.pk).status == "approved"
        assert Approval.objects.get(pk=decided.pk).status == "rejected"

    def test_an_approval_one_may_not_decide_is_refused_in_a_batch(self, client, refunds, people):
        _, approval = pending(refunds)
        people["carol"].user_permissions.add(
            Permission.objects.get(codename="view_approval"),
        )
        # carol may decide another approval (by name), so the actions are offered.
        _, hers = pending(refunds, amount=800)
        hers.assignments.create(username="carol")
        client.force_login(User.objects.get(username="carol"))
        confirmation, response = run_action(client, "approve_selected", approval, hers)
        assert "you may not decide it: will be skipped" in page(confirmation)
        body = page(response)
        assert "Could not approve “Refund 500?”: you may not decide it." in body
        assert "Approved “Refund 800?”." in body
        assert Approval.objects.get(pk=approval.pk).status == "pending"


class TestHostileInput:
    def test_a_bad_selected_id_changes_nothing(self, admin_client, refunds, people):
        _, approval = pending(refunds)
        for bad in ("not-a-uuid", "\x00", "e" * 300):
            data = {
                "action": "approve_selected",
                "post": "yes",
                helpers.ACTION_CHECKBOX_NAME: [str(approval.pk), bad],
            }
            response = admin_client.post(CHANGELIST, data, follow=True)
            assert response.redirect_chain[-1] == (CHANGELIST, 302)
            assert "1 selected item has an invalid id. No items have been changed." in page(
                response
            )
        assert Approval.objects.get(pk=approval.pk).status == "pending"

    @pytest.mark.parametrize(
        "query",
        [
            "prompt__regex=(",
            "status__regex=(",
            "pk__in=x,y",
            "requested_at__gte=2020-01-01",
            "status__exact=%00",
            "workflow_name=%00",
            "requested_at__year=9999",
            "requested_at__year=9999&requested_at__month=12",
            "requested_at__year=9999&requested_at__month=12&requested_at__day=31",
        ],
    )
    def test_filters_it_does_not_offer_redirect_to_the_error_flag(self, admin_client, query):
        response = admin_client.get(f"{CHANGELIST}?{query}")
        assert (response.status_code, response["Location"]) == (302, f"{CHANGELIST}?e=1")

    @pytest.mark.parametrize(
        "query",
        [
            "status__exact=pending",
            "workflow_name=refund",
            "workflow_name__isnull=True",
            "requested_at__year=9998&requested_at__month=12&requested_at__day=31",
        ],
    )
    def test_its_own_filters_still_work(self, admin_client, refunds, query):
        pending(refunds)
        assert admin_client.get(f"{CHANGELIST}?{query}").status_code == 200

    def test_a_nul_id_is_not_found(self, admin_client):
        for url in (f"{CHANGELIST}%00/change/", f"{CHANGELIST}%00/approve/"):
            response = admin_client.get(url, follow=True)
            assert "doesn\u2019t exist" in page(response)
