"""Approvals: waiting for a person, deciding (idempotent, audited), expiry, the
sweep, and racing decisions on a real database."""

from __future__ import annotations

import io
import json
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections, transaction
from django.utils import timezone

from flowwarden_django.models import Approval, ApprovalEvent, WorkflowRun
from flowwarden_django.workflows import (
    Completed,
    Hibernated,
    RunStatus,
    Workflow,
    await_approval,
    step,
    workflow_registry,
)
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.runs.records import RunRecords, new_runner_token
from flowwarden_django.workflows.waiting.approvals import (
    ApprovalConflictError,
    ApprovalDecision,
    ApprovalError,
    ApprovalExpiredError,
    ApprovalPermissionError,
    UnknownApprovalError,
    approve,
    assigned_approvals,
    can_decide,
    check_may_decide,
    reject,
    sweep_approvals,
    visible_approvals,
)
from tests.support.lanes import lane_marks
from tests.support.refund_workflow import define_refunds, review, seen_decisions, settle

pytestmark = pytest.mark.django_db(transaction=True)

SERVER_DATABASES = [
    pytest.param(
        alias, id=alias, marks=lane_marks(alias, databases=["default", alias], transaction=True)
    )
    for alias in ("postgres", "mariadb")
]


@pytest.fixture
def refunds(request: pytest.FixtureRequest) -> Any:
    alias = getattr(request, "param", "default")
    definition = define_refunds("refund", OrmSnapshotStore(using=alias), using=alias)
    yield definition
    workflow_registry.unregister("refund")


def users(alias: str = "default") -> dict[str, User]:
    finance = Group.objects.db_manager(alias).create(name="finance")
    made = {
        "alice": User.objects.db_manager(alias).create_user("alice", password="pw"),
        "bob": User.objects.db_manager(alias).create_user("bob", password="pw"),
        "carol": User.objects.db_manager(alias).create_user("carol", password="pw"),
        "dave": User.objects.db_manager(alias).create_user("dave", password="pw"),
    }
    made["bob"].groups.add(finance)
    perm = Permission.objects.db_manager(alias).get(codename="decide_approval")
    made["dave"].user_permissions.add(perm)
    return made


def pending(definition: Any, amount: int = 500, **extra: Any) -> tuple[str, Approval]:
    started = definition.start({"amount": amount, **extra})
    assert isinstance(started.result, Hibernated)
    assert started.result.status == RunStatus.WAITING
    using = definition.using or "default"
    approval = Approval.objects.using(using).get(coordination_id=started.coordination_id)
    return started.coordination_id, approval


def test_a_step_waits_and_the_approval_resumes_it(refunds: Any) -> None:
    people = users()
    cid, approval = pending(refunds)
    assert approval.status == Approval.Status.PENDING
    assert approval.prompt == "Refund 500?"
    assert approval.assignees == ["alice"]
    assert approval.group == "finance"
    assert approval.step_name == "review"
    assert approval.workflow_name == "refund"
    run = WorkflowRun.objects.get(pk=cid)
    assert run.status == RunStatus.WAITING and run.head_snapshot_id == approval.snapshot_id
    assert run.attempts == 0  # waiting is not a retry (nor is the resume below)

    # Running it again without a decision changes nothing.
    assert isinstance(refunds.workflow(cid).run(), Hibernated)

    result = approve(approval.pk, people["alice"], comment="ok", payload={"note": "vip"})
    assert not result.repeated
    assert isinstance(result.run_result, Completed)
    assert WorkflowRun.objects.get(pk=cid).attempts == 0
    state = result.run_result.final_state
    assert state["outcome"] == "refunded" and state["note"] == "vip" and state["by"] == "alice"
    expected = ApprovalDecision(
        str(approval.pk), "approved", {"note": "vip"}, "ok", "alice", seen_decisions[0].decided_at
    )
    assert seen_decisions == [expected]
    approval.refresh_from_db()
    assert approval.status == "approved" and approval.decided_by == "alice"
    assert approval.comment == "ok" and approval.payload == {"note": "vip"}
    assert WorkflowRun.objects.get(pk=cid).status == RunStatus.COMPLETED
    chain = refunds.workflow(cid).history()
    assert [s.metadata.get("workflow.lastStep") for s in chain] == ["", "review", "settle"]
    assert chain[2].parent_id == chain[1].id == approval.snapshot_id
    actions = list(approval.events.values_list("action", "actor"))
    assert actions == [("requested", ""), ("approved", "alice")]


