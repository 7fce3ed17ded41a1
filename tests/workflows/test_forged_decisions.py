"""A decision is what the ``Approval`` row says: a resume input only wakes the run.

Regression tests of the security review's first finding: an approver rejected, and
before the rejection's own resume ran (it is deferred to the commit) a
``resume(input=...)`` claiming ``"approved"`` for that approval completed the run
with ``ctx.decision.approved`` and the forged comment. Here, in-process on SQLite and
PostgreSQL; the Celery and Temporal twins are in ``tests/integrations``.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.db import router, transaction

from flowwarden_django.models import Approval, ApprovalEvent, WorkflowRun
from flowwarden_django.workflows import (
    Completed,
    Hibernated,
    RunStatus,
    Workflow,
    done,
    hibernate,
    step,
    workflow_registry,
)
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.waiting.approvals import ApprovalDecision, approve, reject
from flowwarden_django.workflows.waiting.approvals.sweep import sweep_approvals
from tests.api.helpers import People, pending, postgres_lane
from tests.support.refund_workflow import seen_decisions

pytest_plugins = ["tests.api.helpers"]  # the people, refunds and on_lane fixtures
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.parametrize("lane", ["sqlite", postgres_lane()]),
]


def db() -> str:
    return router.db_for_write(WorkflowRun)


def forged(approval: Approval, decision: str = "approved") -> dict[str, Any]:
    """What an attacker sends: a well-formed decision the row does not hold."""
    return ApprovalDecision(
        str(approval.pk), decision, {"note": "forged"}, "forged comment", "mallory"
    ).as_input()


def audit(approval: Approval) -> list[str]:
    return list(
        ApprovalEvent.objects.using(db())
        .filter(approval_id=approval.pk)
        .order_by("at", "pk")
        .values_list("action", flat=True)
    )


def test_a_forged_approval_before_the_rejections_resume_gets_the_rejection(
    lane: str, on_lane: None, refunds: Any, people: People, caplog: pytest.LogCaptureFixture
) -> None:
    approval = pending(refunds)
    cid = approval.coordination_id
    workflow = refunds.workflow(cid)
    with caplog.at_level(logging.WARNING, "flowwarden_django"), transaction.atomic(using=db()):
        reject(approval.pk, people.alice, comment="no refund")  # its resume waits for commit
        result = workflow.resume(input=forged(approval))
    assert isinstance(result, Completed)
    assert result.final_state["outcome"] == "rejected"
    assert result.final_state["note"] is None and result.final_state["by"] == "alice"
    (decision,) = seen_decisions  # the rejection's own resume found the run completed
    assert (decision.decision, decision.comment, decision.decided_by) == (
        "rejected",
        "no refund",
        "alice",
    )
    assert decision.approval_id == str(approval.pk) and decision.decided_at is not None
    assert audit(approval) == ["requested", "rejected"]
    ignored = [r for r in caplog.records if "that its row does not hold" in r.getMessage()]
    assert len(ignored) == 1


def test_a_forged_decision_never_passes_a_pending_approval(
    lane: str, on_lane: None, refunds: Any, people: People
) -> None:
    approval = pending(refunds)
    cid = approval.coordination_id
    workflow = refunds.workflow(cid)
    for claim in (forged(approval), forged(approval, "expired"), {"approved": True}):
        result = workflow.resume(input=claim)
        assert isinstance(result, Hibernated) and result.status == RunStatus.WAITING
    assert isinstance(workflow.run(), Hibernated)
    sweep_approvals(using="default")
    run = WorkflowRun.objects.using(db()).get(pk=cid)
    assert (run.status, run.resume_input) == (RunStatus.WAITING, None)
    assert seen_decisions == []
    assert Approval.objects.using(db()).get(pk=approval.pk).status == Approval.Status.PENDING

    # The real decision is the way on; the run sees the row's fields.
    approve(approval.pk, people.alice, comment="fine", payload={"note": "real"})
    (decision,) = seen_decisions
    assert (decision.decision, decision.comment, decision.payload, decision.decided_by) == (
        "approved",
        "fine",
        {"note": "real"},
        "alice",
    )


def test_the_decision_comes_from_the_row_even_when_the_run_holds_another_input(
    lane: str, on_lane: None, refunds: Any, people: People
) -> None:
    """The input on the run record (what a Celery task or Temporal signal writes) is
    overwritten with a forged one after the decision: the step still gets the row's."""
    approval = pending(refunds)
    cid = approval.coordination_id
    with transaction.atomic(using=db()):
        reject(approval.pk, people.alice, comment="no")
        WorkflowRun.objects.using(db()).filter(pk=cid).update(resume_input=forged(approval))
    assert [d.decision for d in seen_decisions] == ["rejected"]
    assert seen_decisions[0].payload is None and seen_decisions[0].comment == "no"


@step("wait")
def wait_step(state: Any) -> Any:
    return hibernate(state)


@step("after")
def after_step(state: Any, ctx: Any) -> Any:
    return done({"decision": ctx.decision, "input": ctx.input})


def test_a_decision_shaped_input_after_a_plain_hibernate_is_no_decision(
    lane: str, on_lane: None, people: People
) -> None:
    definition = Workflow.define(
        "fw-forged-hibernate", [wait_step, after_step], OrmSnapshotStore(using=db()), using=db()
    )
    try:
        started = definition.start({})
        claim = ApprovalDecision("00000000-0000-0000-0000-000000000000", "approved").as_input()
        result = definition.workflow(started.coordination_id).resume(input=claim)
    finally:
        workflow_registry.unregister("fw-forged-hibernate")
    assert isinstance(result, Completed)
    assert result.final_state == {"decision": None, "input": claim}
