"""Reminders and escalation on Temporal: a real dev server and a
``flowwarden_temporal_worker`` subprocess with no recovery sweep (``--no-recovery``),
so only the run's durable timer (its expiry activity) can remind and escalate; each
event is emailed once from the worker, through a real SMTP server this test runs."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

pytest.importorskip("temporalio", reason="the Temporal tests need temporalio")

from flowwarden_django.integrations.temporal.messages import EXPIRE_ACTIVITY
from flowwarden_django.models import Approval, ApprovalEvent, ApprovalNotification
from flowwarden_django.workflows import workflow_registry
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.waiting.approvals import approve
from tests.integrations import test_temporal as on_server
from tests.integrations.test_temporal import (
    DB,
    history_event_types,
    on_temporal,
    wait_for_status,
)
from tests.support.approval_mail import Inbox, expected_mails, people, smtp_server
from tests.support.reminder_workflow import REMINDING, define_reminders
from tests.support.temporal_procs import DevServer, TemporalWorker, history_activities

server = on_server.server
queue = on_server.queue
worker_env = on_server.worker_env
temporal = on_server.temporal


@pytest.fixture(scope="module")
def smtp() -> Iterator[Inbox]:
    with smtp_server() as inbox:
        yield inbox


@pytest.fixture(scope="module")
def mailing_worker(
    worker_env: dict[str, str], smtp: Inbox, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TemporalWorker]:
    env = {**worker_env, "FLOWWARDEN_TEST_SMTP_PORT": str(_port(smtp))}
    process = TemporalWorker(env, tmp_path_factory.mktemp("worker") / "worker.log")
    yield process
    process.kill()


def _port(inbox: Inbox) -> int:
    return inbox.port


@pytest.fixture
def reminding(temporal: Any) -> Iterator[Any]:
    yield define_reminders(REMINDING, OrmSnapshotStore(using=DB), using=DB)
    workflow_registry.unregister(REMINDING)


@on_temporal
def test_reminders_and_one_escalation_come_from_the_durable_timer_emailed_once(
    reminding: Any, mailing_worker: TemporalWorker, server: DevServer, smtp: Inbox
) -> None:
    team = people(DB)
    state = {"invoice": "INV-T", "remind_every": 2, "escalate_after": 5, "escalate_to": "managers"}
    cid = reminding.start(state).coordination_id
    wait_for_status(cid, ("waiting",), [mailing_worker, server])
    approvals = Approval.objects.using(DB).filter(coordination_id=cid)
    on_server.wait_until(
        lambda: approvals.filter(reminders_sent__gte=2, escalated_at__isnull=False).exists(),
        on_server.WAIT,
        "two reminders and the escalation",
        [mailing_worker, server],
    )
    approval = approvals.get()
    reminded = ApprovalEvent.objects.using(DB).filter(approval=approval, action="reminded")
    for event in reminded:
        assert event.at >= approval.requested_at + event.payload["number"] * timedelta(seconds=2)
    (escalation,) = ApprovalEvent.objects.using(DB).filter(approval=approval, action="escalated")
    assert escalation.at >= approval.requested_at + timedelta(seconds=5)
    # No sweep runs anywhere (the worker has --no-recovery): the timer did it.
    assert "TIMER_STARTED" in history_event_types(server, cid)
    assert EXPIRE_ACTIVITY in history_activities(server, cid)
    result = approve(approval.pk, team["mike"], using=DB)
    assert result.approval.status == "approved"
    wait_for_status(cid, ("completed",), [mailing_worker, server])
    rows = ApprovalNotification.objects.using(DB).filter(approval=approval)
    on_server.wait_until(
        lambda: not rows.filter(sent_at=None).exists(),
        on_server.WAIT,
        "every notification sent",
        [mailing_worker, server],
    )
    assert not rows.exclude(error="").exists()
    wanted = expected_mails(approval, DB)
    events = {(row.event, row.number) for row in rows}
    assert {("requested", 0), ("reminded", 1), ("reminded", 2), ("escalated", 0)} <= events
    on_server.wait_until(
        lambda: smtp.received() == wanted, on_server.WAIT, "the emails", [mailing_worker]
    )
    assert all(f"/approvals/{approval.pk}/" in body for body in smtp.bodies())
