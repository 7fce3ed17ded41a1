"""The approvals admin shows due and escalation times (issue 49, item 5): the
changelist's "requested" column says when a pending approval expires and escalates
(or escalated) and whether it is overdue; its page shows the escalation and the
reminders, read-only."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from flowwarden_django.models import Approval
from tests.admin.test_approvals import CHANGELIST, change_url, page, pending, refunds  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def admin_client_() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


def test_the_changelist_and_the_page_show_the_deadlines(refunds, admin_client_):  # noqa: F811
    now = timezone.now()
    _cid, approval = pending(refunds)
    escalate_at = now + timedelta(hours=3, minutes=1)
    Approval.objects.filter(pk=approval.pk).update(
        expires_at=now + timedelta(days=1, minutes=1),
        escalate_at=escalate_at,
        escalate_to_group="bosses",
        remind_every=timedelta(hours=1),
        next_reminder_at=now + timedelta(minutes=30),
        reminders_sent=2,
    )
    body = page(admin_client_.get(CHANGELIST))
    assert "expires <time" in body and "escalates <time" in body and ">overdue<" not in body
    detail = page(admin_client_.get(change_url(approval)))
    assert "escalates at" in detail and escalate_at.isoformat() in detail
    assert "group bosses" in detail and "every 1:00:00; 2 sent" in detail

    escalated_at = now - timedelta(minutes=2)
    Approval.objects.filter(pk=approval.pk).update(
        escalate_at=now - timedelta(minutes=3), escalated_at=escalated_at
    )
    body = page(admin_client_.get(CHANGELIST))
    assert "escalated <time" in body and ">overdue<" in body
    detail = page(admin_client_.get(change_url(approval)))
    assert "escalated at" in detail and escalated_at.isoformat() in detail
    assert ">overdue<" in detail
    # Nothing to edit: the fields are read-only.
    assert 'name="escalate_at"' not in detail and 'name="reminders_sent"' not in detail
