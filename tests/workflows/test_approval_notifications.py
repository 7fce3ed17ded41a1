"""Approval notifications: one outbox row per event, taken once (a crash after taking
it loses the notification rather than doubling it), its signal and its email; hostile
``await_approval`` reminder/escalation arguments and ``APPROVAL_EMAILS`` values."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core import mail
from django.core.checks import run_checks
from django.utils import timezone

from flowwarden_django.models import Approval, ApprovalNotification
from flowwarden_django.workflows import Hibernated, await_approval, workflow_registry
from flowwarden_django.workflows.waiting.approvals import approval_requested, notify
from flowwarden_django.workflows.waiting.approvals.emails import (
    approval_link,
    recipient_emails,
    valid_email_setting,
)
from flowwarden_django.workflows.waiting.approvals.notifications import (
    DELIVER_GRACE,
    deliver,
    deliver_pending,
)
from tests.support.reminder_workflow import define_reminders

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def reminders() -> Any:
    yield define_reminders("notified-invoices")
    workflow_registry.unregister("notified-invoices")


@pytest.fixture
def emails_on(settings: Any) -> None:
    settings.FLOWWARDEN = {**settings.FLOWWARDEN, "APPROVAL_EMAILS": True}


def pending(definition: Any, **state: Any) -> Approval:
    started = definition.start({"invoice": "INV-1", **state})
    assert isinstance(started.result, Hibernated)
    return Approval.objects.get(coordination_id=started.coordination_id)


def team() -> None:
    finance = Group.objects.create(name="finance")
    User.objects.create_user("alice", email="alice@example.com")
    User.objects.create_user("bob", email="Bob@Example.com").groups.add(finance)
    User.objects.create_user("carol", email="").groups.add(finance)  # no email
    gone = User.objects.create_user("dan", email="dan@example.com")
    gone.is_active = False
    gone.save()
    gone.groups.add(finance)


def test_a_request_is_notified_once_with_its_signal_and_email(
    reminders: Any, emails_on: None
) -> None:
    team()
    seen: list[tuple[str, int]] = []

    def receiver(*, event: str, number: int, approval: Approval, **_: Any) -> None:
        seen.append((event, number))

    approval_requested.connect(receiver)
    try:
        approval = pending(reminders)
    finally:
        approval_requested.disconnect(receiver)
    assert seen == [("requested", 0)]
    (row,) = ApprovalNotification.objects.filter(approval=approval)
    assert row.recipients == [{"user": "alice"}, {"group": "finance"}]
    assert row.sending_at is not None and row.sent_at is not None and row.error == ""
    assert sorted(m.to[0] for m in mail.outbox) == ["Bob@example.com", "alice@example.com"]
    assert all(f"/approvals/{approval.pk}/" in m.body for m in mail.outbox)
    # The same event again (a retry, a sweep restoring the approval): nothing new.
    assert notify(approval, "requested") is None
    assert deliver(row.pk, using="default") is False
    assert len(mail.outbox) == 2 and seen == [("requested", 0)]


def test_a_taken_notification_is_never_sent_again(reminders: Any, emails_on: None) -> None:
    """A sender that died after taking the row: the email is lost, not doubled."""
    team()
    approval = pending(reminders)
    mail.outbox.clear()
    old = timezone.now() - DELIVER_GRACE - timedelta(seconds=1)
    taken = ApprovalNotification.objects.create(
        approval=approval, event="reminded", number=1, created_at=old, sending_at=old
    )
    untaken = ApprovalNotification.objects.create(
        approval=approval,
        event="reminded",
        number=2,
        created_at=old,
        recipients=[{"user": "alice"}],
    )
    assert deliver_pending(using="default") == [untaken.pk]
    assert deliver_pending(using="default") == []
    assert [m.to for m in mail.outbox] == [["alice@example.com"]]
    assert ApprovalNotification.objects.get(pk=taken.pk).sent_at is None


def test_a_failing_email_is_recorded_not_retried(reminders: Any, settings: Any) -> None:
    settings.FLOWWARDEN = {**settings.FLOWWARDEN, "APPROVAL_EMAILS": True}
    settings.EMAIL_BACKEND = "tests.workflows.test_approval_notifications.BrokenBackend"
    team()
    approval = pending(reminders)  # the request succeeds all the same
    row = ApprovalNotification.objects.get(approval=approval)
    assert "RuntimeError: the mail server is away" in row.error and row.sent_at is not None


class BrokenBackend:
    """An email backend that always fails."""

    def __init__(self, **_: Any) -> None:
        pass

    def send_messages(self, messages: Any) -> int:
        raise RuntimeError("the mail server is away")


def test_without_the_setting_no_email_but_the_signal(reminders: Any) -> None:
    team()
    approval = pending(reminders)
    assert mail.outbox == []
    assert ApprovalNotification.objects.get(approval=approval).sent_at is not None


def test_recipients_skip_users_without_email_and_inactive_ones() -> None:
    team()
    everyone = [{"user": "alice"}, {"user": "nobody"}, {"group": "finance"}, {"group": "none"}]
    assert sorted(recipient_emails(everyone)) == ["Bob@example.com", "alice@example.com"]
    assert recipient_emails([]) == [] and recipient_emails(["junk", 5]) == []  # type: ignore[list-item]


def test_the_link_is_a_path_without_base_url_and_empty_when_unrouted(settings: Any) -> None:
    settings.FLOWWARDEN = {**settings.FLOWWARDEN, "APPROVAL_EMAILS": True}
    assert approval_link("7c0f4d1e-1111-4222-8333-944455556666").startswith("/approvals/")
    settings.FLOWWARDEN = {**settings.FLOWWARDEN, "APPROVAL_EMAILS": {"URL_NAME": "no-such-url"}}
    assert approval_link("7c0f4d1e-1111-4222-8333-944455556666") == ""


HOSTILE_ARGUMENTS = [
    {"remind_every": 0},
    {"remind_every": -5},
    {"remind_every": timedelta(0)},
    {"remind_every": True},
    {"remind_every": "2s"},
    {"remind_every": math.nan},
    {"remind_every": math.inf},
    {"remind_every": 10**12},
    {"remind_every": [2]},
    {"escalate_after": 5},  # without escalate_to
    {"escalate_to": "managers"},  # without escalate_after
    {"escalate_after": 5, "escalate_to": ""},
    {"escalate_after": 5, "escalate_to": []},
    {"escalate_after": 5, "escalate_to": "m" * 151},
    {"escalate_after": 5, "escalate_to": "man\x00agers"},
    {"escalate_after": 5, "escalate_to": ["ok", "x" * 151]},
    {"escalate_after": 5, "escalate_to": ["a\x00b"]},
    {"escalate_after": 5, "escalate_to": [5]},
    {"escalate_after": 5, "escalate_to": b"managers"},
    {"escalate_after": 5, "escalate_to": {"group": "managers"}},
    {"escalate_after": 5, "escalate_to": 12},
    {"escalate_after": -1, "escalate_to": "managers"},
    {"escalate_after": math.nan, "escalate_to": "managers"},
    {"escalate_after": timedelta(days=366 * 101), "escalate_to": "managers"},
]


@pytest.mark.parametrize("arguments", HOSTILE_ARGUMENTS, ids=range(len(HOSTILE_ARGUMENTS)))
def test_hostile_reminder_arguments_are_refused(arguments: dict[str, Any]) -> None:
    with pytest.raises((TypeError, ValueError)):
        await_approval({}, "?", **arguments)


def test_good_reminder_arguments_go_into_the_request() -> None:
    pause = await_approval(
        {},
        "?",
        remind_every=timedelta(hours=4),
        escalate_after=7200,
        escalate_to=[" mike ", "ann", "mike"],
    )
    request = pause.request()
    assert request["remind_every"] == 4 * 3600 and request["escalate_after"] == 7200
    assert request["escalate_to_users"] == ["ann", "mike"] and request["escalate_to_group"] == ""
    assert type(pause).from_request({}, request) == pause
    group = await_approval({}, "?", escalate_after=1, escalate_to="managers").request()
    assert group["escalate_to_group"] == "managers" and group["escalate_to_users"] == []


HOSTILE_SETTINGS = [
    "yes",
    5,
    ["FROM_EMAIL"],
    {"FROM": "x@example.com"},
    {"FROM_EMAIL": ""},
    {"FROM_EMAIL": 5},
    {"FROM_EMAIL": "a\x00b@example.com"},
    {"BASE_URL": "javascript:alert(1)"},
    {"BASE_URL": "ftp://example.com"},
    {"URL_NAME": "  "},
    {"URL_NAME": "x" * 501},
    {"SUBJECT_PREFIX": "hi\nBcc: everyone@example.com"},
]


@pytest.mark.parametrize("value", HOSTILE_SETTINGS, ids=range(len(HOSTILE_SETTINGS)))
def test_hostile_email_settings_fail_the_check(settings: Any, value: Any) -> None:
    assert not valid_email_setting(value)
    settings.FLOWWARDEN = {**settings.FLOWWARDEN, "APPROVAL_EMAILS": value}
    errors = [m for m in run_checks(databases=[]) if "APPROVAL_EMAILS" in m.msg]
    assert [m.id for m in errors] == ["flowwarden_django.E012"] and errors[0].hint


@pytest.mark.parametrize(
    "value",
    [None, False, True, {}, {"FROM_EMAIL": "flow@example.com", "BASE_URL": "https://x.example"}],
)
def test_good_email_settings_pass_the_check(settings: Any, value: Any) -> None:
    assert valid_email_setting(value)
    settings.FLOWWARDEN = {**settings.FLOWWARDEN, "APPROVAL_EMAILS": value}
    assert not [m for m in run_checks(databases=[]) if "APPROVAL_EMAILS" in m.msg]


def test_a_hostile_prompt_stays_in_the_body_and_makes_a_one_line_subject(reminders: Any) -> None:
    from flowwarden_django.workflows.waiting.approvals.emails import message_text

    team()
    approval = pending(reminders)
    approval.prompt = "Pay?\r\nBcc: everyone@example.com\n" + "x" * 5000
    row = ApprovalNotification(approval=approval, event="reminded", number=3)
    subject, body = message_text(row)
    assert "\n" not in subject and "\r" not in subject and len(subject) <= 200
    assert subject.startswith("[flowwarden] Reminder: approval waiting (reminder 3): Pay? Bcc:")
    assert "Bcc: everyone@example.com" in body and f"/approvals/{approval.pk}/" in body
    message = mail.EmailMessage(subject, body, None, ["alice@example.com"]).message()
    assert message["Bcc"] is None
