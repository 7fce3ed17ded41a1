"""A fork never takes a run past a step that asked for a decision without one.

Regression tests of the hardening review's first finding: a user allowed to fork but
not to decide forked the paused snapshot of a waiting run with the same state; the
approval was cancelled, the run hibernated, and ``flowwarden_workflows resume`` ran
the next step with no decision. Now the fork asks again (the run waits at the fork
with a fresh approval), and the engine itself holds any run whose head asked for a
decision until it gets one, whoever forks or resumes it. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import call_command
from django.db import router
from django.urls import reverse

from flowwarden_django.models import Approval, ApprovalEvent, WorkflowRun
from flowwarden_django.workflows import Completed, Hibernated, RunStatus, Workflow
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.waiting.approvals import approve, reject
from tests.api.helpers import (
    API,
    People,
    pending,
    post_json,
    postgres_lane,
    token_client,
)
from tests.support.refund_workflow import seen_decisions

pytest_plugins = ["tests.api.helpers"]  # the people, refunds and on_lane fixtures
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.parametrize("lane", ["sqlite", postgres_lane()]),
]


def db() -> str:
    return router.db_for_write(WorkflowRun)


def run_of(cid: str) -> WorkflowRun:
    return WorkflowRun.objects.using(db()).get(pk=cid)


def approvals_of(cid: str) -> list[Approval]:
    return list(Approval.objects.using(db()).filter(coordination_id=cid).order_by("requested_at"))


def resume_by_command(cid: str) -> str:
    out = io.StringIO()
    call_command("flowwarden_workflows", "resume", cid, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def assert_waits_at(cid: str, snapshot_id: str) -> Approval:
    """The run waits at *snapshot_id* with one pending approval of it; that approval."""
    run = run_of(cid)
    assert (run.status, run.head_snapshot_id) == (RunStatus.WAITING, snapshot_id)
    (open_one,) = [a for a in approvals_of(cid) if a.status == Approval.Status.PENDING]
    assert open_one.snapshot_id == snapshot_id
    return open_one


# -- the engine and the command ----------------------------------------------------------


def test_a_fork_with_the_same_state_then_resume_runs_nothing(
    lane: str, on_lane: None, refunds: Any, people: People
) -> None:
    approval = pending(refunds)
    cid = approval.coordination_id
    workflow = refunds.workflow(cid)
    paused = workflow.store.load(approval.snapshot_id)
    fork = workflow.fork(paused.id, paused.state)  # the reported bypass
    fresh = assert_waits_at(cid, fork.id)
    assert Approval.objects.using(db()).get(pk=approval.pk).status == "cancelled"
    assert (fresh.prompt, fresh.group, fresh.assignees) == ("Refund 500?", "finance", ["alice"])

    resume_by_command(cid)
    result = workflow.resume(input={"approved": True})  # not a decision: dropped
    assert isinstance(result, Hibernated) and result.status == RunStatus.WAITING
    assert isinstance(workflow.run(), Hibernated)
    assert seen_decisions == [] and run_of(cid).resume_input is None
    assert_waits_at(cid, fork.id)

    # The fresh approval is the way on.
    result = approve(fresh.pk, people.alice).run_result
    assert isinstance(result, Completed) and result.final_state["outcome"] == "refunded"
    assert [d.approval_id for d in seen_decisions] == [str(fresh.pk)]


def test_a_fork_of_an_old_paused_snapshot_asks_again(
    lane: str, on_lane: None, refunds: Any, people: People
) -> None:
    approval = pending(refunds)
    cid = approval.coordination_id
    reject(approval.pk, people.alice)  # decided and finished
    assert run_of(cid).status == RunStatus.COMPLETED
    workflow = refunds.workflow(cid)
    fork = workflow.fork(approval.snapshot_id, {"amount": 10_000, "review": "manual"})
    fresh = assert_waits_at(cid, fork.id)
    # The old decision belongs to the old approval: it does not carry over.
    assert isinstance(workflow.resume(input=run_of(cid).resume_input), Hibernated)
    assert len(seen_decisions) == 1
    approve(fresh.pk, people.alice, payload={"note": "checked"})
    assert [d.decision for d in seen_decisions] == ["rejected", "approved"]


def test_a_fork_in_the_store_alone_is_held_by_the_engine(
    lane: str, on_lane: None, refunds: Any, people: People
) -> None:
    approval = pending(refunds)
    cid = approval.coordination_id
    store = OrmSnapshotStore()
    fork = store.fork(approval.snapshot_id, {"amount": 1, "review": "manual"})  # no hooks
    resume_by_command(cid)
    fresh = assert_waits_at(cid, fork.id)
    assert seen_decisions == []
    approve(fresh.pk, people.bob)
    assert run_of(cid).status == RunStatus.COMPLETED


def test_a_closed_approval_is_asked_again_in_a_new_snapshot(
    lane: str, on_lane: None, refunds: Any
) -> None:
    """A cancelled approval (a runner raced a fork, say) cannot be decided any more;
    the run repeats the request rather than passing the step."""
    approval = pending(refunds)
    cid = approval.coordination_id
    Approval.objects.using(db()).filter(pk=approval.pk).update(status="cancelled")
    WorkflowRun.objects.using(db()).filter(pk=cid).update(status=RunStatus.RUNNING)
    result = refunds.workflow(cid).run()
    assert isinstance(result, Hibernated) and seen_decisions == []
    head = Workflow.for_coordination(cid).history()[-1]
    assert head.parent_id == approval.snapshot_id and head.metadata["workflow.lastStep"] == (
        "review"
    )
    assert_waits_at(cid, head.id)


# -- the API and the admin ---------------------------------------------------------------


def test_an_api_fork_by_someone_who_may_not_decide_leaves_the_run_waiting(
    lane: str, on_lane: None, refunds: Any, people: People
) -> None:
    approval = pending(refunds)
    cid = approval.coordination_id
    forker = token_client(people.forker)
    paused = refunds.workflow(cid).store.load(approval.snapshot_id)
    url = f"{API}/snapshots/{paused.id}/fork/"
    response = post_json(forker, url, {"state": paused.state})
    assert response.status_code == 201, response.content
    fork_id = response.json()["id"]
    fresh = assert_waits_at(cid, fork_id)
    resume_by_command(cid)
    assert seen_decisions == []
    # The forker still may not decide it (nor even see it).
    response = post_json(forker, f"{API}/approvals/{fresh.pk}/approve/", {})
    assert response.status_code == 404 and response.json()["code"] == "approval_not_found"
    assert_waits_at(cid, fork_id)
    response = post_json(token_client(people.alice), f"{API}/approvals/{fresh.pk}/approve/", {})
    assert response.status_code == 200 and run_of(cid).status == RunStatus.COMPLETED


def test_an_admin_fork_leaves_the_run_waiting(
    lane: str, on_lane: None, refunds: Any, people: People, client: Any
) -> None:
    approval = pending(refunds)
    cid = approval.coordination_id
    forker = people.forker
    forker.is_staff = True
    forker.save()
    client.force_login(forker)
    paused = refunds.workflow(cid).store.load(approval.snapshot_id)
    url = reverse("admin:flowwarden_django_workflowrun_fork", args=[cid, paused.id])
    response = client.post(url, {"state": json.dumps(paused.state), "post": "yes"})
    assert response.status_code == 302
    head = refunds.workflow(cid).history()[-1]
    assert head.parent_id == paused.id
    assert_waits_at(cid, head.id)
    resume_by_command(cid)
    assert seen_decisions == []
    events = ApprovalEvent.objects.using(db()).filter(approval__coordination_id=cid)
    assert sorted(events.values_list("action", flat=True)) == [
        "cancelled",
        "requested",
        "requested",
    ]