def test_no_approval_when_the_step_does_not_ask(refunds: Any) -> None:
    started = refunds.start({"amount": 5})
    assert isinstance(started.result, Completed)
    assert not Approval.objects.exists()
    assert seen_decisions == [None]


def test_the_same_decision_again_returns_the_first(refunds: Any) -> None:
    people = users()
    _, approval = pending(refunds)
    first = approve(approval.pk, people["bob"], comment="first", payload={"note": "a"})
    again = approve(approval.pk, people["alice"], comment="second", payload={"note": "b"})
    assert again.repeated and again.run_result is None
    assert again.approval.decided_by == "bob"
    assert again.approval.comment == "first" and again.approval.payload == {"note": "a"}
    assert first.approval.decided_at == again.approval.decided_at
    assert len(seen_decisions) == 1  # the run resumed once
    assert list(approval.events.values_list("action", flat=True)) == [
        "requested",
        "approved",
        "repeated",
    ]


def test_a_conflicting_decision_is_refused_and_audited(refunds: Any) -> None:
    people = users()
    _, approval = pending(refunds)
    reject(approval.pk, people["alice"], comment="no")
    with pytest.raises(ApprovalConflictError) as caught:
        approve(approval.pk, people["bob"])
    assert caught.value.code == "approval_already_decided"
    assert caught.value.status == "rejected"
    assert seen_decisions[0].rejected
    refused = approval.events.get(action="refused")
    assert refused.actor == "bob" and "approval_already_decided" in refused.detail


def test_who_may_decide(refunds: Any) -> None:
    people = users()
    _, approval = pending(refunds)
    assert can_decide(people["alice"], approval)  # assignee
    assert can_decide(people["bob"], approval)  # group
    assert not can_decide(people["carol"], approval)
    assert can_decide(people["dave"], approval)  # decide_approval
    with pytest.raises(ApprovalPermissionError):
        approve(approval.pk, people["carol"])
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert list(visible_approvals(people["carol"])) == []
    assert list(visible_approvals(people["alice"])) == [approval]
    assert list(visible_approvals(people["dave"])) == [approval]
    assert list(assigned_approvals(people["bob"])) == [approval]
    assert list(assigned_approvals(people["dave"])) == []  # may decide, not assigned
    inactive = people["alice"]
    inactive.is_active = False
    inactive.save()
    assert not can_decide(inactive, approval)


def test_permission_named_by_the_step(refunds: Any) -> None:
    @step("review")
    def ask(state: Any) -> Any:
        return await_approval(state, "?", permission="flowwarden_django.fork_workflowrun")

    Workflow.define("perm", [ask, settle], OrmSnapshotStore())
    try:
        started = Workflow.start("perm", {"amount": 1})
        approval = Approval.objects.get(coordination_id=started.coordination_id)
        erin = User.objects.create_user("erin")
        assert not can_decide(erin, approval)
        erin.user_permissions.add(Permission.objects.get(codename="fork_workflowrun"))
        erin = User.objects.get(pk=erin.pk)
        assert can_decide(erin, approval)
        assert list(assigned_approvals(erin)) == [approval]
    finally:
        workflow_registry.unregister("perm")


def test_unknown_approval() -> None:
    with pytest.raises(UnknownApprovalError):
        approve(uuid.uuid4(), None, check_permission=False)
    with pytest.raises(UnknownApprovalError):
        approve("not-a-uuid", None, check_permission=False)


def test_bad_requests_are_refused_by_the_step() -> None:
    with pytest.raises(ValueError, match="on_expiry"):
        await_approval({}, on_expiry="explode")
    with pytest.raises(ValueError, match="positive"):
        await_approval({}, expires_in=0)
    with pytest.raises(ValueError, match=r"app_label\.codename"):
        await_approval({}, permission="decide")
    assert await_approval({}, assignees="alice").assignees == ("alice",)


def test_expiry_resumes_with_an_expired_decision(refunds: Any) -> None:
    people = users()
    cid, approval = pending(refunds, expires_in=60)
    assert approval.expires_at is not None
    assert sweep_approvals(using="default").expired == []  # not due yet
    later = timezone.now() + timedelta(seconds=61)
    assert sweep_approvals(now=later, using="default").expired == [str(approval.pk)]
    approval.refresh_from_db()
    assert approval.status == "expired"
    assert WorkflowRun.objects.get(pk=cid).status == RunStatus.COMPLETED
    assert seen_decisions[0].expired
    assert refunds.workflow(cid).history()[-1].state["outcome"] == "expired"
    with pytest.raises(ApprovalExpiredError) as caught:
        approve(approval.pk, people["alice"])
    assert caught.value.code == "approval_expired"
    assert sweep_approvals(now=later, using="default").expired == []  # idempotent


