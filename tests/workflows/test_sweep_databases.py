"""The workers' recovery sweeps visit every database a defined workflow keeps its runs
in (``workflows.recovery.workflow_databases``), not only the router's default: a
stalled run of a workflow defined on a second alias is continued by the Celery sweep
and woken by the Temporal worker's ``recover()``."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from flowwarden_django.models import WorkflowRun
from flowwarden_django.workflows import RunStatus, Workflow, advance, step, workflow_registry
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.operations.recovery import workflow_databases

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
