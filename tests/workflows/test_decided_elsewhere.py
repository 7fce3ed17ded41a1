"""A decision for a run whose workflow this process does not define (issue 45, item 9).

The decision is recorded, but only a process that defines the workflow can continue
the run: it stays ``running`` here. The person who decided is told so where they
decided (the inbox's and the admin's messages, the API's ``warnings``, the command's
output), with who continues it (a worker with Celery or Temporal; a process that
defines it otherwise), not only the server's log. A process that defines it then completes the run.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.test import Client, override_settings

from flowwarden_django.models import Approval, WorkflowRun
from flowwarden_django.workflows import Completed, RunStatus, Workflow, workflow_registry
from flowwarden_django.workflows.waiting.approvals import approve
from tests.support.refund_workflow import define_refunds

pytestmark = pytest.mark.django_db(transaction=True)

WORKFLOW = "elsewhere-refund"


@pytest.fixture
def bob() -> User:
    """A non-staff member of ``finance``, who may decide the refunds."""
    user = User.objects.create_user("bob", password="pw")
    user.groups.add(Group.objects.create(name="finance"))
    return user


@pytest.fixture
def waiting() -> Iterator[Approval]:
    """A run waiting for its approval, started by a process that defined the
    workflow; this one then forgets it (as a web process that never imported it)."""
    definition = define_refunds(WORKFLOW)
    started = definition.start({"amount": 500})
    workflow_registry.unregister(WORKFLOW)
    yield Approval.objects.get(coordination_id=started.coordination_id)
    workflow_registry.unregister(WORKFLOW)


def run_status(approval: Approval) -> str:
    return WorkflowRun.objects.get(pk=approval.coordination_id).status


def continued_where_defined(approval: Approval) -> Any:
    """What a process that defines the workflow does: continue the run."""
    define_refunds(WORKFLOW)
    return Workflow.for_coordination(approval.coordination_id).run()


def test_the_core_says_who_continues_the_run(waiting: Approval, bob: User) -> None:
    result = approve(waiting.pk, bob)
    assert result.approval.status == "approved" and result.run_result is None
    assert f"this process does not define workflow {WORKFLOW!r}" in result.warning
    assert "the run did not continue here" in result.warning
    assert f"flowwarden_workflows resume {waiting.coordination_id}" in result.warning
    assert "workflows.py" in result.warning
    assert run_status(waiting) == RunStatus.RUNNING
    assert isinstance(continued_where_defined(waiting), Completed)


def test_with_a_remote_provider_a_worker_continues_it(waiting: Approval, bob: User) -> None:
    pytest.importorskip("celery")
    with override_settings(FLOWWARDEN={"WORKFLOW_EXECUTION": "celery"}):
        result = approve(waiting.pk, bob)
    assert "A worker that defines the workflow continues it" in result.warning
    assert "flowwarden_workflows resume" not in result.warning


def test_a_version_this_process_lacks_is_named(waiting: Approval, bob: User) -> None:
    define_refunds(WORKFLOW)  # version 1 (the run's) ...
    workflow_registry.unregister(WORKFLOW, 1)
    from tests.support.refund_workflow import review, settle

    Workflow.define(WORKFLOW, [review, settle], version=2)  # ... replaced by version 2
    result = approve(waiting.pk, bob)
    assert "only in version 2, not version 1" in result.warning
    assert run_status(waiting) == RunStatus.RUNNING


def test_no_warning_where_the_workflow_is_defined(bob: User) -> None:
    definition = define_refunds(WORKFLOW)
    try:
        started = definition.start({"amount": 500})
        approval = Approval.objects.get(coordination_id=started.coordination_id)
        result = approve(approval.pk, bob)
        assert result.warning == "" and isinstance(result.run_result, Completed)
    finally:
        workflow_registry.unregister(WORKFLOW)


def test_the_inbox_says_so(waiting: Approval, bob: User) -> None:
    client = Client()
    client.force_login(bob)
    response = client.post(f"/approvals/{waiting.pk}/", {"approve": "Approve"}, follow=True)
    assert response.status_code == 200
    shown = [(m.level_tag, str(m)) for m in response.context["messages"]]
    assert ("success", "Approved: Refund 500?") in shown
    warnings = [text for level, text in shown if level == "warning"]
    assert len(warnings) == 1 and "the run did not continue here" in warnings[0]
    assert 'class="warning"' in response.content.decode()
    assert run_status(waiting) == RunStatus.RUNNING
    assert isinstance(continued_where_defined(waiting), Completed)


def test_the_api_response_says_so(waiting: Approval, bob: User) -> None:
    pytest.importorskip("rest_framework")
    from tests.api.helpers import token_client

    url = f"/api/v1/approvals/{waiting.pk}/approve/"
    response = token_client(bob).post(url, {}, content_type="application/json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "approved"
    assert len(body["warnings"]) == 1 and "did not continue here" in body["warnings"][0]
    # The detail of the approval has no such field: only the decision's answer.
    detail = token_client(bob).get(f"/api/v1/approvals/{waiting.pk}/").json()
    assert "warnings" not in detail


def test_the_api_response_has_no_warning_normally(bob: User) -> None:
    pytest.importorskip("rest_framework")
    from tests.api.helpers import token_client

    definition = define_refunds(WORKFLOW)
    try:
        approval = Approval.objects.get(
            coordination_id=definition.start({"amount": 500}).coordination_id
        )
        url = f"/api/v1/approvals/{approval.pk}/approve/"
        body = token_client(bob).post(url, {}, content_type="application/json").json()
        assert body["status"] == "approved" and body["warnings"] == []
    finally:
        workflow_registry.unregister(WORKFLOW)


def test_the_admin_says_so(waiting: Approval) -> None:
    from django.urls import reverse

    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    url = reverse("admin:flowwarden_django_approval_approve", args=[waiting.pk])
    response = client.post(url, {"post": "yes"}, follow=True)
    assert response.status_code == 200
    warnings = [str(m) for m in response.context["messages"] if m.level_tag == "warning"]
    assert len(warnings) == 1 and "the run did not continue here" in warnings[0]
    assert Approval.objects.get(pk=waiting.pk).status == "approved"


def test_the_approvals_command_says_so(waiting: Approval, bob: User) -> None:
    out = io.StringIO()
    call_command("flowwarden_approvals", "approve", str(waiting.pk), "--by", "bob", stdout=out)
    printed = out.getvalue()
    assert f"Approval {waiting.pk} is now approved." in printed
    assert "the run did not continue here" in printed
    assert run_status(waiting) == RunStatus.RUNNING


def test_the_resume_command_says_where_to_define_it(waiting: Approval) -> None:
    from django.core.management import CommandError

    with pytest.raises(CommandError) as caught:
        call_command("flowwarden_workflows", "resume", waiting.coordination_id)
    assert f"workflow {WORKFLOW!r}, which is not defined in this process" in str(caught.value)
    assert "workflows.py" in str(caught.value)
