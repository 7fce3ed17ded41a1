"""The sweeps visit every database a defined workflow keeps its runs in
(``workflows.definition.databases.workflow_databases``), not only the router's default: a stalled
run of a workflow defined on a second alias is continued by the Celery sweep, woken by
the Temporal worker's ``recover()`` and continued by ``flowwarden_workflows recover``;
its due approval is expired by the approval sweep (the function, the Celery task and
``flowwarden_approvals expire``)."""

from __future__ import annotations

import asyncio
import io
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from flowwarden_django.models import Approval, WorkflowRun
from flowwarden_django.workflows import (
    Hibernated,
    RunStatus,
    Workflow,
    advance,
    step,
    workflow_registry,
)
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.definition.databases import workflow_databases
from flowwarden_django.workflows.waiting.approvals import sweep_approvals
from tests.support.refund_workflow import define_refunds

pytestmark = pytest.mark.django_db(databases=["default", "other"])

OTHER = "other"


@step("only")
def only(state: Any) -> Any:
    return advance(state)


@pytest.fixture
def elsewhere() -> Iterator[str]:
    """A workflow whose runs live on the second alias, and one on the default."""
    name = f"fw-elsewhere-{uuid.uuid4().hex[:8]}"
    here = f"fw-here-{uuid.uuid4().hex[:8]}"
    Workflow.define(name, [only], OrmSnapshotStore(using=OTHER), using=OTHER)
    Workflow.define(here, [only], OrmSnapshotStore())
    yield name
    workflow_registry.unregister(name)
    workflow_registry.unregister(here)


def stalled_run(alias: str, name: str) -> str:
    """A running, unclaimed run of *name* on *alias* that has not moved for an hour."""
    cid = f"stalled-{uuid.uuid4().hex[:10]}"
    an_hour_ago = timezone.now() - timedelta(hours=1)
    WorkflowRun.objects.using(alias).create(
        coordination_id=cid,
        workflow_name=name,
        status=RunStatus.RUNNING,
        created_at=an_hour_ago,
        updated_at=an_hour_ago,
    )
    return cid


def test_the_databases_are_those_of_the_defined_workflows(elsewhere: str) -> None:
    assert workflow_databases() == ["default", OTHER]


def test_the_celery_sweep_continues_a_stalled_run_on_a_second_database(
    elsewhere: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("celery")
    from flowwarden_django.integrations.celery import provider

    sent: list[tuple[str, str]] = []

    def send_step(app: Any, definition: Any, cid: str, **kwargs: Any) -> None:
        sent.append((definition.name, cid))

    monkeypatch.setattr(provider, "send_step", send_step)
    cid = stalled_run(OTHER, elsewhere)
    assert provider.recover_workflows(object()) == [cid]
    assert sent == [(elsewhere, cid)]
    assert WorkflowRun.objects.using(OTHER).get(pk=cid).attempts == 1


def test_the_temporal_recovery_wakes_a_stalled_run_on_a_second_database(
    elsewhere: str,
) -> None:
    pytest.importorskip("temporalio")
    from flowwarden_django.integrations.temporal import worker
    from flowwarden_django.integrations.temporal.config import TemporalConfig

    started: list[Any] = []

    class Client:
        async def start_workflow(self, *args: Any, **kwargs: Any) -> None:
            started.append(args[1])

    cid = stalled_run(OTHER, elsewhere)
    woken = worker.recover(TemporalConfig(), lambda call: asyncio.run(call(Client())))
    assert woken == [cid]
    # The run's workflow reads and writes the run where it lives.
    assert [(start.coordination_id, start.using) for start in started] == [(cid, OTHER)]


def test_a_database_that_fails_does_not_keep_the_others_from_being_swept(
    elsewhere: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flowwarden_django.workflows.operations import recovery

    real = recovery.recover_stalled_runs

    def default_down(enqueue: Any, *, using: str | None = None, **kwargs: Any) -> list[str]:
        if using == "default":
            raise ConnectionError("default is down")
        return real(enqueue, using=using, **kwargs)

    monkeypatch.setattr(recovery, "recover_stalled_runs", default_down)
    cid = stalled_run(OTHER, elsewhere)
    queued: list[str] = []
    with pytest.raises(ConnectionError):
        recovery.recover_in_every_database(lambda run: queued.append(run.pk))
    assert queued == [cid]


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "recover"])
def test_the_recover_command_continues_a_stalled_run_on_a_second_database(
    elsewhere: str, dry_run: bool
) -> None:
    # Started, never run (the test's transaction never commits, so the start's
    # on-commit run never comes), and made to look like a run whose process died.
    cid = Workflow.start(elsewhere, {"order": 7}).coordination_id
    WorkflowRun.objects.using(OTHER).filter(pk=cid).update(
        status=RunStatus.RUNNING,
        runner="",
        claimed_until=None,
        updated_at=timezone.now() - timedelta(hours=1),
    )
    out = io.StringIO()
    call_command("flowwarden_workflows", "recover", *(["--dry-run"] * dry_run), stdout=out)
    if dry_run:
        assert cid in out.getvalue() and "1 stalled run(s)" in out.getvalue()
        assert WorkflowRun.objects.using(OTHER).get(pk=cid).status == RunStatus.RUNNING
        return
    assert f"Continuing {cid}" in out.getvalue() and "Completed" in out.getvalue()
    assert WorkflowRun.objects.using(OTHER).get(pk=cid).status == RunStatus.COMPLETED


