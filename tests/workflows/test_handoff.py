"""A run handed from one step to the next (``workflows.handoff``): the step's save keeps
the run held under a fresh token, and the next step runs from that token and the
carried head without claiming (one statement per plain step on PostgreSQL). Whatever
takes the run meanwhile (a cancel, an upgrade, a later step) makes the handed step's
save fail and its result discarded; a retry, a stale or a forged hand-off claims the
run as before, taking it from the token."""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from flowwarden_django.models import SnapshotRecord, WorkflowRun
from flowwarden_django.workflows import (
    Cancelled,
    Completed,
    ConcurrentRunError,
    Failed,
    RunStatus,
    Workflow,
    advance,
    step,
)
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.definition.results import Running
from flowwarden_django.workflows.execution.handoff import Handoff
from flowwarden_django.workflows.runs.records import (
    HANDOFF_PREFIX,
    ClaimTerms,
    new_handoff_token,
    run_lease,
)
from tests.support.lanes import lane_marks

pytestmark = pytest.mark.django_db(transaction=True)

POSTGRES = pytest.param("postgres", marks=lane_marks("postgres", databases=["postgres"]))
MARIADB = pytest.param("mariadb", marks=lane_marks("mariadb", databases=["mariadb"]))
ALIASES = pytest.mark.parametrize("alias", ["default", POSTGRES, MARIADB])