def test_expiry_can_fail_the_run(refunds: Any) -> None:
    cid, approval = pending(refunds, expires_in=1, on_expiry="fail")
    sweep_approvals(now=timezone.now() + timedelta(seconds=2), using="default")
    run = WorkflowRun.objects.get(pk=cid)
    assert run.status == RunStatus.FAILED and str(approval.pk) in run.failure_reason
    assert seen_decisions == []


def test_a_late_decision_expires_the_approval(refunds: Any) -> None:
    people = users()
    cid, approval = pending(refunds, expires_in=60)
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(ApprovalExpiredError):
        approve(approval.pk, people["alice"])
    assert Approval.objects.get(pk=approval.pk).status == "expired"
    assert WorkflowRun.objects.get(pk=cid).status == RunStatus.COMPLETED  # resumed: expired
    assert list(approval.events.values_list("action", flat=True)) == [
        "requested",
        "expired",
        "refused",
    ]


def test_a_fork_cancels_the_pending_approval(refunds: Any) -> None:
    """A decision must never apply to a state its approver did not see."""
    people = users()
    cid, approval = pending(refunds)
    workflow = refunds.workflow(cid)
    fork = workflow.fork(approval.snapshot_id, {"amount": 999_999, "review": "manual"})
    assert Approval.objects.get(pk=approval.pk).status == "cancelled"
    run = WorkflowRun.objects.get(pk=cid)
    assert (run.status, run.head_snapshot_id) == (RunStatus.WAITING, fork.id)
    with pytest.raises(ApprovalConflictError) as caught:
        approve(approval.pk, people["alice"])
    assert caught.value.code == "approval_cancelled"
    assert seen_decisions == []


def test_an_approval_of_a_run_that_moved_on_is_cancelled(refunds: Any) -> None:
    people = users()
    cid, approval = pending(refunds)
    WorkflowRun.objects.filter(pk=cid).update(status=RunStatus.FAILED)  # failed by hand
    with pytest.raises(ApprovalConflictError) as caught:
        approve(approval.pk, people["alice"])
    assert caught.value.code == "approval_cancelled"
    assert Approval.objects.get(pk=approval.pk).status == "cancelled"


def test_a_decision_while_a_runner_holds_the_run_is_refused_and_kept(refunds: Any) -> None:
    people = users()
    cid, approval = pending(refunds)
    runs, token = RunRecords(), new_runner_token()
    runs.claim(cid, token, timedelta(minutes=5))  # a run() of the waiting run, say
    with pytest.raises(ApprovalConflictError) as caught:
        approve(approval.pk, people["alice"])
    assert caught.value.code == "run_busy"
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    runs.release(cid, token)
    assert isinstance(approve(approval.pk, people["alice"]).run_result, Completed)


def test_expiry_waits_while_a_runner_holds_the_run(refunds: Any) -> None:
    cid, approval = pending(refunds, expires_in=1)
    later = timezone.now() + timedelta(seconds=2)
    runs, token = RunRecords(), new_runner_token()
    runs.claim(cid, token, timedelta(minutes=5))
    assert sweep_approvals(now=later, using="default").expired == []
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    runs.release(cid, token)
    assert sweep_approvals(now=later, using="default").expired == [str(approval.pk)]
    assert WorkflowRun.objects.get(pk=cid).status == RunStatus.COMPLETED


def test_a_refused_user_is_audited(refunds: Any) -> None:
    people = users()
    _, approval = pending(refunds)
    with pytest.raises(ApprovalPermissionError):
        reject(approval.pk, people["carol"], comment="let me")
    event = approval.events.get(action="refused")
    assert event.actor == "carol" and "approval_forbidden" in event.detail


