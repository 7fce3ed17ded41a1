"""Claims that prove their runner is alive (``workflows.claim_keeper``), and what the
recovery sweep does with the ones that do not (``workflows.recovery``), on PostgreSQL.

The keeper's thread renews a held claim with its own connection; a claim that was
taken over or released is dropped; a renewal that fails is tried again; a renewal
tells the engine its lease is young. The sweep takes a run whose claim ran out at
once (however recently the run moved) and ends that claim; a claim renewed meanwhile
keeps its run; a stalled run of a workflow this process does not define is logged
once per run and state. A paused step's approval row is written in the step's own
transaction.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from flowwarden_django.models import Approval, WorkflowRun
from flowwarden_django.workflows import (
    Hibernated,
    RunStatus,
    Workflow,
    advance,
    await_approval,
    step,
    workflow_registry,
)
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.execution.claim_keeper import ClaimKeeper, HeldClaim
from flowwarden_django.workflows.operations.recovery import recover_stalled_runs
from flowwarden_django.workflows.runs.records import RunRecords, new_runner_token
from flowwarden_django.workflows.waiting.approvals import request as approval_request
from tests.support.lanes import lane_marks

DB = "postgres"
LEASE = timedelta(seconds=0.4)

pytestmark = lane_marks("postgres", databases=["default", DB])


@step("first")
def first(state: str) -> Any:
    return advance(state + ":first")


@step("ask")
def ask(state: str) -> Any:
    return await_approval(state + ":ask", "May it go on?")


@pytest.fixture
def definition() -> Any:
    name = f"keeper-{uuid.uuid4().hex[:8]}"
    defined = Workflow.define(name, [first, ask], OrmSnapshotStore(using=DB), using=DB)
    yield defined
    workflow_registry.unregister(name)


@pytest.fixture
def keeper() -> Any:
    keeper = ClaimKeeper()
    yield keeper
    for runner in list(keeper._claims):
        keeper.drop(runner)


def claimed_run(definition: Any, lease: timedelta = LEASE) -> tuple[str, str]:
    """A seeded run of *definition*, claimed by a new runner for *lease*."""
    cid = f"keeper-{uuid.uuid4().hex[:10]}"
    definition.workflow(cid).seed("s")
    runner = new_runner_token()
    RunRecords(DB).claim(cid, runner, lease)
    return cid, runner


def wait_for(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def claims(cid: str, runner: str) -> bool:
    """Whether *runner* claims run *cid* now (False while another runner holds it)."""
    try:
        RunRecords(DB).claim(cid, runner, LEASE)
    except Exception as exc:
        if "is being run by" not in str(exc):
            raise
        return False
    return True


def test_a_held_claim_is_renewed_and_its_run_left_unchanged(definition, keeper):
    cid, runner = claimed_run(definition)
    before = WorkflowRun.objects.using(DB).get(pk=cid)
    renewals: list[float] = []
    held_at = time.monotonic()
    keeper.hold(HeldClaim(DB, cid, runner, LEASE, on_renewed=renewals.append))
    wait_for(lambda: len(renewals) >= 4)
    # Three leases: it would have run out thrice.
    time.sleep(max(0.0, held_at + LEASE.total_seconds() * 3 - time.monotonic()))
    # Checked just after a renewal, so that a whole lease separates the two even when
    # a loaded machine holds the keeper's thread back.
    renewed = len(renewals)
    wait_for(lambda: len(renewals) > renewed)
    after = WorkflowRun.objects.using(DB).get(pk=cid)
    assert len(renewals) >= 4
    assert after.runner == runner
    assert after.claimed_until > timezone.now()
    assert after.updated_at == before.updated_at  # a renewal is no change of the run
    # No other runner can take it while it is kept alive...
    with pytest.raises(Exception, match="is being run by"):
        RunRecords(DB).claim(cid, new_runner_token(), LEASE)
    # ... and once it is dropped, its claim runs out: another runner takes it.
    keeper.drop(runner)
    wait_for(lambda: claims(cid, new_runner_token()))


def test_a_claim_taken_over_or_released_is_dropped(definition, keeper):
    cid, runner = claimed_run(definition)
    RunRecords(DB).release(cid, runner)
    keeper.hold(HeldClaim(DB, cid, runner, LEASE))
    wait_for(lambda: len(keeper) == 0)
    assert WorkflowRun.objects.using(DB).get(pk=cid).runner == ""


def test_a_failed_renewal_is_tried_again(definition, keeper, monkeypatch, caplog):
    cid, runner = claimed_run(definition, lease=timedelta(seconds=5))
    calls: list[int] = []
    real = RunRecords.renew

    def flaky(self: RunRecords, *args: Any) -> bool:
        calls.append(1)
        if len(calls) <= 2:
            raise ConnectionError("the database went away")
        return real(self, *args)

    monkeypatch.setattr(RunRecords, "renew", flaky)
    # How many calls it took, counted at each renewal (a loaded machine may let the
    # next renewal in before the test looks).
    renewed: list[int] = []
    claim = HeldClaim(
        DB, cid, runner, timedelta(seconds=5), on_renewed=lambda sent: renewed.append(len(calls))
    )
    # Renewed every 1.25 s; a failure is tried again after 0.5 s.
    with caplog.at_level(logging.INFO, logger="flowwarden_django.workflows"):
        keeper.hold(claim)
        wait_for(lambda: renewed)
    assert renewed[0] == 3
    messages = [r.getMessage() for r in caplog.records]
    assert sum("renewing run claims" in m for m in messages) == 2  # failing, then recovered


def test_a_claim_whose_renewals_fail_is_lapsing_until_one_holds(definition, keeper, monkeypatch):
    lease = timedelta(seconds=0.8)
    cid, runner = claimed_run(definition, lease=lease)
    failing = [True]
    real = RunRecords.renew

    def away(self: RunRecords, *args: Any) -> bool:
        if failing[0]:
            raise ConnectionError("the database went away")
        return real(self, *args)

    monkeypatch.setattr(RunRecords, "renew", away)
    claim = HeldClaim(DB, cid, runner, lease)
    keeper.hold(claim)
    assert keeper.lapsing() == []  # just held: as good as renewed
    wait_for(lambda: keeper.lapsing() == [claim])
    assert keeper.unrenewed_for(DB, cid) >= 0.4
    assert keeper.unrenewed_for(DB, "another-run") == 0.0
    failing[0] = False
    wait_for(lambda: keeper.lapsing() == [])
    assert keeper.unrenewed_for(DB, cid) < 0.4


def test_an_execution_keeps_its_claim_only_outside_a_transaction(definition):
    from django.db import transaction

    from flowwarden_django.workflows.execution.claim_keeper import claim_keeper

    cid = f"keeper-{uuid.uuid4().hex[:10]}"
    held: list[int] = []

    @step("look")
    def look(state: str) -> Any:
        held.append(len(claim_keeper))
        return advance(state)

    name = f"keeper-look-{uuid.uuid4().hex[:6]}"
    wf = Workflow.define(name, [look], OrmSnapshotStore(using=DB), using=DB)
    try:
        wf.workflow(cid).run("s")
        with transaction.atomic(using=DB):
            wf.workflow(f"{cid}-tx").run("s")
    finally:
        workflow_registry.unregister(name)
    # Outside a transaction the run's claim was kept alive, inside one it was not;
    # neither is kept once its run is done.
    assert held[0] >= 1 and held[1] == held[0] - 1
    assert all(c.coordination_id != cid for c in claim_keeper._claims.values())


def test_the_sweep_takes_an_expired_claim_at_once_and_ends_it(definition):
    cid, _ = claimed_run(definition, lease=timedelta(seconds=-1))  # its runner died
    WorkflowRun.objects.using(DB).filter(pk=cid).update(updated_at=timezone.now())
    queued: list[WorkflowRun] = []
    # However recently the run moved: a claim nobody renews means a dead runner.
    assert recover_stalled_runs(queued.append, older_than=timedelta(hours=1), using=DB) == [cid]
    run = WorkflowRun.objects.using(DB).get(pk=cid)
    assert (run.runner, run.claimed_until, run.attempts) == ("", None, 1)
    # Ended: the next sweep waits for WORKFLOW_RECOVER_AFTER like for any unclaimed run.
    assert recover_stalled_runs(queued.append, older_than=timedelta(hours=1), using=DB) == []


def test_a_claim_renewed_while_the_sweep_looks_keeps_its_run(definition, monkeypatch):
    from flowwarden_django.workflows.operations import recovery

    cid, runner = claimed_run(definition, lease=timedelta(seconds=-1))
    real = recovery.stalled_runs

    def read_then_renewed(**kwargs: Any) -> list[WorkflowRun]:
        runs = real(**kwargs)
        RunRecords(DB).renew(cid, runner, timedelta(minutes=1))  # the runner was alive
        return runs

    monkeypatch.setattr(recovery, "stalled_runs", read_then_renewed)
    queued: list[WorkflowRun] = []
    assert recover_stalled_runs(queued.append, using=DB) == []
    assert WorkflowRun.objects.using(DB).get(pk=cid).runner == runner


def test_an_undefined_workflow_s_stalled_run_is_logged_once_per_state(caplog):
    cid = f"undefined-{uuid.uuid4().hex[:8]}"
    WorkflowRun.objects.using(DB).create(
        coordination_id=cid,
        workflow_name="not-defined-here",
        status=RunStatus.RUNNING,
        created_at=timezone.now(),
        updated_at=timezone.now() - timedelta(minutes=5),
    )
    with caplog.at_level(logging.WARNING, logger="flowwarden_django.workflows"):
        for _ in range(5):
            recover_stalled_runs(lambda run: None, using=DB)
        WorkflowRun.objects.using(DB).filter(pk=cid).update(
            runner="dead", claimed_until=timezone.now() - timedelta(seconds=1)
        )
        for _ in range(5):
            recover_stalled_runs(lambda run: None, using=DB)
    logged = [r for r in caplog.records if cid in r.getMessage()]
    assert len(logged) == 2, [r.getMessage() for r in logged]


def test_a_paused_step_s_approval_is_written_in_its_transaction(definition, monkeypatch):
    """The approval row fails to insert: the pause is rolled back with it, so no run
    ever waits without its approval; the next run asks again, and then it holds."""
    cid = f"keeper-{uuid.uuid4().hex[:10]}"
    real = approval_request.request_approval

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the approval could not be written")

    monkeypatch.setattr(approval_request, "request_approval", broken)
    with pytest.raises(RuntimeError, match="could not be written"):
        definition.workflow(cid).run("s")
    run = WorkflowRun.objects.using(DB).get(pk=cid)
    assert run.status == RunStatus.RUNNING and run.last_step == "first"
    assert run.runner == ""  # let go of, not left to its lease
    assert not Approval.objects.using(DB).filter(coordination_id=cid).exists()
    assert [s.metadata["workflow.lastStep"] for s in definition.workflow(cid).history()] == [
        "",
        "first",
    ]

    monkeypatch.setattr(approval_request, "request_approval", real)
    result = definition.workflow(cid).run()
    assert isinstance(result, Hibernated) and result.status == RunStatus.WAITING
    assert Approval.objects.using(DB).filter(coordination_id=cid).count() == 1
    connections[DB].close()
