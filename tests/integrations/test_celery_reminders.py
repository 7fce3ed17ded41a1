"""Reminders and escalation on Celery: a real worker (``WORKFLOW_EXECUTION =
"celery"``, so it runs the recovery sweep) on a real Redis broker sends them, each
emailed once from the worker through a real SMTP server this test runs."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

pytest.importorskip("celery", reason="the Celery tests need celery")
pytest.importorskip("redis", reason="the Celery workflow tests need redis-py")

from celery import Celery

from flowwarden_django.integrations.celery.provider import CeleryExecutionProvider
from flowwarden_django.models import Approval, ApprovalEvent, ApprovalNotification
from flowwarden_django.workflows import RunStatus, workflow_registry
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.execution.providers import reset_providers
from flowwarden_django.workflows.waiting.approvals import approve
from tests.integrations.test_celery_workflows import DB, SOLO, WAIT, execution, on_servers
from tests.support.approval_mail import Inbox, expected_mails, people, smtp_server
from tests.support.celery_procs import wait_until
from tests.support.celery_workflow_settings import transport_options
from tests.support.reminder_workflow import REMINDING, define_reminders


@pytest.fixture(autouse=True)
def _fresh_providers() -> Iterator[None]:
    reset_providers()
    yield
    reset_providers()


@pytest.fixture
def smtp() -> Iterator[Inbox]:
    with smtp_server() as inbox:
        yield inbox


@pytest.fixture
def provider(broker_url: str, queue: str) -> Iterator[CeleryExecutionProvider]:
    app = Celery("fw-remind-producer", broker=broker_url, fixups=[], set_as_current=False)
    app.conf.task_default_queue = queue
    app.conf.broker_transport_options = transport_options(queue)
    yield CeleryExecutionProvider(app=app)
    app.close()


@pytest.fixture
def reminding() -> Iterator[Any]:
    yield define_reminders(REMINDING, OrmSnapshotStore(using=DB), using=DB)
    workflow_registry.unregister(REMINDING)


@on_servers
def test_reminders_and_one_escalation_from_the_workers_sweep_emailed_once(
    reminding: Any, provider: Any, start_worker: Any, smtp: Inbox
) -> None:
    team = people(DB)
    worker = start_worker(
        SOLO, execution="celery", env={"FLOWWARDEN_TEST_SMTP_PORT": str(smtp.port)}
    )
    state = {"invoice": "INV-C", "remind_every": 2, "escalate_after": 5, "escalate_to": "managers"}
    with execution(provider):
        cid = reminding.start(state).coordination_id
    approvals = Approval.objects.using(DB).filter(coordination_id=cid)
    wait_until(
        lambda: approvals.filter(reminders_sent__gte=2, escalated_at__isnull=False).exists(),
        WAIT,
        "two reminders and the escalation",
        worker,
    )
    approval = approvals.get()
    for event in ApprovalEvent.objects.using(DB).filter(approval=approval, action="reminded"):
        assert event.at >= approval.requested_at + event.payload["number"] * timedelta(seconds=2)
    (escalation,) = ApprovalEvent.objects.using(DB).filter(approval=approval, action="escalated")
    assert escalation.at >= approval.requested_at + timedelta(seconds=5)
    with execution(provider):
        assert approve(approval.pk, team["mike"], using=DB).approval.status == "approved"
    wf = reminding.workflow(cid)
    wait_until(lambda: wf.run_record().status == RunStatus.COMPLETED, WAIT, "the run", worker)
    rows = ApprovalNotification.objects.using(DB).filter(approval=approval)
    wait_until(lambda: not rows.filter(sent_at=None).exists(), WAIT, "every notification", worker)
    assert not rows.exclude(error="").exists()
    wanted = expected_mails(approval, DB)
    wait_until(lambda: smtp.received() == wanted, WAIT, "the emails", worker)
    assert all(f"/approvals/{approval.pk}/" in body for body in smtp.bodies())