@pytest.fixture
def refunds_elsewhere(elsewhere: str) -> Iterator[str]:
    """The refund workflow (which asks for an approval) on the second alias."""
    name = f"fw-refund-{uuid.uuid4().hex[:8]}"
    define_refunds(name, OrmSnapshotStore(using=OTHER), using=OTHER)
    yield name
    workflow_registry.unregister(name)


def expire_with_the_function() -> list[str]:
    return sweep_approvals().expired


def expire_with_the_task() -> list[str]:
    pytest.importorskip("celery")
    from flowwarden_django.integrations.celery.tasks import expire_approvals

    return expire_approvals.apply().get()["expired"]


def expire_with_the_command() -> list[str]:
    out = io.StringIO()
    call_command("flowwarden_approvals", "expire", stdout=out)
    return [line.split()[-1] for line in out.getvalue().splitlines() if "expired:" in line]


@pytest.mark.parametrize(
    "sweep",
    [expire_with_the_function, expire_with_the_task, expire_with_the_command],
    ids=["sweep_approvals", "expire_approvals-task", "flowwarden_approvals-expire"],
)
def test_the_approval_sweep_expires_a_due_approval_on_a_second_database(
    refunds_elsewhere: str, sweep: Any
) -> None:
    cid = Workflow.start(refunds_elsewhere, {"amount": 500, "expires_in": 60}).coordination_id
    # Run here: the test's transaction never commits, so the start's on-commit run never comes.
    assert isinstance(Workflow.for_coordination(cid, using=OTHER).run(), Hibernated)
    approvals = Approval.objects.using(OTHER).filter(coordination_id=cid)
    approvals.update(expires_at=timezone.now() - timedelta(seconds=1))
    approval = approvals.get()
    assert sweep() == [str(approval.pk)]
    approval.refresh_from_db(using=OTHER)
    assert approval.status == Approval.Status.EXPIRED


def test_a_database_that_fails_does_not_keep_the_approval_sweep_from_the_others(
    refunds_elsewhere: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flowwarden_django.workflows.waiting.approvals import sweep

    real = sweep.restore_missing_approvals

    def default_down(*, using: str | None = None, **kwargs: Any) -> list[str]:
        if using == "default":
            raise ConnectionError("default is down")
        return real(using=using, **kwargs)

    monkeypatch.setattr(sweep, "restore_missing_approvals", default_down)
    cid = Workflow.start(refunds_elsewhere, {"amount": 500, "expires_in": 60}).coordination_id
    assert isinstance(Workflow.for_coordination(cid, using=OTHER).run(), Hibernated)
    approvals = Approval.objects.using(OTHER).filter(coordination_id=cid)
    approvals.update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(ConnectionError):
        sweep_approvals()
    assert approvals.get().status == Approval.Status.EXPIRED