def test_refused_attempts_are_audited_with_bounded_data(refunds: Any) -> None:
    """A viewer's refused attempts keep who, when and why, a short comment and no
    payload; past a cap per user, no more rows (issue 45, item 6)."""
    from flowwarden_django.workflows.waiting.approvals.deciding import (
        MAX_AUDITED_REFUSALS,
        REFUSED_COMMENT_CHARS,
    )

    people = users()
    _, approval = pending(refunds)
    viewer = people["carol"]
    viewer.user_permissions.add(Permission.objects.get(codename="view_approval"))
    viewer = User.objects.get(pk=viewer.pk)
    comment, payload = "c" * 2000, {"x": "y" * 60_000}
    for _ in range(MAX_AUDITED_REFUSALS + 5):
        with pytest.raises(ApprovalPermissionError):
            approve(approval.pk, viewer, comment=comment, payload=payload)
    refused = list(approval.events.filter(action="refused").order_by("at", "pk"))
    assert len(refused) == MAX_AUDITED_REFUSALS
    for event in refused:
        assert event.actor == "carol" and event.detail.startswith("approval_forbidden: ")
        assert event.payload == {"decision": "approved"}  # not the 60 KB payload
        assert len(event.comment) <= REFUSED_COMMENT_CHARS and event.comment.startswith("ccc")
    assert "not recorded" in refused[-1].detail and "not recorded" not in refused[0].detail
    # Another user's refusals have their own allowance; the approval is still open.
    erin = User.objects.create_user("erin", password="pw")
    with pytest.raises(ApprovalPermissionError):
        reject(approval.pk, erin, comment="mine")
    assert approval.events.filter(action="refused", actor="erin").count() == 1
    assert isinstance(approve(approval.pk, people["alice"]).run_result, Completed)


@step("second")
def second_review(state: dict[str, Any]) -> Any:
    return await_approval({**state, "second": True}, "And a second look?", assignees=["bob"])


def test_a_late_resume_never_hands_an_old_decision_to_a_later_approval(refunds: Any) -> None:
    """The resume after a decision's commit runs the run without input: if another
    runner continued it first to a second approval, it finds it waiting and stops."""
    people = users()
    Workflow.define("two-looks", [review, second_review, settle], OrmSnapshotStore())
    try:
        started = Workflow.start("two-looks", {"amount": 500})
        first = Approval.objects.get(coordination_id=started.coordination_id)
        workflow = workflow_registry.get("two-looks").workflow(started.coordination_id)
        with transaction.atomic():
            transaction.on_commit(workflow.run)  # another runner, first in line
            approve(first.pk, people["alice"])
        run = WorkflowRun.objects.get(pk=started.coordination_id)
        assert run.status == RunStatus.WAITING
        second = Approval.objects.get(coordination_id=started.coordination_id, status="pending")
        assert second.step_name == "second" and seen_decisions == []
        assert isinstance(approve(second.pk, people["bob"]).run_result, Completed)
        assert seen_decisions[0].approval_id == str(second.pk)
    finally:
        workflow_registry.unregister("two-looks")


def test_the_sweep_cancels_stale_approvals_and_restores_missing_ones(refunds: Any) -> None:
    cid, approval = pending(refunds)
    WorkflowRun.objects.filter(pk=cid).update(status=RunStatus.FAILED)
    assert sweep_approvals(using="default").cancelled == [str(approval.pk)]

    cid2, lost = pending(refunds)
    Approval.objects.filter(pk=lost.pk).delete()  # as if the process died before the row
    result = sweep_approvals(using="default")
    assert result.restored == [cid2]
    restored = Approval.objects.get(coordination_id=cid2)
    assert restored.snapshot_id == lost.snapshot_id and restored.assignees == ["alice"]
    assert sweep_approvals(using="default").restored == []


