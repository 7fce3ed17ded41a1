"""Claiming approvals (issue 49): claim, release, reassign, the claimant-only decision,
their audit trail, and two claims racing on a real database."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connections
from django.utils import timezone

from flowwarden_django.models import Approval, ApprovalEvent
from flowwarden_django.workflows import (
    ApprovalConflictError,
    ApprovalExpiredError,
    ApprovalPermissionError,
    Completed,
    UnknownApprovalError,
    approve,
    claim,
    reassign,
    reject,
    release,
    workflow_registry,
)
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.waiting.approvals.claims import MAX_REASSIGN_USERS
from tests.support.lanes import lane_marks
from tests.support.refund_workflow import define_refunds
from tests.workflows.test_approvals import pending, users

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def refunds() -> Any:
    definition = define_refunds("refund", OrmSnapshotStore(using="default"), using="default")
    yield definition
    workflow_registry.unregister("refund")


def reassigner(alias: str = "default", name: str = "erin") -> User:
    user = User.objects.db_manager(alias).create_user(name, password="pw")
    user.user_permissions.add(
        Permission.objects.db_manager(alias).get(codename="reassign_approval")
    )
    return User.objects.db_manager(alias).get(pk=user.pk)  # a fresh permission cache


def actions(approval: Approval, alias: str = "default") -> list[tuple[str, str]]:
    events = ApprovalEvent.objects.using(alias).filter(approval_id=approval.pk)
    return list(events.order_by("at", "pk").values_list("action", "actor"))


def test_claim_then_only_the_claimant_decides(refunds: Any) -> None:
    people = users()
    _, approval = pending(refunds)
    result = claim(approval.pk, people["bob"])
    assert result.changed and result.approval.claimed_by == "bob"
    approval.refresh_from_db()
    assert approval.claimed_by == "bob" and approval.claimed_at is not None
    assert not claim(approval.pk, people["bob"]).changed  # again: a no-op

    with pytest.raises(ApprovalConflictError) as refused:
        approve(approval.pk, people["alice"], comment="me first")
    assert refused.value.code == "approval_claimed"
    with pytest.raises(ApprovalConflictError):  # decide_approval does not override it
        reject(approval.pk, people["dave"])
    with pytest.raises(ApprovalConflictError) as taken:
        claim(approval.pk, people["alice"])
    assert taken.value.code == "approval_claimed"

    decided = approve(approval.pk, people["bob"], comment="fine")
    assert isinstance(decided.run_result, Completed)
    assert decided.run_result.final_state["by"] == "bob"
    trail = actions(approval)
    assert trail[1:] == [
        ("claimed", "bob"),
        ("refused", "alice"),
        ("refused", "dave"),
        ("approved", "bob"),
    ]
    refusal = ApprovalEvent.objects.get(approval_id=approval.pk, actor="alice")
    assert refusal.detail.startswith("approval_claimed") and refusal.comment == "me first"


def test_release_then_another_claims(refunds: Any) -> None:
    people = users()
    _, approval = pending(refunds)
    claim(approval.pk, people["alice"])
    with pytest.raises(ApprovalConflictError):  # not bob's claim to give back
        release(approval.pk, people["bob"])
    assert release(approval.pk, people["alice"]).changed
    assert not release(approval.pk, people["alice"]).changed  # unclaimed: a no-op
    assert claim(approval.pk, people["bob"]).approval.claimed_by == "bob"
    approval.refresh_from_db()
    assert approval.claimed_by == "bob"
    assert actions(approval)[1:] == [
        ("claimed", "alice"),
        ("released", "alice"),
        ("claimed", "bob"),
    ]


def test_who_may_claim_and_release(refunds: Any) -> None:
    people = users()
    _, approval = pending(refunds)
    with pytest.raises(ApprovalPermissionError):  # carol may not decide it
        claim(approval.pk, people["carol"])
    with pytest.raises(ApprovalPermissionError):
        claim(approval.pk, None)
    claim(approval.pk, people["dave"])  # decide_approval
    with pytest.raises(ApprovalPermissionError):
        release(approval.pk, people["carol"])
    erin = reassigner()
    released = release(approval.pk, erin)  # a reassigner releases anyone's claim
    assert released.changed and released.approval.claimed_by == ""
    event = ApprovalEvent.objects.get(approval_id=approval.pk, action="released")
    assert event.actor == "erin" and event.payload == {"claimed_by": "dave"}
    assert "dave" in event.detail
    with pytest.raises(UnknownApprovalError):
        claim(uuid.uuid4(), people["alice"])
    with pytest.raises(UnknownApprovalError):
        release("not-a-uuid\x00", people["alice"])


def test_no_claim_on_a_closed_approval(refunds: Any) -> None:
    people = users()
    _, approval = pending(refunds)
    approve(approval.pk, people["alice"])
    for call in (claim, release):
        with pytest.raises(ApprovalConflictError) as refused:
            call(approval.pk, people["alice"])
        assert refused.value.code == "approval_already_decided"
    with pytest.raises(ApprovalConflictError):
        reassign(approval.pk, by=reassigner(), to_users=["carol"])

    _, due = pending(refunds, amount=600)
    Approval.objects.filter(pk=due.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(ApprovalExpiredError):
        claim(due.pk, people["alice"])


def test_reassign_moves_it_and_needs_the_permission(refunds: Any) -> None:
    people = users()
    _, approval = pending(refunds)
    claim(approval.pk, people["alice"])
    with pytest.raises(ApprovalPermissionError):
        reassign(approval.pk, by=people["dave"], to_users=["carol"])
    erin = reassigner()
    result = reassign(approval.pk, by=erin, to_users=["carol", " carol "], comment="holiday")
    assert result.changed
    approval.refresh_from_db()
    assert approval.assignees == ["carol"] and approval.group == ""
    assert approval.claimed_by == "" and approval.claimed_at is None
    event = ApprovalEvent.objects.get(approval_id=approval.pk, action="reassigned")
    assert event.actor == "erin" and event.comment == "holiday"
    assert event.payload == {
        "from": {"assignees": ["alice"], "group": "finance", "claimed_by": "alice"},
        "to": {"assignees": ["carol"], "group": ""},
    }
    with pytest.raises(ApprovalPermissionError):  # alice is no assignee any more
        approve(approval.pk, people["alice"])
    with pytest.raises(ApprovalPermissionError):  # nor is bob's group
        claim(approval.pk, people["bob"])
    assert claim(approval.pk, people["carol"]).changed
    reassign(approval.pk, by=erin, to_group="finance")
    approval.refresh_from_db()
    assert approval.assignees == [] and approval.group == "finance" and not approval.claimed_by
    assert isinstance(approve(approval.pk, people["bob"]).run_result, Completed)


@pytest.mark.parametrize(
    "to_users, to_group",
    [
        ((), None),
        (["  "], ""),
        (["x" * 151], None),
        (["a\x00b"], None),
        ((), "g\x00"),
        ((), "g" * 151),
        ([f"user{i}" for i in range(MAX_REASSIGN_USERS + 1)], None),
    ],
)
def test_reassign_refuses_bad_targets_before_reading(to_users: Any, to_group: Any) -> None:
    with pytest.raises(ValueError):
        reassign(uuid.uuid4(), by=None, to_users=to_users, to_group=to_group)


def race_claims(approval: Approval, people: list[User], alias: str) -> dict[str, str]:
    """Each of *people* claims *approval* at once (a barrier); what each got."""
    barrier = threading.Barrier(len(people))
    outcomes: dict[str, str] = {}

    def attempt(user: User) -> None:
        try:
            barrier.wait()
            claim(approval.pk, user, using=alias)
            outcomes[user.username] = "claimed"
        except ApprovalConflictError as exc:
            outcomes[user.username] = exc.code
        finally:
            connections.close_all()

    threads = [threading.Thread(target=attempt, args=(user,)) for user in people]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


@pytest.mark.parametrize(
    "alias",
    [
        pytest.param(
            "postgres",
            id="postgres",
            marks=lane_marks("postgres", databases=["default", "postgres"], transaction=True),
        )
    ],
)
def test_two_racing_claims_leave_one_claimant(alias: str) -> None:
    define_refunds("refund", OrmSnapshotStore(using=alias), using=alias)
    try:
        people = users(alias)
        racers = [people["alice"], people["dave"]]
        for _ in range(10):
            _, approval = pending(workflow_registry.get("refund"))
            outcomes = race_claims(approval, racers, alias)
            assert sorted(outcomes.values()) == ["approval_claimed", "claimed"], outcomes
            winner = next(name for name, got in outcomes.items() if got == "claimed")
            assert Approval.objects.using(alias).get(pk=approval.pk).claimed_by == winner
            claims = ApprovalEvent.objects.using(alias).filter(
                approval_id=approval.pk, action="claimed"
            )
            assert list(claims.values_list("actor", flat=True)) == [winner]
    finally:
        workflow_registry.unregister("refund")
