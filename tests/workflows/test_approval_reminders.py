"""Reminders and escalation of approvals (``await_approval(remind_every=...,
escalate_after=..., escalate_to=...)``), driven by the in-process recovery sweep, each
emailed once: through Django's locmem backend and through a real SMTP server; and two
sweepers racing on PostgreSQL send each reminder and escalation once."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.core import mail
from django.utils import timezone

from flowwarden_django.models import Approval, ApprovalEvent, ApprovalNotification
from flowwarden_django.workflows import Hibernated, Workflow, workflow_registry
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.operations.recovery import recover_in_every_database
from flowwarden_django.workflows.operations.sweeper import SweepThread
from flowwarden_django.workflows.waiting.approvals import (
    approval_escalated,
    approval_reminded,
    approval_requested,
    approve,
    remind_and_escalate_due,
)
from tests.support.approval_mail import Inbox, expected_mails, key_of, people, smtp_server
from tests.support.lanes import lane_marks
from tests.support.polling import wait_until
from tests.support.reminder_workflow import define_reminders

pytestmark = pytest.mark.django_db(transaction=True)

EMAILS = {"FROM_EMAIL": "flow@example.com", "BASE_URL": "https://ops.example.com/"}


@pytest.fixture
def reminders() -> Any:
    yield define_reminders("invoices")
    workflow_registry.unregister("invoices")


@pytest.fixture
def emails_on(settings: Any) -> None:
    settings.FLOWWARDEN = {**settings.FLOWWARDEN, "APPROVAL_EMAILS": EMAILS}


class SignalLog:
    """Counts the approval signals received, by (event, number)."""

    def __init__(self) -> None:
        self.seen: Counter[tuple[str, int]] = Counter()
        self.lock = threading.Lock()

    def __call__(self, *, event: str, number: int, **_: Any) -> None:
        with self.lock:
            self.seen[(event, number)] += 1

    def __enter__(self) -> SignalLog:
        for signal in (approval_requested, approval_reminded, approval_escalated):
            signal.connect(self, weak=False)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signal in (approval_requested, approval_reminded, approval_escalated):
            signal.disconnect(self)


def in_process_sweep() -> SweepThread:
    """The in-process recovery sweep (``flowwarden_workflows recover --every``'s)."""

    def continue_run(run: Any) -> None:
        Workflow.for_coordination(run.coordination_id, using=run._state.db).run()

    return SweepThread(lambda: recover_in_every_database(continue_run), interval=0.2)


def start(definition: Any, **state: Any) -> Approval:
    started = definition.start({"invoice": "INV-7", **state})
    assert isinstance(started.result, Hibernated)
    using = definition.using or "default"
    return Approval.objects.using(using).get(coordination_id=started.coordination_id)


def run_until_escalated(reminders: Any) -> Approval:
    """Start a run reminding every 2 s and escalating after 5 s; sweep in process until
    it escalated after its second reminder; the approval."""
    approval = start(reminders, remind_every=2, escalate_after=5, escalate_to="managers")
    assert approval.next_reminder_at == approval.requested_at + timedelta(seconds=2)
    assert approval.escalate_at == approval.requested_at + timedelta(seconds=5)
    sweeper = in_process_sweep()
    sweeper.start()
    try:
        wait_until(
            lambda: Approval.objects.filter(
                pk=approval.pk, reminders_sent__gte=2, escalated_at__isnull=False
            ).exists(),
            "two reminders and the escalation",
        )
    finally:
        sweeper.stop()
    approval.refresh_from_db()
    return approval


def check_audit(approval: Approval) -> None:
    """Reminder n and the escalation happened no sooner than due, each once, audited
    and notified once."""
    reminded = ApprovalEvent.objects.filter(approval=approval, action="reminded").order_by("at")
    numbers = [event.payload["number"] for event in reminded]
    assert numbers == list(range(1, approval.reminders_sent + 1))
    for event in reminded:
        assert event.at >= approval.requested_at + event.payload["number"] * timedelta(seconds=2)
    (escalation,) = ApprovalEvent.objects.filter(approval=approval, action="escalated")
    assert escalation.at >= approval.requested_at + timedelta(seconds=5)
    assert escalation.payload == {
        "from_group": "finance",
        "to_group": "managers",
        "added_assignees": [],
    }
    assert approval.group == "managers" and approval.escalated_at == escalation.at
    rows = ApprovalNotification.objects.filter(approval=approval)
    events = sorted((row.event, row.number) for row in rows)
    assert events == sorted(
        [("requested", 0), ("escalated", 0)]
        + [("reminded", n) for n in range(1, approval.reminders_sent + 1)]
    )
    wait_until(lambda: not rows.filter(sent_at=None).exists(), "every notification sent")
    assert not rows.exclude(error="").exists()


def test_reminders_and_one_escalation_are_emailed_once_locmem(
    reminders: Any, emails_on: None
) -> None:
    team = people()
    with SignalLog() as signals:
        approval = run_until_escalated(reminders)
        check_audit(approval)
    got = Counter(key_of(m.subject, address) for m in mail.outbox for address in m.to)
    assert got == expected_mails(approval)
    assert set(signals.seen.values()) == {1}
    assert set(signals.seen) == {(e[0].split("#")[0], int(e[0].split("#")[1])) for e in got}
    link = f"https://ops.example.com/approvals/{approval.pk}/"
    assert all(link in m.body and m.from_email == "flow@example.com" for m in mail.outbox)
    # After the escalation the managers decide it.
    assert approve(approval.pk, team["mike"]).run_result.status == "completed"


@pytest.fixture
def smtp(settings: Any) -> Any:
    with smtp_server() as inbox:
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", inbox.port
        settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
        yield inbox


def test_reminders_and_one_escalation_are_emailed_once_over_smtp(
    reminders: Any, emails_on: None, smtp: Inbox
) -> None:
    people()
    approval = run_until_escalated(reminders)
    check_audit(approval)
    assert smtp.received() == expected_mails(approval)
    assert all(f"/approvals/{approval.pk}/" in body for body in smtp.bodies())


def test_escalation_to_users_adds_them_as_assignees(reminders: Any, emails_on: None) -> None:
    team = people()
    approval = start(reminders, escalate_after=1, escalate_to=["mike", "carol"])
    assert approval.next_reminder_at is None and approval.remind_every is None
    wait_until(lambda: timezone.now() >= approval.escalate_at, "the escalation's time")
    assert remind_and_escalate_due().escalated == [str(approval.pk)]
    assert remind_and_escalate_due().escalated == []  # once
    approval.refresh_from_db()
    assert approval.group == "finance"
    assert approval.assignees == ["alice", "carol", "mike"]
    (row,) = ApprovalNotification.objects.filter(approval=approval, event="escalated")
    assert row.recipients == [{"user": "carol"}, {"user": "mike"}]
    assert [m.to for m in mail.outbox if "escalated" in m.subject] == [["mike@example.com"]]
    assert approve(approval.pk, team["carol"]).run_result.status == "completed"


def test_a_decided_approval_is_not_reminded(reminders: Any) -> None:
    team = people()
    approval = start(reminders, remind_every=1)
    approve(approval.pk, team["alice"])
    later = timezone.now() + timedelta(seconds=5)
    assert remind_and_escalate_due(now=later).reminded == []


def test_a_sweep_that_was_away_sends_one_reminder_not_a_burst(reminders: Any) -> None:
    people()
    approval = start(reminders, remind_every=2)
    later = approval.requested_at + timedelta(seconds=61)
    assert remind_and_escalate_due(now=later).reminded == [f"{approval.pk}#1"]
    approval.refresh_from_db()
    assert approval.reminders_sent == 1
    assert approval.next_reminder_at == approval.requested_at + timedelta(seconds=62)
    assert remind_and_escalate_due(now=later).reminded == []


@pytest.mark.parametrize(
    "alias",
    [pytest.param("postgres", marks=lane_marks("postgres", databases=["default", "postgres"]))],
)
def test_two_sweepers_racing_send_each_reminder_and_escalation_once(
    alias: str, emails_on: None
) -> None:
    definition = define_reminders("racing-invoices", OrmSnapshotStore(using=alias), using=alias)
    try:
        people()  # the users live where the router keeps them ("default")
        approvals = [
            start(
                definition,
                invoice=f"INV-{n}",
                remind_every=60,
                escalate_after=60,
                escalate_to="managers",
            )
            for n in range(8)
        ]
        mail.outbox.clear()
        with SignalLog() as signals:
            for round_ in (1, 2):  # two due reminders, one escalation
                later = timezone.now() + timedelta(seconds=61 * round_)
                barrier = threading.Barrier(2)
                results: list[Any] = []

                def sweep(
                    later: Any = later, barrier: Any = barrier, results: Any = results
                ) -> None:
                    from django.db import connections

                    try:
                        barrier.wait()
                        results.append(remind_and_escalate_due(alias, now=later))
                    finally:
                        connections.close_all()

                threads = [threading.Thread(target=sweep) for _ in range(2)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(60)
                reminded = [r for result in results for r in result.reminded]
                escalated = [e for result in results for e in result.escalated]
                assert len(results) == 2
                assert sorted(reminded) == sorted(f"{a.pk}#{round_}" for a in approvals)
                assert sorted(escalated) == (
                    sorted(str(a.pk) for a in approvals) if round_ == 1 else []
                )
        for approval in approvals:
            row = Approval.objects.using(alias).get(pk=approval.pk)
            assert row.reminders_sent == 2 and row.group == "managers"
            events = ApprovalEvent.objects.using(alias).filter(approval=approval)
            assert events.filter(action="reminded").count() == 2
            assert events.filter(action="escalated").count() == 1
        assert set(signals.seen) == {("reminded", 1), ("reminded", 2), ("escalated", 0)}
        assert signals.seen == Counter(
            {("reminded", 1): 8, ("reminded", 2): 8, ("escalated", 0): 8}
        )
        subjects = Counter((m.subject, tuple(m.to)) for m in mail.outbox)
        assert len(mail.outbox) == 8 * (2 + 2 + 1)  # alice and bob twice, mike once
        assert set(subjects.values()) == {1}
    finally:
        workflow_registry.unregister("racing-invoices")