def test_a_decision_made_before_a_crash_is_continued_by_the_next_run(
    refunds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decision's transaction hands the input to the run: if the resume after the
    commit never happens (the process dies), the next run() continues with it."""
    from flowwarden_django.workflows.waiting.approvals import deciding, transitions

    people = users()
    cid, approval = pending(refunds)
    monkeypatch.setattr(deciding, "resume_on_commit", lambda *a: transitions.ResumeOutcome())
    approve(approval.pk, people["alice"], payload={"note": "x"})
    run = WorkflowRun.objects.get(pk=cid)
    assert run.status == RunStatus.RUNNING and run.resume_input["decision"] == "approved"
    result = refunds.workflow(cid).run()
    assert isinstance(result, Completed) and result.final_state["note"] == "x"


def race_decisions(approval: Approval, people: dict[str, User], alias: str) -> list[str]:
    """Eight threads decide *approval* at once: odd ones approve (as alice), even
    ones reject (as bob). What each got."""
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def decide(index: int) -> None:
        try:
            barrier.wait()
            if index % 2:
                approve(approval.pk, people["alice"], using=alias)
                outcomes.append("approved")
            else:
                reject(approval.pk, people["bob"], using=alias)
                outcomes.append("rejected")
        except ApprovalConflictError:
            outcomes.append("conflict")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=decide, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


@pytest.mark.parametrize("alias", SERVER_DATABASES)
def test_racing_decisions_make_exactly_one(alias: str) -> None:
    """Eight threads decide one approval at once, half approving, half rejecting:
    one decision is made, the same decision repeats it, the other conflicts."""
    define_refunds("refund", OrmSnapshotStore(using=alias), using=alias)
    try:
        people = users(alias)
        for _ in range(10):
            _, approval = pending(workflow_registry.get("refund"))
            outcomes = race_decisions(approval, people, alias)
            final = Approval.objects.using(alias).get(pk=approval.pk).status
            assert outcomes.count(final) == 4 and outcomes.count("conflict") == 4, outcomes
            events = ApprovalEvent.objects.using(alias).filter(approval_id=approval.pk)
            assert events.filter(action=final).count() == 1
        assert len(seen_decisions) == 10  # each run resumed exactly once
    finally:
        workflow_registry.unregister("refund")


def race_cancel_and_decide(
    cid: str, approval: Approval, people: dict[str, User], alias: str
) -> list[tuple[str, BaseException]]:
    """A cancel and an approval of *approval* at once; the errors either side got."""
    barrier = threading.Barrier(2)
    errors: list[tuple[str, BaseException]] = []

    def cancel() -> None:
        try:
            barrier.wait()
            Workflow.for_coordination(cid, using=alias).cancel("race", by="ops")
        except BaseException as exc:
            errors.append(("cancel", exc))
        finally:
            connections.close_all()

    def decide() -> None:
        try:
            barrier.wait()
            approve(approval.pk, people["alice"], using=alias)
        except ApprovalError:
            pass  # cancelled first: refused, as it should be
        except BaseException as exc:
            errors.append(("decide", exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=cancel), threading.Thread(target=decide)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return errors


@pytest.mark.parametrize("alias", SERVER_DATABASES)
def test_a_cancel_racing_a_decision_ends_the_run_one_way_without_an_error(alias: str) -> None:
    """Issue 31: a cancel and an approval at once, ten times: each pair ends with the
    run cancelled (the approval cancelled, or decided first and the resumed run's
    result discarded) or completed (decided and finished before the cancel, which
    then leaves it); neither side gets a database error (a deadlock is retried)."""
    define_refunds("refund", OrmSnapshotStore(using=alias), using=alias)
    try:
        people = users(alias)
        for _ in range(10):
            cid, approval = pending(workflow_registry.get("refund"))
            assert race_cancel_and_decide(cid, approval, people, alias) == []
            status = WorkflowRun.objects.using(alias).get(pk=cid).status
            assert status in (RunStatus.CANCELLED, RunStatus.COMPLETED)
            final = Approval.objects.using(alias).get(pk=approval.pk).status
            assert final != Approval.Status.PENDING
    finally:
        workflow_registry.unregister("refund")


# -- the command ---------------------------------------------------------------------


def call(*args: str) -> str:
    out = io.StringIO()
    call_command("flowwarden_approvals", *args, stdout=out)
    return out.getvalue()


def test_command_lists_shows_and_decides(refunds: Any) -> None:
    users()
    _, approval = pending(refunds)
    listing = call("list", "--status", "pending")
    assert str(approval.pk) in listing and "refund" in listing
    assert json.loads(call("list", "--json"))[0]["id"] == str(approval.pk)
    with pytest.raises(CommandError, match="No user 'nobody'"):
        call("approve", str(approval.pk), "--by", "nobody")
    with pytest.raises(CommandError, match="--force"):
        call("approve", str(approval.pk), "--by", "carol")
    with pytest.raises(CommandError, match="--payload is not valid JSON"):
        call("approve", str(approval.pk), "--by", "alice", "--payload", "{nope")
    out = call("approve", str(approval.pk), "--by", "alice", "--payload", '{"note": "cli"}')
    assert "is now approved" in out and "resumed: completed" in out
    assert "was already approved" in call("approve", str(approval.pk), "--by", "bob")
    with pytest.raises(CommandError, match="approval_already_decided"):
        call("reject", str(approval.pk), "--by", "bob")
    shown = call("show", str(approval.pk))
    assert "Audit trail" in shown and "refused" in shown and "alice" in shown
    assert json.loads(call("show", str(approval.pk), "--json"))["payload"] == {"note": "cli"}
    with pytest.raises(CommandError, match="No approval"):
        call("show", "nope")


@pytest.mark.parametrize("verb", ["approve", "reject"])
@pytest.mark.parametrize("bad_id", ["not-a-uuid", "00000000-0000-0000-0000-000000000000"])
def test_deciding_an_unknown_approval_says_how_to_find_the_right_id(
    refunds: Any, verb: str, bad_id: str
) -> None:
    users()
    _, approval = pending(refunds)
    with pytest.raises(CommandError) as refused:
        call(verb, bad_id, "--by", "alice")
    message = str(refused.value)
    assert f"no approval {bad_id!r} [approval_not_found]" in message
    assert "`manage.py flowwarden_approvals list --status pending`" in message
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.PENDING


def test_command_and_task_expire(refunds: Any) -> None:
    from flowwarden_django.integrations.celery.tasks import expire_approvals

    _, first = pending(refunds, expires_in=60)
    _, second = pending(refunds, expires_in=60)
    Approval.objects.filter(pk=first.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    out = call("expire")
    assert "Expired 1, cancelled 0, restored 0" in out and str(first.pk) in out
    Approval.objects.filter(pk=second.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert expire_approvals.apply().get() == {
        "expired": [str(second.pk)],
        "cancelled": [],
        "restored": [],
        "reminded": [],
        "escalated": [],
    }


def test_a_fork_of_a_waiting_run_asks_again_and_cancels_its_approval(refunds: Any) -> None:
    people = users()
    cid, approval = pending(refunds)
    workflow = refunds.workflow(cid)
    waiting = workflow.history()[-1]
    fork = workflow.fork(waiting.id, {**waiting.state, "amount": 5, "outcome": "forked"})
    assert Approval.objects.get(pk=approval.pk).status == "cancelled"
    result = workflow.run()  # the fork repeats review's request: no step runs
    assert isinstance(result, Hibernated) and result.status == RunStatus.WAITING
    assert seen_decisions == []
    again = Approval.objects.get(snapshot_id=fork.id, status=Approval.Status.PENDING)
    assert approve(again.pk, people["alice"]).run_result.final_state["amount"] == 5
    assert [d.decision for d in seen_decisions] == ["approved"]


def lock_waiters(alias: str) -> int:
    """Sessions of this test database waiting for a row lock (PostgreSQL)."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return int(cursor.fetchone()[0])


@pytest.mark.parametrize(
    "alias",
    [
        pytest.param(
            "postgres",
            marks=lane_marks("postgres", databases=["default", "postgres"], transaction=True),
        )
    ],
)
def test_racing_refusals_store_at_most_the_cap(alias: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Twenty refused attempts by one user at once (``check_may_decide``, as the API and
    the inbox refuse): each one's audit row is held until every attempt has counted
    the rows (or waits for the approval's row lock), so a count-then-insert without
    the lock stores all twenty; with it, at most ``MAX_AUDITED_REFUSALS``."""
    from flowwarden_django.workflows.waiting.approvals import deciding

    racers = deciding.MAX_AUDITED_REFUSALS * 2
    define_refunds("refund", OrmSnapshotStore(using=alias), using=alias)
    try:
        people = users(alias)
        _, approval = pending(workflow_registry.get("refund"))
        gate, lock = threading.Event(), threading.Lock()
        arrived_or_done = [0]
        real_record = deciding.record_event

        def held_record(*args: Any, **kwargs: Any) -> Any:
            if not gate.is_set():
                with lock:
                    arrived_or_done[0] += 1
                assert gate.wait(60), "the gate never opened"
            return real_record(*args, **kwargs)

        monkeypatch.setattr(deciding, "record_event", held_record)
        barrier = threading.Barrier(racers)
        errors: list[BaseException] = []

        def refuse() -> None:
            try:
                barrier.wait(30)
                row = Approval.objects.using(alias).get(pk=approval.pk)
                with pytest.raises(ApprovalPermissionError):
                    check_may_decide(row, "approved", people["carol"], using=alias)
            except BaseException as exc:
                errors.append(exc)
            finally:
                if not gate.is_set():
                    with lock:
                        arrived_or_done[0] += 1
                connections.close_all()

        threads = [threading.Thread(target=refuse) for _ in range(racers)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if arrived_or_done[0] + lock_waiters(alias) >= racers:
                break
            time.sleep(0.01)
        gate.set()
        for thread in threads:
            thread.join(60)
        assert errors == []
        refused = ApprovalEvent.objects.using(alias).filter(
            approval_id=approval.pk, action="refused", actor="carol"
        )
        assert refused.count() == deciding.MAX_AUDITED_REFUSALS
    finally:
        workflow_registry.unregister("refund")
