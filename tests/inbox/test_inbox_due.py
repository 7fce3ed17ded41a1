"""The inbox's "overdue" filter and its due and escalation times (issue 49, item 5),
through Django's test client: overdue is pending and past its escalation time or its
expiry; the list and an approval's page show the times in words, each in a
``<time datetime>`` with the exact time."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from flowwarden_django.models import Approval
from flowwarden_django.workflows.waiting.approvals.due import due_times, overdue_q
from tests.api.helpers import on_lane, postgres_lane  # noqa: F401  (the fixture)
from tests.inbox.test_inbox import INBOX, logged_in, pending, people, refunds  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def with_times(approval: Approval, **times: object) -> Approval:
    Approval.objects.filter(pk=approval.pk).update(**times)
    return Approval.objects.get(pk=approval.pk)


def test_overdue_is_pending_past_its_escalation_or_its_expiry(refunds, people):  # noqa: F811
    now = timezone.now()
    hour = timedelta(hours=1)
    calm = pending(refunds, 1)
    later = with_times(pending(refunds, 2), escalate_at=now + hour, expires_at=now + 2 * hour)
    to_escalate = with_times(pending(refunds, 3), escalate_at=now - hour)
    expired = with_times(pending(refunds, 4), expires_at=now - hour)
    escalated = with_times(pending(refunds, 5), escalate_at=now - hour, escalated_at=now)
    decided = pending(refunds, 6)
    client = logged_in(people["bob"])
    client.post(f"{INBOX}{decided.pk}/", {"approve": "1"}, follow=True)  # its message read
    with_times(decided, expires_at=now - hour)

    overdue = set(Approval.objects.filter(overdue_q()).values_list("pk", flat=True))
    assert overdue == {to_escalate.pk, expired.pk, escalated.pk}
    for approval in (calm, later):
        assert not due_times(approval).overdue
    # Overdue implies pending, whatever the status chosen.
    for status in ("", "all"):
        page = client.get(INBOX, {"due": "overdue", "status": status}).content.decode()
        shown = {n for n in range(1, 7) if f"Refund {n}?" in page}
        assert shown == {3, 4, 5}, status
        assert page.count('class="flowwarden-overdue-row"') == 3
    everything = client.get(INBOX).content.decode()
    assert all(f"Refund {n}?" in everything for n in range(1, 6))
    assert 'value="overdue" selected' in client.get(INBOX, {"due": "overdue"}).content.decode()


def test_the_overdue_filter_is_one_query_on_the_indexed_columns(refunds, people):  # noqa: F811
    with CaptureQueriesContext(connection) as queries:
        list(Approval.objects.filter(overdue_q()).values_list("pk", flat=True))
    (sql,) = [q["sql"] for q in queries.captured_queries]
    assert '"escalate_at" <=' in sql and '"expires_at" <=' in sql and '"status" =' in sql


def test_the_list_and_the_page_show_due_and_escalation_times(refunds, people):  # noqa: F811
    now = timezone.now()
    due_at, escalate_at = now + timedelta(days=2, minutes=1), now + timedelta(hours=5, minutes=1)
    approval = with_times(
        pending(refunds, 7), expires_at=due_at, escalate_at=escalate_at, escalate_to_group="bosses"
    )
    client = logged_in(people["bob"])
    page = client.get(INBOX).content.decode()
    assert ">Due</th>" in page and ">Escalates</th>" in page
    assert f'<time datetime="{due_at.isoformat()}"' in page and "in 2\xa0days" in page
    assert f'<time datetime="{escalate_at.isoformat()}"' in page and "in 5\xa0hours" in page

    page = client.get(f"{INBOX}{approval.pk}/").content.decode()
    assert "<dt>Due</dt>" in page and f'<time datetime="{due_at.isoformat()}"' in page
    assert "<dt>Escalates</dt>" in page and "to group bosses" in page
    assert ">overdue<" not in page

    escalated_at = now - timedelta(minutes=3)
    with_times(approval, escalate_at=now - timedelta(minutes=4), escalated_at=escalated_at)
    page = client.get(f"{INBOX}{approval.pk}/").content.decode()
    assert "<dt>Escalated</dt>" in page and f'<time datetime="{escalated_at.isoformat()}"' in page
    assert "3\xa0minutes ago" in page and ">overdue<" in page
    listed = client.get(INBOX).content.decode()
    assert "escalated <time" in listed and ">overdue<" in listed


@pytest.mark.parametrize("lane", [postgres_lane()])
def test_on_postgresql_the_overdue_filter_is_an_index_scan(lane, on_lane, refunds):  # noqa: F811
    """3,000 approvals, 10 of them pending: the planner answers the filter from an
    index that leads with ``status``, not by reading the table."""
    now = timezone.now()
    approval = pending(refunds, 1)
    Approval.objects.bulk_create(
        Approval(
            id=uuid.uuid4(),
            coordination_id=f"bulk-{n}",
            workflow_name=approval.workflow_name,
            step_name=approval.step_name,
            snapshot_id=f"snap-{n}",
            status="pending" if n < 10 else "approved",
            requested_at=now - timedelta(days=1),
            expires_at=now + timedelta(hours=n - 5, minutes=30),
            escalate_at=now - timedelta(hours=1) if n % 2 else None,
        )
        for n in range(3000)
    )
    rows = Approval.objects.filter(overdue_q())
    with connections[rows.db].cursor() as cursor:
        cursor.execute("ANALYZE flowwarden_django_approval")
    plan = rows.order_by().explain()
    assert "Seq Scan" not in plan and "fw_approval_" in plan, plan
    # Pending 0..4 are past their expiry, the odd ones past their escalation time.
    assert sorted(rows.values_list("coordination_id", flat=True)) == [
        f"bulk-{n}" for n in (0, 1, 2, 3, 4, 5, 7, 9)
    ]
