"""Durable sleep, cancel and step timings (issue 31) on the in-process engine: a
sleeping run holds nothing and the sweep wakes it at its time, ``resume()`` wakes it
early; a cancelled run never runs another step, a step running when it is cancelled
has its result discarded; each step's snapshot records its duration, attempts and
the errors of its failed attempts."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from flowwarden_django.models import Approval, ApprovalEvent, WorkflowRun
from flowwarden_django.workflows import (
    Cancelled,
    Completed,
    RunStatus,
    Sleeping,
    UnknownRunError,
    Workflow,
    advance,
    await_approval,
    sleep,
    step,
    workflow_registry,
)
from flowwarden_django.workflows.backends.memory import InMemorySnapshotStore
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.definition.metadata import STEP_ATTEMPTS, STEP_DURATION_MS, WAKE_AT
from flowwarden_django.workflows.execution.step_timings import step_timing_of
from flowwarden_django.workflows.operations.recovery import due_sleepers, recover_stalled_runs
from flowwarden_django.workflows.waiting.cancellation import cancellation_of

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["memory", "orm"])
def store(request: pytest.FixtureRequest) -> Any:
    return InMemorySnapshotStore() if request.param == "memory" else OrmSnapshotStore()


@pytest.fixture
def name() -> Iterator[str]:
    workflow = f"reminders-{uuid.uuid4().hex[:8]}"
    yield workflow
    workflow_registry.unregister(workflow)


def new_cid() -> str:
    return f"sct-{uuid.uuid4().hex[:12]}"


def record(cid: str) -> WorkflowRun:
    return WorkflowRun.objects.get(pk=cid)


def path_step(name: str, outcome: Any = advance, calls: list[str] | None = None) -> Any:
    @step(name)
    def run(state: dict[str, Any]) -> Any:
        if calls is not None:
            calls.append(name)
        return outcome({**state, "path": [*state.get("path", []), name]})

    return run


def sweep() -> list[str]:
    """The in-process sweep (``flowwarden_workflows recover``): continue what it hands."""
    return recover_stalled_runs(lambda run: Workflow.for_coordination(run.pk).run())


# -- sleep -------------------------------------------------------------------------------


def test_sleep_takes_exactly_one_of_for_and_until() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        sleep({})
    with pytest.raises(ValueError, match="exactly one"):
        sleep({}, 1, until=timezone.now())
    with pytest.raises(ValueError, match=">= 0"):
        sleep({}, -1)
    with pytest.raises(TypeError, match="seconds or a timedelta"):
        sleep({}, "2 days")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="aware datetime"):
        sleep({}, until=timezone.now().replace(tzinfo=None))
    assert sleep({}, timedelta(days=2)).wake_at > timezone.now() + timedelta(days=1)


def test_a_sleeping_run_holds_nothing_and_the_sweep_wakes_it_at_its_time(
    name: str, store: Any
) -> None:
    calls: list[str] = []
    steps = [
        path_step("ask", calls=calls),
        path_step("remind", lambda s: sleep(s, 0.6), calls),
        path_step("follow_up", calls=calls),
    ]
    Workflow.define(name, steps, store)
    cid = new_cid()
    result = Workflow.start(name, {}, coordination_id=cid).result
    assert isinstance(result, Sleeping) and result.status == RunStatus.SLEEPING
    run = record(cid)
    assert (run.status, run.runner, run.last_step) == (RunStatus.SLEEPING, "", "remind")
    assert run.wake_at == result.wake_at
    assert store.latest(cid).metadata[WAKE_AT] == result.wake_at.isoformat()
    assert Workflow.for_coordination(cid).current_result() == result
    assert sweep() == []  # not due yet
    assert calls == ["ask", "remind"]
    time.sleep(0.7)
    assert [r.pk for r in due_sleepers()] == [cid]
    assert sweep() == [cid]
    assert calls == ["ask", "remind", "follow_up"]
    run = record(cid)
    assert (run.status, run.wake_at) == (RunStatus.COMPLETED, None)
    assert sweep() == []  # woken once


def test_resume_wakes_a_sleeping_run_early_and_the_sweep_then_leaves_it(
    name: str, store: Any
) -> None:
    calls: list[str] = []
    steps = [
        path_step("nap", lambda s: sleep(s, timedelta(hours=1)), calls),
        path_step("after", calls=calls),
    ]
    Workflow.define(name, steps, store)
    cid = new_cid()
    Workflow.start(name, {}, coordination_id=cid)
    assert isinstance(Workflow.for_coordination(cid).resume(), Completed)
    assert calls == ["nap", "after"]
    assert (record(cid).status, record(cid).wake_at) == (RunStatus.COMPLETED, None)


def test_the_sweep_wakes_a_sleeper_once_when_two_sweeps_race(name: str) -> None:
    calls: list[str] = []
    steps = [path_step("nap", lambda s: sleep(s, 0), calls), path_step("after", calls=calls)]
    Workflow.define(name, steps, OrmSnapshotStore())
    cid = new_cid()
    Workflow.start(name, {}, coordination_id=cid)
    woken: list[list[str]] = []
    barrier = threading.Barrier(2)

    def race() -> None:
        barrier.wait()
        woken.append(sweep())

    threads = [threading.Thread(target=race) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(len(w) for w in woken) == [0, 1]
    assert calls == ["nap", "after"]


# -- cancel ------------------------------------------------------------------------------


def test_cancel_a_paused_run_writes_a_snapshot_and_it_never_runs_again(
    name: str, store: Any
) -> None:
    calls: list[str] = []
    steps = [
        path_step("first", lambda s: sleep(s, timedelta(days=2)), calls),
        path_step("second", calls=calls),
    ]
    Workflow.define(name, steps, store)
    cid = new_cid()
    Workflow.start(name, {"order": 7}, coordination_id=cid)
    wf = Workflow.for_coordination(cid)
    outcome = wf.cancel("order withdrawn", by="alice")
    assert (outcome.cancelled, outcome.status) == (True, RunStatus.CANCELLED)
    run = record(cid)
    assert (run.status, run.failure_reason, run.wake_at) == (
        RunStatus.CANCELLED,
        "order withdrawn",
        None,
    )
    head = store.latest(cid)
    assert run.head_snapshot_id == head.id
    assert cancellation_of(head) == {"reason": "order withdrawn", "by": "alice"}
    assert head.state == {"order": 7, "path": ["first"]}
    for again in (wf.run, wf.resume):
        result = again()
        assert isinstance(result, Cancelled) and result.reason == "order withdrawn"
    assert sweep() == []
    assert calls == ["first"]
    assert not wf.cancel("twice").cancelled  # already cancelled: nothing changes
    assert len(wf.history()) == 3  # seed, first, cancel
    assert isinstance(wf.current_result(), Cancelled)


def test_cancel_leaves_a_completed_run_and_refuses_an_unknown_one(name: str) -> None:
    Workflow.define(name, [path_step("only")], OrmSnapshotStore())
    cid = new_cid()
    Workflow.start(name, {}, coordination_id=cid)
    outcome = Workflow.for_coordination(cid).cancel("too late")
    assert (outcome.cancelled, outcome.status) == (False, RunStatus.COMPLETED)
    assert record(cid).status == RunStatus.COMPLETED
    with pytest.raises(UnknownRunError):
        Workflow(name, new_cid(), [path_step("only")], OrmSnapshotStore()).cancel()


def test_cancel_during_a_long_step_discards_its_result_and_runs_no_next_step(
    name: str,
) -> None:
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    @step("long")
    def long(state: dict[str, Any]) -> Any:
        calls.append("long")
        started.set()
        release.wait(60)
        return advance({**state, "long": True})

    Workflow.define(name, [long, path_step("next", calls=calls)], OrmSnapshotStore())
    cid = new_cid()
    results: list[Any] = []
    runner = threading.Thread(
        target=lambda: results.append(Workflow.start(name, {}, coordination_id=cid))
    )
    runner.start()
    assert started.wait(60)
    assert Workflow.for_coordination(cid).cancel("withdrawn", by="bob").cancelled
    release.set()
    runner.join(60)
    result = results[0].result
    assert isinstance(result, Cancelled) and result.reason == "withdrawn"
    assert calls == ["long"]
    wf = Workflow.for_coordination(cid)
    assert [s.metadata.get("workflow.lastStep") for s in wf.history()] == ["", ""]
    assert "long" not in wf.history()[-1].state
    assert record(cid).status == RunStatus.CANCELLED


def test_cancel_cancels_the_pending_approval_and_audits_who(name: str) -> None:
    steps = [
        step("ask")(lambda s: await_approval(s, prompt="ship?", assignees=["carol"])),
        path_step("ship"),
    ]
    Workflow.define(name, steps, OrmSnapshotStore())
    cid = new_cid()
    Workflow.start(name, {}, coordination_id=cid)
    approval = Approval.objects.get(coordination_id=cid)
    outcome = Workflow.for_coordination(cid).cancel("customer withdrew", by="dave")
    assert outcome.approvals == (str(approval.pk),)
    approval.refresh_from_db()
    assert approval.status == Approval.Status.CANCELLED
    event = ApprovalEvent.objects.filter(approval=approval).latest("at")
    assert (event.action, event.actor) == ("cancelled", "dave")
    assert "customer withdrew" in event.detail


# -- step timings ------------------------------------------------------------------------


def test_each_step_snapshot_records_its_duration_attempts_and_failed_attempts(
    name: str, store: Any
) -> None:
    tries = {"n": 0}

    @step("flaky", max_retries=2, retry_delay=0)
    def flaky(state: dict[str, Any]) -> Any:
        tries["n"] += 1
        if tries["n"] < 3:
            raise ConnectionError(f"carrier down (try {tries['n']})")
        time.sleep(0.02)
        return advance(state)

    Workflow.define(name, [path_step("quick"), flaky], store)
    cid = new_cid()
    Workflow.start(name, {}, coordination_id=cid)
    seed, quick, flaky_snapshot = Workflow.for_coordination(cid).history()
    assert step_timing_of(seed.metadata) is None
    timing = step_timing_of(quick.metadata)
    assert timing is not None and timing.attempts == 1 and timing.errors == ()
    assert timing.duration_ms is not None and timing.duration_ms >= 0
    timing = step_timing_of(flaky_snapshot.metadata)
    assert timing is not None and timing.attempts == 3
    assert timing.duration_ms is not None and timing.duration_ms >= 20
    assert [(e.attempt, e.error, e.message) for e in timing.errors] == [
        (1, "ConnectionError", "carrier down (try 1)"),
        (2, "ConnectionError", "carrier down (try 2)"),
    ]
    listed = timing.as_dict(with_messages=False)
    assert listed["errors"] == [
        {"attempt": 1, "error": "ConnectionError"},
        {"attempt": 2, "error": "ConnectionError"},
    ]
    assert json.loads(flaky_snapshot.metadata["workflow.step.errors"])[0]["attempt"] == 1
    assert {STEP_DURATION_MS, STEP_ATTEMPTS} <= set(flaky_snapshot.metadata)


def test_errors_of_attempts_run_one_by_one_wait_on_the_run_until_the_step_succeeds(
    name: str,
) -> None:
    """A provider that runs each attempt in a call of its own (Temporal): the failed
    attempts' errors wait on the run record, and the step's snapshot takes them."""
    from flowwarden_django.workflows.engine.calling import StepAttemptFailed

    tries = {"n": 0}

    @step("flaky", max_retries=2, retry_delay=0)
    def flaky(state: dict[str, Any]) -> Any:
        tries["n"] += 1
        if tries["n"] < 3:
            raise KeyError("card")
        return advance(state)

    Workflow.define(name, [flaky], OrmSnapshotStore())
    cid = new_cid()
    definition = workflow_registry.get(name)
    wf = definition.workflow(cid)
    wf.seed({})
    for attempt in (1, 2):
        with pytest.raises(StepAttemptFailed):
            wf.run_local(max_steps=1, attempt=attempt)
        assert [e["attempt"] for e in record(cid).step_errors] == list(range(1, attempt + 1))
    assert isinstance(wf.run_local(max_steps=1, attempt=3), Completed)
    assert record(cid).step_errors is None
    timing = step_timing_of(wf.history()[-1].metadata)
    assert timing is not None and timing.attempts == 3
    assert [(e.attempt, e.error) for e in timing.errors] == [(1, "KeyError"), (2, "KeyError")]


# -- child runs --------------------------------------------------------------------------


@pytest.fixture
def child_name() -> Iterator[str]:
    workflow = f"child-{uuid.uuid4().hex[:8]}"
    yield workflow
    workflow_registry.unregister(workflow)


def define_child(child_name: str, store: Any, outcome: Any = advance) -> list[str]:
    calls: list[str] = []

    @step("enrich")
    def enrich(state: dict[str, Any], ctx: Any) -> Any:
        calls.append(ctx.coordination_id)
        return outcome({**state, "enriched": state["n"] * 10})

    Workflow.define(child_name, [enrich], store)
    return calls


def test_a_parent_waits_for_its_children_and_reads_their_outcomes(
    name: str, child_name: str, store: Any
) -> None:
    from flowwarden_django.workflows import ChildResult, spawn

    child_calls = define_child(child_name, store)
    seen: list[Any] = []

    @step("fan_out")
    def fan_out(state: dict[str, Any]) -> Any:
        return spawn(state, [(child_name, {"n": n}) for n in range(1, 6)], then="results")

    @step("collect")
    def collect(state: dict[str, Any], ctx: Any) -> Any:
        seen.append(ctx.children)
        return advance({**state, "total": sum(r["state"]["enriched"] for r in state["results"])})

    Workflow.define(name, [fan_out, collect], store)
    cid = new_cid()
    result = Workflow.start(name, {}, coordination_id=cid).result
    assert isinstance(result, Completed) and result.final_state["total"] == 150
    assert len(child_calls) == 5 and len(set(child_calls)) == 5
    (children,) = seen
    assert [type(c) for c in children] == [ChildResult] * 5
    assert [(c.status, c.state["enriched"]) for c in children] == [
        ("completed", n * 10) for n in range(1, 6)
    ]
    rows = WorkflowRun.objects.filter(parent_coordination_id=cid).order_by("created_at")
    assert sorted(r.pk for r in rows) == sorted(c.coordination_id for c in children)
    assert {r.status for r in rows} == {RunStatus.COMPLETED}
    assert record(cid).status == RunStatus.COMPLETED


def test_a_parent_run_early_waits_and_the_sweep_continues_it_when_a_notice_was_lost(
    name: str, child_name: str
) -> None:
    """A child that waits (hibernates) keeps the parent waiting, also when the parent
    is run or resumed; once it finishes the parent continues, by the child's notice
    or, when that was lost, by the sweep."""
    from flowwarden_django.workflows import WaitingForChildren, hibernate, spawn
    from flowwarden_django.workflows.waiting import children as children_module

    store = OrmSnapshotStore()
    define_child(child_name, store, hibernate)
    steps = [
        step("fan_out")(lambda s: spawn(s, [(child_name, {"n": 1}), (child_name, {"n": 2})])),
        path_step("after"),
    ]
    Workflow.define(name, steps, store)
    cid = new_cid()
    assert isinstance(Workflow.start(name, {}, coordination_id=cid).result, WaitingForChildren)
    parent = Workflow.for_coordination(cid)
    assert isinstance(parent.resume(), WaitingForChildren)
    assert isinstance(parent.run(), WaitingForChildren)
    assert record(cid).status == RunStatus.WAITING_CHILDREN
    first, second = sorted(
        WorkflowRun.objects.filter(parent_coordination_id=cid).values_list("pk", flat=True)
    )
    Workflow.for_coordination(first).resume()
    assert record(cid).status == RunStatus.WAITING_CHILDREN
    # The last child's notice is lost (a crash right after its commit): the sweep.
    original = children_module.notify_parent
    children_module.notify_parent = lambda child: False
    try:
        import flowwarden_django.workflows.engine.workflow as engine_module

        engine_module.notify_parent = children_module.notify_parent
        Workflow.for_coordination(second).resume()
    finally:
        children_module.notify_parent = original
        engine_module.notify_parent = original
    assert record(cid).status == RunStatus.WAITING_CHILDREN
    assert sweep() == [cid]
    assert record(cid).status == RunStatus.COMPLETED
    assert sweep() == []


def test_a_failed_spawn_transaction_leaves_no_child_and_the_retry_makes_each_once(
    name: str, child_name: str
) -> None:
    from flowwarden_django.workflows import spawn
    from flowwarden_django.workflows.waiting.children import Spawn

    store = OrmSnapshotStore()
    define_child(child_name, store)
    Workflow.define(
        name,
        [step("fan_out")(lambda s: spawn(s, [(child_name, {"n": n}) for n in (1, 2, 3)]))],
        store,
    )
    cid = new_cid()
    original = Spawn.persist_with
    made: list[int] = []

    def crash_after_two(self: Any, workflow: Any, snapshot: Any) -> None:
        from flowwarden_django.workflows.waiting.children import _create_child

        for index, (child, state) in enumerate(self.children[:2], start=1):
            _create_child(
                workflow.runs.db, workflow.coordination_id, snapshot.id, index, child, state
            )
            made.append(index)
        raise RuntimeError("killed mid-spawn")

    Spawn.persist_with = crash_after_two
    try:
        with pytest.raises(RuntimeError, match="mid-spawn"):
            Workflow.start(name, {}, coordination_id=cid)
    finally:
        Spawn.persist_with = original
    assert made == [1, 2]
    assert not WorkflowRun.objects.filter(parent_coordination_id=cid).exists()
    assert isinstance(Workflow.for_coordination(cid).run(), Completed)
    assert WorkflowRun.objects.filter(parent_coordination_id=cid).count() == 3


def test_cancelling_a_parent_cancels_its_children(name: str, child_name: str) -> None:
    from flowwarden_django.workflows import hibernate, spawn

    store = OrmSnapshotStore()
    define_child(child_name, store, hibernate)
    Workflow.define(
        name, [step("fan_out")(lambda s: spawn(s, [(child_name, {"n": 1})] * 3))], store
    )
    cid = new_cid()
    Workflow.start(name, {}, coordination_id=cid)
    assert Workflow.for_coordination(cid).cancel("withdrawn", by="ops").cancelled
    statuses = set(
        WorkflowRun.objects.filter(parent_coordination_id=cid).values_list("status", flat=True)
    )
    assert statuses == {RunStatus.CANCELLED}
    assert record(cid).status == RunStatus.CANCELLED


def test_spawn_refuses_what_it_cannot_start(child_name: str) -> None:
    from flowwarden_django.workflows import spawn

    with pytest.raises(ValueError, match="not defined"):
        spawn({}, [("nope", {})])
    Workflow.define(child_name, [path_step("x")])
    with pytest.raises(ValueError, match="at least one"):
        spawn({}, [])
    with pytest.raises(TypeError, match="pair"):
        spawn({}, [child_name])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="must then be a dict"):
        spawn([1], [(child_name, {})], then="results")


def test_a_fork_of_the_spawning_snapshot_waits_for_the_same_children(
    name: str, child_name: str
) -> None:
    from flowwarden_django.workflows import WaitingForChildren, hibernate, spawn

    store = OrmSnapshotStore()
    define_child(child_name, store, hibernate)
    Workflow.define(
        name,
        [step("fan_out")(lambda s: spawn(s, [(child_name, {"n": 1})])), path_step("after")],
        store,
    )
    cid = new_cid()
    Workflow.start(name, {}, coordination_id=cid)
    parent = Workflow.for_coordination(cid)
    spawning = parent.history()[-1]
    parent.fork(spawning.id, {"forked": True})
    assert isinstance(parent.run(), WaitingForChildren)
    (child,) = WorkflowRun.objects.filter(parent_coordination_id=cid).values_list("pk", flat=True)
    Workflow.for_coordination(child).resume()  # the child finishes: the parent goes on
    assert record(cid).status == RunStatus.COMPLETED
    assert parent.history()[-1].state == {"forked": True, "path": ["after"]}


def test_a_fork_never_brings_a_cancelled_run_back(name: str) -> None:
    steps = [
        step("ask")(lambda s: await_approval(s, prompt="ship?", assignees=["carol"])),
        path_step("ship"),
    ]
    Workflow.define(name, steps, OrmSnapshotStore())
    cid = new_cid()
    Workflow.start(name, {}, coordination_id=cid)
    wf = Workflow.for_coordination(cid)
    asked = wf.history()[-1]
    assert wf.cancel("withdrawn").cancelled
    wf.fork(asked.id, {"again": True})
    assert record(cid).status == RunStatus.CANCELLED
    assert not Approval.objects.filter(coordination_id=cid, status="pending").exists()
    assert isinstance(wf.run(), Cancelled)


def test_a_child_failed_by_its_approval_s_expiry_lets_the_parent_go_on(
    name: str, child_name: str
) -> None:
    from flowwarden_django.workflows import spawn
    from flowwarden_django.workflows.waiting.approvals import sweep_approvals

    store = OrmSnapshotStore()
    ask = step("ask")(
        lambda s: await_approval(s, prompt="ok?", assignees=["x"], expires_in=1, on_expiry="fail")
    )
    Workflow.define(child_name, [ask, path_step("never")], store)
    Workflow.define(
        name,
        [step("fan_out")(lambda s: spawn(s, [(child_name, {})], then="kids")), path_step("after")],
        store,
    )
    cid = new_cid()
    Workflow.start(name, {}, coordination_id=cid)
    assert record(cid).status == RunStatus.WAITING_CHILDREN
    sweep_approvals(now=timezone.now() + timedelta(seconds=5), using="default")
    assert record(cid).status == RunStatus.COMPLETED
    final = Workflow.for_coordination(cid).current_result().final_state
    assert [kid["status"] for kid in final["kids"]] == ["failed"]
