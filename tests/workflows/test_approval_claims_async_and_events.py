"""Claims (issue 49), continued: the async twins ``aclaim``, ``arelease`` and
``areassign`` (the same results, errors and audit as the sync calls, on SQLite and
PostgreSQL); a reassign notifies its new deciders (``assigned``: its signal and one
email each, once per reassign, retries and sweeps included); an escalation releases a
claim held at the time (audited as ``released`` by the system)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group, Permission, User
from django.core import mail
from django.db import connections
from django.utils import timezone

from flowwarden_django.models import Approval, ApprovalEvent, ApprovalNotification
from flowwarden_django.workflows import (
    ApprovalConflictError,
    ApprovalPermissionError,
    UnknownApprovalError,
    WorkflowDefinition,
    aclaim,
    approve,
    areassign,
    arelease,
    claim,
    reassign,
    release,
    workflow_registry,
)
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.runs.records import RunStatus
from flowwarden_django.workflows.waiting.approvals import (
    approval_assigned,
    remind_and_escalate_due,
)
from flowwarden_django.workflows.waiting.approvals.notifications import (
    deliver,
    deliver_pending,
)
from tests.support.approval_mail import people as mail_people
from tests.support.lanes import lane_marks
from tests.support.refund_workflow import define_refunds
from tests.support.reminder_workflow import define_reminders

pytestmark = pytest.mark.django_db(transaction=True)

POSTGRES = pytest.param("postgres", marks=lane_marks("postgres", databases=["default", "postgres"]))
ALIASES = pytest.mark.parametrize("alias", ["default", POSTGRES])


# -- the async twins -----------------------------------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def _close_executor_connections() -> AsyncIterator[None]:
    """The thread-sensitive executor keeps its connections; close them after the test."""
    yield
    await sync_to_async(connections.close_all, thread_sensitive=True)()


@pytest.fixture
def refunds(alias: str) -> Iterator[WorkflowDefinition]:
    yield define_refunds("claim-refund", OrmSnapshotStore(using=alias), using=alias)
    workflow_registry.unregister("claim-refund")


def team(alias: str) -> dict[str, User]:
    """alice (assignee), bob (finance), carol (nobody), erin (reassign_approval)."""
    finance = Group.objects.db_manager(alias).create(name="finance")
    made = {
        name: User.objects.db_manager(alias).create_user(name, password="pw")
        for name in ("alice", "bob", "carol", "erin")
    }
    made["bob"].groups.add(finance)
    made["erin"].user_permissions.add(
        Permission.objects.db_manager(alias).get(codename="reassign_approval")
    )
    made["erin"] = User.objects.db_manager(alias).get(pk=made["erin"].pk)
    return made


def pending(definition: WorkflowDefinition, alias: str) -> Approval:
    started = definition.start({"amount": 500})
    assert started.result.status == RunStatus.WAITING
    return Approval.objects.using(alias).get(coordination_id=started.coordination_id)


def audit(approval: Approval, alias: str) -> list[tuple[str, str, Any]]:
    events = ApprovalEvent.objects.using(alias).filter(approval_id=approval.pk).order_by("id")
    return list(events.values_list("action", "actor", "payload"))


def state(approval: Approval, alias: str) -> tuple[Any, ...]:
    row = Approval.objects.using(alias).get(pk=approval.pk)
    return row.claimed_by, row.assignees, row.group


def in_sync(function: Any, *args: Any, **kwargs: Any) -> Any:
    return sync_to_async(function, thread_sensitive=True)(*args, **kwargs)


@ALIASES
@pytest.mark.anyio
@pytest.mark.usefixtures("_close_executor_connections")
async def test_aclaim_arelease_areassign_are_claim_release_reassign(
    alias: str, refunds: WorkflowDefinition
) -> None:
    people = await in_sync(team, alias)
    sync_one = await in_sync(pending, refunds, alias)
    async_one = await in_sync(pending, refunds, alias)

    steps: list[tuple[Any, Any, tuple[Any, ...], dict[str, Any]]] = [
        (claim, aclaim, (people["bob"],), {"comment": "mine"}),
        (claim, aclaim, (people["bob"],), {}),  # again: a no-op
        (release, arelease, (people["bob"],), {}),
        (claim, aclaim, (people["alice"],), {}),
        (reassign, areassign, (), {"by": people["erin"], "to_users": ["carol"], "comment": "x"}),
    ]
    for sync_call, async_call, args, options in steps:
        sync_result = await in_sync(sync_call, sync_one.pk, *args, using=alias, **options)
        result = await async_call(async_one.pk, *args, using=alias, **options)
        assert result.changed == sync_result.changed
        assert result.approval.claimed_by == sync_result.approval.claimed_by
        assert await in_sync(state, async_one, alias) == await in_sync(state, sync_one, alias)
    assert await in_sync(state, async_one, alias) == ("", ["carol"], "")
    sync_trail = await in_sync(audit, sync_one, alias)
    assert await in_sync(audit, async_one, alias) == sync_trail
    assert [(action, actor) for action, actor, _ in sync_trail] == [
        ("requested", ""),
        ("claimed", "bob"),
        ("released", "bob"),
        ("claimed", "alice"),
        ("reassigned", "erin"),
    ]


@ALIASES
@pytest.mark.anyio
@pytest.mark.usefixtures("_close_executor_connections")
async def test_the_async_twins_raise_the_same_errors(
    alias: str, refunds: WorkflowDefinition
) -> None:
    people = await in_sync(team, alias)
    approval = await in_sync(pending, refunds, alias)
    with pytest.raises(ApprovalPermissionError):  # carol may not decide it
        await aclaim(approval.pk, people["carol"], using=alias)
    await aclaim(approval.pk, people["alice"], using=alias)
    with pytest.raises(ApprovalConflictError) as taken:
        await aclaim(approval.pk, people["bob"], using=alias)
    assert taken.value.code == "approval_claimed"
    with pytest.raises(ApprovalConflictError):  # not bob's claim to give back
        await arelease(approval.pk, people["bob"], using=alias)
    with pytest.raises(ApprovalPermissionError):  # no reassign_approval
        await areassign(approval.pk, by=people["bob"], to_users=["carol"], using=alias)
    with pytest.raises(ValueError):  # no target: refused before anything is read
        await areassign(approval.pk, by=people["erin"], using=alias)
    with pytest.raises(UnknownApprovalError):
        await aclaim(uuid.uuid4(), people["alice"], using=alias)
    with pytest.raises(UnknownApprovalError):
        await areassign("not-a-uuid", by=people["erin"], to_group="finance", using=alias)
    assert await in_sync(state, approval, alias) == ("alice", ["alice"], "finance")


# -- reassign notifies -----------------------------------------------------------------------


@pytest.fixture
def emails_on(settings: Any) -> None:
    settings.FLOWWARDEN = {**settings.FLOWWARDEN, "APPROVAL_EMAILS": True}
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"


@pytest.fixture
def reminding() -> Iterator[WorkflowDefinition]:
    yield define_reminders("claim-invoices")
    workflow_registry.unregister("claim-invoices")


def reassigner() -> User:
    user = User.objects.create_user("erin", email="erin@example.com")
    user.user_permissions.add(Permission.objects.get(codename="reassign_approval"))
    return User.objects.get(pk=user.pk)


def start(definition: WorkflowDefinition, **state: Any) -> Approval:
    started = definition.start({"invoice": "INV-7", **state})
    assert started.result.status == RunStatus.WAITING
    return Approval.objects.get(coordination_id=started.coordination_id)


def assigned_mails() -> list[list[str]]:
    return sorted(m.to for m in mail.outbox if "assigned to you" in m.subject)


def test_a_reassign_notifies_its_new_deciders_once(reminding: Any, emails_on: None) -> None:
    team = mail_people()  # alice, bob (finance), carol (finance, no email), mike (managers)
    erin = reassigner()
    approval = start(reminding)
    seen: list[tuple[str, int, Any]] = []

    def receiver(*, event: str, number: int, recipients: Any, **_: Any) -> None:
        seen.append((event, number, recipients))

    approval_assigned.connect(receiver)
    try:
        reassign(approval.pk, by=erin, to_users=["mike", "alice"], comment="holiday")
        assert seen == [("assigned", 1, [{"user": "alice"}, {"user": "mike"}])]
        assert assigned_mails() == [["alice@example.com"], ["mike@example.com"]]
        link = f"/approvals/{approval.pk}/"
        assert all(link in m.body for m in mail.outbox if "assigned to you" in m.subject)

        # A second reassign is a second event: notified too, to its own deciders.
        mail.outbox.clear()
        reassign(approval.pk, by=erin, to_group="finance")
        assert seen[1:] == [("assigned", 2, [{"group": "finance"}])]
        assert assigned_mails() == [["bob@example.com"]]  # carol has no address

        # Retries and sweeps find the rows taken: nothing sent again.
        mail.outbox.clear()
        for row in ApprovalNotification.objects.filter(approval=approval):
            assert not deliver(row.pk, using="default")
        assert deliver_pending(using="default") == []
        assert mail.outbox == [] and len(seen) == 2
    finally:
        approval_assigned.disconnect(receiver)

    rows = ApprovalNotification.objects.filter(approval=approval, event="assigned")
    assert list(rows.order_by("number").values_list("number", flat=True)) == [1, 2]
    assert all(row.sent_at is not None and row.error == "" for row in rows)
    assert approve(approval.pk, team["bob"]).run_result.status == "completed"


def test_a_refused_reassign_notifies_nobody(reminding: Any, emails_on: None) -> None:
    team = mail_people()
    approval = start(reminding)
    mail.outbox.clear()
    with pytest.raises(ApprovalPermissionError):
        reassign(approval.pk, by=team["bob"], to_users=["mike"])
    assert not ApprovalNotification.objects.filter(approval=approval, event="assigned").exists()
    assert assigned_mails() == []


def test_a_reassign_with_emails_off_still_sends_its_signal(reminding: Any) -> None:
    mail_people()
    erin = reassigner()
    approval = start(reminding)
    seen: list[int] = []

    def receiver(*, number: int, **_: Any) -> None:
        seen.append(number)

    approval_assigned.connect(receiver)
    try:
        reassign(approval.pk, by=erin, to_users=["mike"])
    finally:
        approval_assigned.disconnect(receiver)
    assert seen == [1] and assigned_mails() == []


# -- escalation releases a claim -------------------------------------------------------------


def test_an_escalation_releases_the_claim_held_then(reminding: Any, emails_on: None) -> None:
    team = mail_people()
    approval = start(reminding, escalate_after=3600, escalate_to="managers")
    claim(approval.pk, team["bob"])
    later = timezone.now() + timedelta(hours=2)
    assert remind_and_escalate_due(now=later).escalated == [str(approval.pk)]
    approval.refresh_from_db()
    assert approval.group == "managers"
    assert approval.claimed_by == "" and approval.claimed_at is None
    events = ApprovalEvent.objects.filter(approval=approval).order_by("id")
    trail = list(events.values_list("action", "actor"))
    assert trail == [("requested", ""), ("claimed", "bob"), ("escalated", ""), ("released", "")]
    released = events.get(action="released")
    assert released.payload == {"claimed_by": "bob"}
    assert "bob" in released.detail and "escalated" in released.detail
    assert released.at == events.get(action="escalated").at == approval.escalated_at
    # bob (finance) lost it; mike (managers) claims and decides it.
    with pytest.raises(ApprovalPermissionError):
        claim(approval.pk, team["bob"])
    assert claim(approval.pk, team["mike"]).changed
    assert approve(approval.pk, team["mike"]).run_result.status == "completed"


def test_an_escalation_without_a_claim_records_no_release(reminding: Any) -> None:
    mail_people()
    approval = start(reminding, escalate_after=3600, escalate_to=["mike"])
    later = timezone.now() + timedelta(hours=2)
    assert remind_and_escalate_due(now=later).escalated == [str(approval.pk)]
    actions = ApprovalEvent.objects.filter(approval=approval).values_list("action", flat=True)
    assert "released" not in set(actions)


def test_an_escalation_to_users_releases_a_claim_too(reminding: Any) -> None:
    team = mail_people()
    approval = start(reminding, escalate_after=3600, escalate_to=["mike"])
    claim(approval.pk, team["alice"])
    later = timezone.now() + timedelta(hours=2)
    remind_and_escalate_due(now=later)
    approval.refresh_from_db()
    assert approval.claimed_by == "" and approval.assignees == ["alice", "mike"]
    assert approve(approval.pk, team["mike"]).run_result.status == "completed"


def race_claim_and_escalation(approval: Approval, claimant: User, alias: str) -> dict[str, str]:
    """*claimant* claims *approval* while a sweep escalates it, at once (a barrier)."""
    barrier = threading.Barrier(2)
    later = timezone.now() + timedelta(hours=2)
    outcomes: dict[str, str] = {}

    def claiming() -> None:
        try:
            barrier.wait()
            claim(approval.pk, claimant, using=alias)
            outcomes["claim"] = "claimed"
        except (ApprovalPermissionError, ApprovalConflictError) as exc:
            outcomes["claim"] = exc.code
        finally:
            connections.close_all()

    def escalating() -> None:
        try:
            barrier.wait()
            done = remind_and_escalate_due(using=alias, now=later).escalated
            outcomes["escalation"] = "escalated" if done else "none"
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claiming), threading.Thread(target=escalating)]
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
def test_a_claim_racing_an_escalation_never_survives_it(alias: str) -> None:
    """Either the claim comes first (and the escalation releases it, audited) or the
    escalation does (and the old group's member may no longer claim): no claim is left."""
    definition = define_reminders("claim-race-invoices", OrmSnapshotStore(using=alias), using=alias)
    try:
        team = mail_people(alias)
        for _ in range(8):
            started = definition.start(
                {"invoice": "INV-9", "escalate_after": 3600, "escalate_to": "managers"}
            )
            approval = Approval.objects.using(alias).get(coordination_id=started.coordination_id)
            outcomes = race_claim_and_escalation(approval, team["bob"], alias)
            assert outcomes["escalation"] == "escalated", outcomes
            row = Approval.objects.using(alias).get(pk=approval.pk)
            assert row.claimed_by == "" and row.group == "managers", outcomes
            events = ApprovalEvent.objects.using(alias).filter(approval_id=approval.pk)
            released = list(events.filter(action="released").values_list("actor", "payload"))
            if outcomes["claim"] == "claimed":
                assert released == [("", {"claimed_by": "bob"})], outcomes
            else:
                assert outcomes["claim"] == "approval_forbidden" and released == [], outcomes
    finally:
        workflow_registry.unregister("claim-race-invoices")