class StepRunner(Workflow):
    """A provider's step runner: claims an existing running run, taking it from the
    hand-off token it was given."""

    def __init__(self, *args: Any, held_by: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held_by = held_by

    def _claim_terms(self) -> ClaimTerms:
        return ClaimTerms(running_only=True, held_by=self.held_by)


def appending(count: int, ran: list[str] | None = None) -> list[Any]:
    def make(name: str) -> Any:
        @step(name)
        def run(state: list[str]) -> Any:
            if ran is not None:
                ran.append(name)
            return advance([*state, name])

        return run

    return [make(f"s{number}") for number in range(1, count + 1)]


def started(
    alias: str, steps: list[Any], store: OrmSnapshotStore | None = None, name: str = "handoff"
) -> str:
    cid = f"handoff-{uuid.uuid4().hex[:12]}"
    Workflow(name, cid, steps, store or OrmSnapshotStore(using=alias)).seed([])
    return cid


def step_of(alias: str, cid: str, steps: list[Any], handed: Handoff | None, **kwargs: Any):
    store = kwargs.pop("store", None) or OrmSnapshotStore(using=alias)
    runner = StepRunner(
        "handoff", cid, steps, store, held_by=() if handed is None else (handed.token,)
    )
    with CaptureQueriesContext(connections[alias]) as captured:
        result, handoff = runner.run_handing_off(handed, **kwargs)
    return result, handoff, captured.captured_queries


def run_of(alias: str, cid: str) -> WorkflowRun:
    return WorkflowRun.objects.using(alias).get(pk=cid)


def seqs(alias: str, cid: str) -> list[int]:
    rows = SnapshotRecord.objects.using(alias).filter(coordination_id=cid).order_by("seq")
    return list(rows.values_list("seq", flat=True))


@ALIASES
def test_a_run_handed_from_step_to_step_completes_holding_it_between_steps(alias: str) -> None:
    steps = appending(4)
    cid = started(alias, steps)
    result, handed, queries = step_of(alias, cid, steps, None)
    counts = [len(queries)]
    while handed is not None:
        assert isinstance(result, Running)
        run = run_of(alias, cid)
        # Held for the next step, under the token it was handed, with a live lease.
        assert run.runner == handed.token and handed.token.startswith(HANDOFF_PREFIX)
        assert run.claimed_until is not None and run.head_snapshot_id == result.snapshot_id
        assert handed.head is not None and handed.head["id"] == result.snapshot_id
        result, handed, queries = step_of(alias, cid, steps, handed)
        counts.append(len(queries))
    assert result == Completed(["s1", "s2", "s3", "s4"], cid)
    run = run_of(alias, cid)
    assert (run.status, run.runner, run.claimed_until) == (RunStatus.COMPLETED, "", None)
    assert seqs(alias, cid) == [1, 2, 3, 4, 5]
    if alias == "postgres":
        # The first step claims and saves; every later one only saves.
        assert counts == [2, 1, 1, 1], counts


@pytest.mark.parametrize("alias", [POSTGRES])
def test_an_encrypting_store_hands_on_its_ciphertext(alias: str) -> None:
    pytest.importorskip("cryptography")
    from flowwarden_django.workflows.storage.encryption import generate_key

    store = OrmSnapshotStore(using=alias, encryption_keys=[generate_key()])
    steps = appending(3)
    cid = started(alias, steps, store)
    _, handed, _ = step_of(alias, cid, steps, None, store=store)
    # '"s1"': the state's own JSON text (a base64 ciphertext may hold s1 by chance).
    assert handed.head["state"].startswith("enc:") and '"s1"' not in str(handed.head)
    result, handed, queries = step_of(alias, cid, steps, handed, store=store)
    assert result.state == ["s1", "s2"] and len(queries) == 1


@ALIASES
def test_a_cancel_between_steps_discards_the_handed_step(alias: str) -> None:
    ran: list[str] = []
    steps = appending(3, ran)
    cid = started(alias, steps)
    _, handed, _ = step_of(alias, cid, steps, None)
    Workflow("handoff", cid, steps, OrmSnapshotStore(using=alias)).cancel("stop")
    result, handoff, _ = step_of(alias, cid, steps, handed)
    # The step ran from what it was handed, and its save was refused.
    assert isinstance(result, Cancelled) and handoff is None and ran == ["s1", "s2"]
    assert run_of(alias, cid).status == RunStatus.CANCELLED
    assert seqs(alias, cid) == [1, 2, 3]  # seed, s1, the cancel's


@ALIASES
def test_a_late_copy_of_a_handed_step_writes_nothing(alias: str) -> None:
    steps = appending(4)
    cid = started(alias, steps)
    _, first, _ = step_of(alias, cid, steps, None)
    _, second, _ = step_of(alias, cid, steps, first)
    # The same step again, from the same hand-off (a replayed or timed-out attempt).
    with pytest.raises(ConcurrentRunError):
        step_of(alias, cid, steps, first)
    assert run_of(alias, cid).runner == second.token and seqs(alias, cid) == [1, 2, 3]
    result, _, _ = step_of(alias, cid, steps, second)
    assert result.state == ["s1", "s2", "s3"]


@ALIASES
def test_a_retry_a_stale_or_a_forged_hand_off_claims_from_the_token(alias: str) -> None:
    steps = appending(5)
    cid = started(alias, steps)
    _, handed, _ = step_of(alias, cid, steps, None)
    # A retry (the first attempt failed, or its worker died holding the token) does
    # not wait for the lease: it takes the run from the token.
    result, handed, queries = step_of(alias, cid, steps, handed, attempt=2)
    assert result.state == ["s1", "s2"] and run_of(alias, cid).runner == handed.token
    assert run_of(alias, cid).attempts == 0  # the run handed on is no retry
    stale = dataclasses.replace(handed, at=time.time() - run_lease().total_seconds())
    result, handed, queries = step_of(alias, cid, steps, stale)
    assert result.state == ["s1", "s2", "s3"]
    forged_head = {**handed.head, "state": '["forged", "s1", "s2", "s3"]'}
    forged = Handoff.from_dict({**handed.as_dict(), "head": forged_head}, cid)
    assert forged.head is None  # the signature no longer matches: dropped
    result, handed, queries = step_of(alias, cid, steps, forged)
    assert result.state == ["s1", "s2", "s3", "s4"]
    if alias == "postgres":
        assert len(queries) == 2  # claimed, reading the head


def test_an_upgrade_takes_a_run_held_between_steps() -> None:
    from flowwarden_django.workflows.definition.registry import workflow_registry
    from flowwarden_django.workflows.operations.upgrades import upgrade_registry, upgrade_runs

    name = f"handoff-{uuid.uuid4().hex[:8]}"
    store = OrmSnapshotStore()
    ran: list[str] = []
    v1 = appending(3, ran)
    Workflow.define(name, v1, store)
    cid = started("default", v1, store, name)
    try:
        runner = StepRunner(name, cid, v1, store)
        _, handed = runner.run_handing_off(None)
        assert run_of("default", cid).runner == handed.token
        v2 = appending(3, ran)
        workflow_registry.unregister(name)
        Workflow.define(name, v2, store, version=2)
        Workflow.define_upgrade(name, from_version=1, to_version=2, steps={})
        (outcome,) = upgrade_runs(name)
        assert outcome.upgraded, outcome.reason  # not refused as held
        # The upgrade continued the run on version 2 (in process: to its end); the step
        # it had been handed to, on the old version, ran and was discarded.
        run = run_of("default", cid)
        assert (run.workflow_version, run.status) == (2, RunStatus.COMPLETED)
        with pytest.raises(ConcurrentRunError):
            StepRunner(name, cid, v1, store, held_by=(handed.token,)).run_handing_off(handed)
        # seed, s1, the upgrade's, s2 and s3 of version 2: nothing of the discarded step
        assert store.latest(cid).state == ["s1", "s2", "s3"] and seqs("default", cid) == [
            1,
            2,
            3,
            4,
            5,
        ]
    finally:
        workflow_registry.unregister(name)
        upgrade_registry.unregister(name)


@ALIASES
def test_a_copy_of_a_step_takes_the_run_its_earlier_copy_handed_on(alias: str) -> None:
    """A provider names the token a step hands on to after the step's task, so a copy
    of the step (its worker died after the save) takes the run from it at once."""
    steps = appending(4)
    cid = started(alias, steps)
    _, handed, _ = step_of(alias, cid, steps, None)
    hands_to = new_handoff_token("workflow", "run", "2")
    assert hands_to == new_handoff_token("workflow", "run", "2") != handed.token

    def copy() -> StepRunner:
        store = OrmSnapshotStore(using=alias)
        return StepRunner("handoff", cid, steps, store, held_by=(handed.token, hands_to))

    copy().run_handing_off(handed, hand_off_to=hands_to)  # saved, then its worker died
    assert run_of(alias, cid).runner == hands_to
    with pytest.raises(ConcurrentRunError):  # a copy from the same head: refused
        copy().run_handing_off(handed, hand_off_to=hands_to)
    # Told where the run stands (the head dropped), a copy claims it from the token
    # the step handed it on to, without waiting for the lease: the run goes on.
    result, again = copy().run_handing_off(handed.without_head(), hand_off_to=hands_to)
    assert result.state == ["s1", "s2", "s3"] and again.token == hands_to
    assert run_of(alias, cid).attempts == 0


@pytest.mark.parametrize("alias", [POSTGRES])
def test_a_hand_off_is_of_one_run_and_anything_else_is_none(alias: str) -> None:
    steps = appending(3)
    cid = started(alias, steps)
    _, handed, _ = step_of(alias, cid, steps, None)
    data = handed.as_dict()
    assert Handoff.from_dict(data, cid) == handed
    # Another run's hand-off, or no hand-off at all, is none.
    assert Handoff.from_dict(data, "another-run") is None
    for junk in ("text", ["a"], {"coordination_id": cid}, {**data, "token": 7}):
        assert Handoff.from_dict(junk, cid) is None, junk
    # Moving a signed head to another run, even with its run renamed, drops it.
    moved = Handoff.from_dict({**data, "coordination_id": "other"}, "other")
    assert moved is not None and moved.head is None


@pytest.mark.parametrize("alias", [POSTGRES])
def test_seeding_a_run_held_between_steps_reads_its_head_without_a_claim(alias: str) -> None:
    """``run()``/``resume()`` on a Celery or Temporal run that is running hand it over
    (``seed``): held from step to step, the run is not refused for it."""
    steps = appending(3)
    cid = started(alias, steps)
    result, handed, _ = step_of(alias, cid, steps, None)
    head = Workflow("handoff", cid, steps, OrmSnapshotStore(using=alias)).seed()
    assert head.id == result.snapshot_id
    assert run_of(alias, cid).runner == handed.token  # still held for the next step


@pytest.mark.parametrize("alias", [POSTGRES])
def test_a_held_run_moves_its_updated_at_at_most_once_a_second(alias: str) -> None:
    """A step that hands the run on leaves ``updated_at`` alone while it is younger than
    ``UPDATED_AT_STEP`` (no indexed column changes: PostgreSQL can update the row in
    place), and moves it once it is older; the last step, which lets go, moves it."""
    from datetime import timedelta

    from django.utils import timezone

    from flowwarden_django.workflows.backends.orm import UPDATED_AT_STEP

    steps = appending(4)
    cid = started(alias, steps)
    _, handed, _ = step_of(alias, cid, steps, None)
    moved_at = run_of(alias, cid).updated_at
    _, handed, _ = step_of(alias, cid, steps, handed)
    run = run_of(alias, cid)
    assert run.updated_at == moved_at and run.runner == handed.token
    old = timezone.now() - UPDATED_AT_STEP - timedelta(seconds=1)
    WorkflowRun.objects.using(alias).filter(pk=cid).update(updated_at=old)
    _, handed, _ = step_of(alias, cid, steps, handed)
    assert run_of(alias, cid).updated_at > old + UPDATED_AT_STEP
    result, _, _ = step_of(alias, cid, steps, handed)
    assert result == Completed(["s1", "s2", "s3", "s4"], cid)
    run = run_of(alias, cid)
    assert run.status == RunStatus.COMPLETED and run.updated_at > old + UPDATED_AT_STEP


def test_two_executions_under_one_token_are_kept_alive_under_keys_of_their_own() -> None:
    from flowwarden_django.workflows.execution.claim_keeper import ClaimKeeper, HeldClaim

    keeper = ClaimKeeper()
    lease = run_lease()
    first = HeldClaim("default", "cid", "handoff:t", lease, key="handoff:t#1")
    second = HeldClaim("default", "cid", "handoff:t", lease, key="handoff:t#2")
    keeper.hold(first)
    keeper.hold(second)
    assert len(keeper) == 2 and keeper.held_elsewhere(first)
    keeper.drop(first.key)
    assert len(keeper) == 1 and not keeper.held_elsewhere(second)
    keeper.drop(second.key)


@ALIASES
@pytest.mark.parametrize("failure", ["last attempt", "earlier attempt"])
def test_a_failing_copy_of_a_handed_step_leaves_the_run_to_the_other_copy(
    alias: str, failure: str
) -> None:
    """Two first deliveries of one handed step (a duplicated task) run at once, from
    one hand-off, under its one token. The copy whose attempt fails neither fails the
    run (its last attempt) nor lets go of it (an earlier one) under the other copy,
    whose claim is still renewed, and whose save then completes the run."""
    import threading

    from flowwarden_django.workflows.execution.claim_keeper import claim_keeper

    in_step, go = threading.Event(), threading.Event()

    @step("s1")
    def s1(state: list[str]) -> Any:
        return advance([*state, "s1"])

    @step("s2", max_retries=1 if failure == "earlier attempt" else 0)
    def s2(state: list[str]) -> Any:
        if threading.current_thread().name != "copy-b":
            raise RuntimeError("copy A's attempt fails")
        in_step.set()
        assert go.wait(30)
        return advance([*state, "s2"])

    steps = [s1, s2]
    cid = started(alias, steps)
    _, handed, _ = step_of(alias, cid, steps, None)
    hands_to = new_handoff_token("workflow", "run", "s2")
    attempt = 1 if failure == "earlier attempt" else None

    def copy() -> tuple[Any, Any]:
        runner = StepRunner(
            "handoff", cid, steps, OrmSnapshotStore(using=alias), held_by=(handed.token,)
        )
        try:
            return runner.run_handing_off(handed, attempt=attempt, hand_off_to=hands_to)
        finally:
            connections[alias].close()

    outcomes: list[Any] = []
    other = threading.Thread(target=lambda: outcomes.append(copy()), name="copy-b")
    other.start()
    try:
        assert in_step.wait(30)
        with pytest.raises(ConcurrentRunError if attempt is None else Exception) as raised:
            copy()
        if attempt is not None:
            assert type(raised.value).__name__ == "StepAttemptFailed"
        run = run_of(alias, cid)
        assert (run.status, run.runner) == (RunStatus.RUNNING, handed.token)
        # The other copy's claim is still renewed.
        held = [c for c in claim_keeper._claims.values() if c.coordination_id == cid]
        assert [c.runner for c in held] == [handed.token]
    finally:
        go.set()
        other.join(30)
    ((result, _),) = outcomes
    assert result == Completed(["s1", "s2"], cid)
    assert run_of(alias, cid).status == RunStatus.COMPLETED


@ALIASES
def test_two_copies_failing_at_once_fail_the_run_once(
    alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two first deliveries of one handed step fail their last attempt at once, and
    neither stops renewing before both have judged their failure: the last copy out
    fails the run (it must not be left running, held by a token nobody renews), the
    other stands down."""
    import threading

    from flowwarden_django.workflows.execution import claim_keeper as keeper_module

    both_failing = threading.Barrier(2)
    both_judged = threading.Barrier(2)
    real_drop = keeper_module.claim_keeper.drop

    def held_drop(key: str) -> None:
        if threading.current_thread().name.startswith("copy-"):
            both_judged.wait(30)
        real_drop(key)

    monkeypatch.setattr(keeper_module.claim_keeper, "drop", held_drop)

    @step("s1")
    def s1(state: list[str]) -> Any:
        return advance([*state, "s1"])

    @step("s2", max_retries=0)
    def s2(state: list[str]) -> Any:
        both_failing.wait(30)
        raise RuntimeError("both copies fail")

    steps = [s1, s2]
    cid = started(alias, steps)
    _, handed, _ = step_of(alias, cid, steps, None)
    hands_to = new_handoff_token("workflow", "run", "s2")
    outcomes: list[Any] = []

    def copy() -> None:
        runner = StepRunner(
            "handoff", cid, steps, OrmSnapshotStore(using=alias), held_by=(handed.token,)
        )
        try:
            outcomes.append(runner.run_handing_off(handed, hand_off_to=hands_to)[0])
        except BaseException as exc:
            outcomes.append(exc)
        finally:
            connections[alias].close()

    threads = [threading.Thread(target=copy, name=f"copy-{n}") for n in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    stood_down = [o for o in outcomes if isinstance(o, ConcurrentRunError)]
    failed = [o for o in outcomes if isinstance(o, Failed)]
    assert (len(stood_down), len(failed)) == (1, 1), outcomes
    run = run_of(alias, cid)
    assert run.status == RunStatus.FAILED and "both copies fail" in run.failure_reason
