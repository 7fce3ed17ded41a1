"""The workflow engine's rules, on the in-memory and the ORM snapshot stores (SQLite),
plus resume in a fresh process (SQLite file and PostgreSQL)."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import subprocess
import sys
import threading
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connections, transaction
from django.utils import timezone

from flowwarden_django.models import WorkflowRun
from flowwarden_django.workflows import (
    Completed,
    ConcurrentRunError,
    Failed,
    Hibernated,
    NeedsUpgrade,
    Pause,
    RunStatus,
    StepContext,
    UnknownSnapshotError,
    Waiting,
    Workflow,
    WorkflowStep,
    advance,
    done,
    fail,
    hibernate,
    step,
    workflow_registry,
)
from flowwarden_django.workflows.backends.memory import InMemorySnapshotStore
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.definition.metadata import LAST_STEP, WORKFLOW_DONE, WORKFLOW_NAME
from flowwarden_django.workflows.runs.records import LeaseLostError, RunRecords, new_runner_token
from tests.support import workflow_procs
from tests.support.lanes import lane_marks, on_lane
from tests.testapp.models import Effect

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.django_db(transaction=True)


def make_store(kind: str, alias: str = "default") -> Any:
    if kind == "memory":
        return InMemorySnapshotStore()
    return OrmSnapshotStore(using=alias)


@pytest.fixture(params=["memory", "orm"])
def store(request: pytest.FixtureRequest) -> Any:
    return make_store(request.param)


def new_cid() -> str:
    return f"wf-{uuid.uuid4().hex[:12]}"


class Calls(Counter):
    """How many times each step ran."""


def appending(name: str, calls: Calls, outcome: Any = advance, **options: Any) -> Any:
    """A step that appends ``:<name>`` to a string state."""

    @step(name, **options)
    def run(state: str) -> Any:
        calls[name] += 1
        return outcome(f"{state}:{name}")

    return run


def record(cid: str) -> WorkflowRun:
    return WorkflowRun.objects.get(pk=cid)


# -- construction ----------------------------------------------------------------------


def test_empty_steps_are_rejected(store: Any) -> None:
    with pytest.raises(ValueError, match="no steps"):
        Workflow("w", new_cid(), [], store)


def test_duplicate_step_names_are_rejected(store: Any) -> None:
    calls = Calls()
    with pytest.raises(ValueError, match="duplicate step name 'a' in workflow 'w'"):
        Workflow("w", new_cid(), [appending("a", calls), appending("a", calls)], store)


def test_steps_from_a_class_and_a_bare_function(store: Any) -> None:
    class Shout(WorkflowStep):
        name = "shout"
        max_retries = 1

        def execute(self, state: str, ctx: StepContext) -> Any:
            return advance(state.upper())

    def exclaim(state: str) -> Any:
        return done(state + "!")

    wf = Workflow("w", new_cid(), [Shout(), exclaim], store)
    assert [s.name for s in wf.steps] == ["shout", "exclaim"]
    assert wf.run("hi") == Completed("HI!", wf.coordination_id)


# -- the snapshot chain ----------------------------------------------------------------


def test_linear_run_is_a_chain_of_snapshots(store: Any) -> None:
    calls = Calls()
    cid = new_cid()
    steps = [appending("a", calls), appending("b", calls), appending("c", calls, done)]
    wf = Workflow("linear", cid, steps, store)

    result = wf.run("start")

    assert result == Completed("start:a:b:c", cid)
    assert calls == {"a": 1, "b": 1, "c": 1}
    history = wf.history()
    assert [s.seq for s in history] == [1, 2, 3, 4]
    assert [s.state for s in history] == ["start", "start:a", "start:a:b", "start:a:b:c"]
    assert history[0].is_root
    for parent, child in itertools.pairwise(history):
        assert child.parent_id == parent.id
    assert [s.metadata[LAST_STEP] for s in history] == ["", "a", "b", "c"]
    assert [s.metadata[WORKFLOW_DONE] for s in history] == ["false"] * 3 + ["true"]
    assert {s.metadata[WORKFLOW_NAME] for s in history} == {"linear"}
    assert {s.agent_name for s in history} == {"linear"}
    run = record(cid)
    assert run.status == RunStatus.COMPLETED
    assert (run.head_snapshot_id, run.last_step) == (history[-1].id, "c")
    assert (run.runner, run.claimed_until) == ("", None)


def test_falling_off_the_end_completes(store: Any) -> None:
    calls = Calls()
    cid = new_cid()
    wf = Workflow("w", cid, [appending("a", calls), appending("b", calls)], store)
    assert wf.run("s") == Completed("s:a:b", cid)
    assert wf.history()[-1].metadata[WORKFLOW_DONE] == "false"
    assert wf.status() == RunStatus.COMPLETED
    assert wf.run("ignored") == Completed("s:a:b", cid)
    assert calls == {"a": 1, "b": 1}


def test_status_is_none_before_the_first_run(store: Any) -> None:
    wf = Workflow("w", new_cid(), [appending("a", Calls())], store)
    assert wf.status() is None
    assert wf.current_result() is None


# -- hibernate and resume ----------------------------------------------------------------


def test_hibernate_returns_and_a_new_instance_resumes_at_the_next_step(store: Any) -> None:
    calls = Calls()
    cid = new_cid()
    steps = [
        appending("setup", calls),
        appending("wait-for-human", calls, hibernate),
        appending("finish", calls, done),
    ]

    result = Workflow("hitl", cid, steps, store).run("init")

    assert result == Hibernated("init:setup:wait-for-human", cid, "wait-for-human")
    assert result.status == RunStatus.HIBERNATED
    run = record(cid)
    assert (run.status, run.last_step, run.runner) == ("hibernated", "wait-for-human", "")
    assert Workflow("hitl", cid, steps, store).current_result() == result

    resumed = Workflow("hitl", cid, steps, store).run("ignored")

    assert resumed == Completed("init:setup:wait-for-human:finish", cid)
    assert calls == {"setup": 1, "wait-for-human": 1, "finish": 1}


def test_hibernating_at_the_last_step_then_run_completes_without_running(store: Any) -> None:
    calls = Calls()
    cid = new_cid()
    wf = Workflow("w", cid, [appending("a", calls), appending("z", calls, hibernate)], store)
    assert isinstance(wf.run("s"), Hibernated)
    assert wf.run() == Completed("s:a:z", cid)
    assert calls == {"a": 1, "z": 1}
    assert wf.status() == RunStatus.COMPLETED


def test_a_fresh_run_ignores_initial_state_when_a_snapshot_exists(store: Any) -> None:
    calls = Calls()
    cid = new_cid()
    steps = [appending("seeded", calls, hibernate), appending("next", calls, done)]
    Workflow("w", cid, steps, store).run("seed-init")
    assert Workflow("w", cid, steps, store).run("ignored-init") == Completed(
        "seed-init:seeded:next", cid
    )


def test_resume_hands_input_to_the_next_step_only(store: Any) -> None:
    seen: list[tuple[str, Any]] = []

    def noting(name: str, outcome: Any) -> Any:
        @step(name)
        def run(state: dict[str, Any], ctx: StepContext) -> Any:
            seen.append((name, ctx.input))
            return outcome({**state, name: ctx.input})

        return run

    cid = new_cid()
    steps = [noting("ask", hibernate), noting("apply", advance), noting("after", done)]
    wf = Workflow("w", cid, steps, store)
    wf.run({})

    result = Workflow("w", cid, steps, store).resume(input={"approved": True, "by": "ann"})

    decision = {"approved": True, "by": "ann"}
    assert result == Completed({"ask": None, "apply": decision, "after": None}, cid)
    assert seen == [("ask", None), ("apply", decision), ("after", None)]
    assert record(cid).resume_input is None


def test_resume_input_survives_a_failed_step_until_it_succeeds(store: Any) -> None:
    attempts: list[Any] = []

    @step("apply")
    def apply(state: str, ctx: StepContext) -> Any:
        attempts.append(ctx.input)
        if len(attempts) == 1:
            return fail("not yet")
        return done(f"{state}:{ctx.input}")

    cid = new_cid()
    wf = Workflow("w", cid, [appending("ask", Calls(), hibernate), apply], store)
    wf.run("s")
    assert wf.resume(input="yes") == Failed("s:ask", cid, "apply", "not yet")
    assert record(cid).resume_input == "yes"
    assert wf.run() == Completed("s:ask:yes", cid)
    assert attempts == ["yes", "yes"]
    assert record(cid).resume_input is None


def test_resuming_a_completed_run_runs_nothing(store: Any) -> None:
    calls = Calls()
    cid = new_cid()
    wf = Workflow("w", cid, [appending("a", calls, done)], store)
    wf.run("s")
    assert wf.resume(input="late") == Completed("s:a", cid)
    assert calls == {"a": 1}
    assert record(cid).resume_input is None


class AwaitDecision(Pause):
    """What issue 6's ``await_approval`` plugs in: a pause with status ``waiting``."""

    status = RunStatus.WAITING

    paused: list[tuple[str, str, str]] = []

    def snapshot_metadata(self) -> dict[str, str]:
        return {"approval.pending": "true"}

    def on_paused(self, workflow: Workflow, snapshot: Any) -> None:
        self.paused.append((workflow.coordination_id, snapshot.id, workflow.status()))


def test_a_waiting_run_only_continues_with_input(store: Any) -> None:
    calls = Calls()
    cid = new_cid()
    steps = [appending("ask", calls, AwaitDecision), appending("act", calls, done)]
    wf = Workflow("w", cid, steps, store)

    assert wf.run("s") == Waiting("s:ask", cid, "ask")
    assert wf.status() == RunStatus.WAITING
    assert wf.history()[-1].metadata["approval.pending"] == "true"
    assert AwaitDecision.paused[-1] == (cid, wf.history()[-1].id, RunStatus.WAITING)
    assert wf.run() == Waiting("s:ask", cid, "ask")
    assert calls == {"ask": 1}

    assert wf.resume(input="approved") == Completed("s:ask:act", cid)
    assert "approval.pending" not in wf.history()[-1].metadata


# -- done, fail, retries ---------------------------------------------------------------


def test_done_in_a_middle_step_ends_the_run_for_good(store: Any) -> None:
    calls = Calls()
    cid = new_cid()
    steps = [appending("a", calls), appending("b", calls, done), appending("c", calls)]
    wf = Workflow("w", cid, steps, store)
    assert wf.run("s") == Completed("s:a:b", cid)
    assert wf.run() == Completed("s:a:b", cid)
    assert calls == {"a": 1, "b": 1}
    assert wf.status() == RunStatus.COMPLETED


def test_an_explicit_fail_is_not_retried_persists_nothing_and_reruns_the_step(
    store: Any,
) -> None:
    verdicts = ["validation-rejected", None]

    @step("guard", max_retries=3, retry_delay=0)
    def guard(state: str) -> Any:
        verdict = verdicts.pop(0)
        return fail(verdict) if verdict else advance(f"{state}:guarded")

    calls = Calls()
    cid = new_cid()
    wf = Workflow("w", cid, [appending("a", calls), guard, appending("z", calls, done)], store)

    assert wf.run("s") == Failed("s:a", cid, "guard", "validation-rejected")
    assert verdicts == [None]  # one attempt
    assert [s.metadata[LAST_STEP] for s in wf.history()] == ["", "a"]
    run = record(cid)
    assert (run.status, run.failure_reason, run.last_step) == ("failed", "validation-rejected", "a")
    assert wf.current_result() == Failed("s:a", cid, "guard", "validation-rejected")

    assert wf.run() == Completed("s:a:guarded:z", cid)
    assert calls == {"a": 1, "z": 1}
    assert (record(cid).status, record(cid).failure_reason) == ("completed", "")


def test_retries_succeed_within_the_budget(store: Any) -> None:
    seen: list[tuple[int, str]] = []

    @step("flaky", max_retries=2, retry_delay=0.005)
    def flaky(state: str, ctx: StepContext) -> Any:
        seen.append((ctx.attempt, ctx.idempotency_key))
        if ctx.attempt < 3:
            raise ConnectionError("try again")
        return done(f"{state}:ok-after-{ctx.attempt}")

    cid = new_cid()
    assert Workflow("w", cid, [flaky], store).run("x") == Completed("x:ok-after-3", cid)
    assert seen == [(1, f"{cid}:flaky"), (2, f"{cid}:flaky"), (3, f"{cid}:flaky")]


def test_exhausted_retries_fail_the_run(store: Any, caplog: pytest.LogCaptureFixture) -> None:
    attempts = Calls()

    @step("doomed", max_retries=2, retry_delay=0)
    def doomed(state: str) -> Any:
        attempts["doomed"] += 1
        raise ValueError("permanent")

    cid = new_cid()
    wf = Workflow("w", cid, [appending("a", Calls()), doomed], store)
    with caplog.at_level(logging.WARNING, "flowwarden_django.workflows"):
        result = wf.run("s")

    assert isinstance(result, Failed)
    assert (result.last_state, result.last_step_name) == ("s:a", "doomed")
    assert result.reason == "unhandled exception: ValueError: permanent"
    assert attempts == {"doomed": 3}
    assert len([r for r in caplog.records if "attempt" in r.getMessage()]) == 3
    assert wf.status() == RunStatus.FAILED
    assert [s.metadata[LAST_STEP] for s in wf.history()] == ["", "a"]
    # The run record counts retries of the run, not its executions or steps.
    assert wf.run_record().attempts == 0
    wf.resume()  # a failed run run again: a retry
    assert wf.run_record().attempts == 1


def test_a_step_returning_no_outcome_fails(store: Any) -> None:
    @step("sloppy")
    def sloppy(state: str) -> Any:
        return state

    result = Workflow("w", new_cid(), [sloppy], store).run("s")
    assert isinstance(result, Failed)
    assert result.reason.startswith("unhandled exception: TypeError: step 'sloppy' returned")


def test_a_step_timeout_fails_the_attempt_and_is_retried(store: Any) -> None:
    release = threading.Event()
    attempts: list[int] = []

    @step("slow", max_retries=1, retry_delay=0, timeout=0.2)
    def slow(state: str, ctx: StepContext) -> Any:
        attempts.append(ctx.attempt)
        release.wait(30)  # outlives the timeout until the test lets it go
        return done("too late")

    cid = new_cid()
    try:
        result = Workflow("w", cid, [slow], store).run("s")
    finally:
        release.set()
    assert isinstance(result, Failed)
    assert result.reason.startswith("unhandled exception: StepTimeoutError: step 'slow' did not")
    assert attempts == [1, 2]
    assert len(Workflow("w", cid, [slow], store).history()) == 1  # the seed only


def test_a_step_with_a_timeout_that_finishes_in_time_advances(store: Any) -> None:
    @step("quick", timeout=30)
    def quick(state: str, ctx: StepContext) -> Any:
        Effect.objects.create(order_id=1, stream=ctx.idempotency_key)  # its own connection
        return done(f"{state}:quick")

    cid = new_cid()
    assert Workflow("w", cid, [quick], store).run("s") == Completed("s:quick", cid)
    assert Effect.objects.filter(stream=f"{cid}:quick").count() == 1


# -- renamed steps, forks, deletion, store errors --------------------------------------


def test_an_unknown_last_step_stops_the_run_as_needing_an_upgrade(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A run never starts over: the step it stands after missing from the code that
    resumes it, it waits as ``needs_upgrade``, with its state, position and input,
    and goes on from there once that step is defined again."""
    calls = Calls()
    cid = new_cid()
    original = [appending("old", calls, hibernate), appending("b", calls)]
    Workflow("w", cid, original, store).run("s")
    renamed = [appending("new", calls), appending("b", calls, done)]
    with caplog.at_level(logging.WARNING, "flowwarden_django.workflows"):
        result = Workflow("w", cid, renamed, store).resume(input={"note": "kept"})
    assert isinstance(result, NeedsUpgrade)
    assert (result.state, result.last_step_name) == ("s:old", "old")
    assert "'old', is not a step of version 1 of workflow 'w'" in result.reason
    assert calls == {"old": 1}  # nothing ran again
    record = RunRecords().get(cid)
    assert record.status == RunStatus.NEEDS_UPGRADE and record.failure_reason == result.reason
    assert record.runner == "" and record.resume_input == {"note": "kept"}
    assert len(Workflow("w", cid, renamed, store).history()) == 2  # seed, old
    assert Workflow("w", cid, renamed, store).current_result() == result
    assert "needs an upgrade" in caplog.text

    assert Workflow("w", cid, original, store).run() == Completed("s:old:b", cid)
    assert calls == {"old": 1, "b": 1}


def test_fork_branches_off_a_snapshot_and_the_next_run_continues_from_it(store: Any) -> None:
    calls = Calls()
    cid = new_cid()
    steps = [appending("a", calls), appending("b", calls, hibernate), appending("c", calls, done)]
    wf = Workflow("w", cid, steps, store)
    wf.run("s")
    seed, after_a, after_b = wf.history()

    branch = wf.fork(after_a.id, "edited")

    assert branch.parent_id == after_a.id
    assert branch.seq == 4
    assert branch.metadata[LAST_STEP] == "a"
    assert store.latest(cid).id == branch.id
    assert wf.run() == Hibernated("edited:b", cid, "b")  # "b" runs again on the branch
    assert wf.status() == RunStatus.HIBERNATED
    assert wf.run() == Completed("edited:b:c", cid)
    history = wf.history()
    assert [s.parent_id for s in history[3:]] == [after_a.id, branch.id, history[4].id]
    children_of_a = [s.id for s in history if s.parent_id == after_a.id]
    assert children_of_a == [after_b.id, branch.id]  # a real branch
    assert calls == {"a": 1, "b": 2, "c": 1}

    with pytest.raises(UnknownSnapshotError):
        wf.fork(uuid.uuid4().hex, "nope")
    other = Workflow("w", new_cid(), steps, store)
    with pytest.raises(UnknownSnapshotError):
        other.fork(seed.id, "not mine")


def test_delete_all_snapshots_starts_over(store: Any) -> None:
    calls = Calls()
    cid = new_cid()
    wf = Workflow("w", cid, [appending("a", calls), appending("b", calls)], store)
    wf.run("one")
    assert wf.delete_all_snapshots() == 3
    assert wf.history() == []
    assert wf.run("two") == Completed("two:a:b", cid)


def test_store_errors_propagate_and_release_the_run(store: Any) -> None:
    class Broken(Exception):
        pass

    calls = Calls()
    cid = new_cid()
    wf = Workflow("w", cid, [appending("a", calls)], store)
    original = store.save
    store.save = lambda snapshot: (_ for _ in ()).throw(Broken("disk full"))
    try:
        with pytest.raises(Broken):
            wf.run("s")
    finally:
        store.save = original
    run = record(cid)
    assert (run.runner, run.claimed_until, run.status) == ("", None, RunStatus.RUNNING)
    assert wf.run("s") == Completed("s:a", cid)


# -- the run record ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "alias",
    [
        "default",
        pytest.param("postgres", marks=lane_marks("postgres", databases=["postgres"])),
        pytest.param("mariadb", marks=lane_marks("mariadb", databases=["mariadb"])),
    ],
)
def test_a_live_claim_refuses_a_second_runner_and_an_expired_one_is_taken_over(
    alias: str,
) -> None:
    runs = RunRecords(alias)
    cid = new_cid()
    first, second = new_runner_token(), new_runner_token()
    lease = timedelta(minutes=5)
    run, created = runs.create(cid, "w", runner=first, lease=lease)
    assert created and (run.runner, run.attempts) == (first, 0)

    with pytest.raises(ConcurrentRunError, match=f"is being run by {re.escape(first)} until "):
        runs.claim(cid, second, lease)
    runs.update(cid, first, lease, last_step="a")  # the holder renews: still refused
    with pytest.raises(ConcurrentRunError):
        runs.claim(cid, second, lease)

    WorkflowRun.objects.using(alias).filter(pk=cid).update(
        claimed_until=timezone.now() - timedelta(seconds=1)
    )
    run = runs.claim(cid, second, lease, resume_input={"decision": "yes"})
    # Taking over a claim that ran out is a retry.
    assert (run.runner, run.attempts, run.resume_input) == (second, 1, {"decision": "yes"})
    assert run.claimed_until > timezone.now() + timedelta(minutes=4)
    with pytest.raises(LeaseLostError):
        runs.update(cid, first, lease, last_step="x")
    assert runs.release(cid, first) is False
    assert runs.release(cid, second) is True


def test_a_run_held_by_another_runner_is_refused_and_untouched(store: Any) -> None:
    calls = Calls()
    cid = new_cid()
    wf = Workflow("w", cid, [appending("a", calls, hibernate), appending("b", calls)], store)
    wf.run("s")
    holder = new_runner_token()
    RunRecords("default").claim(cid, holder, timedelta(minutes=5))

    with pytest.raises(ConcurrentRunError, match=f"'{cid}' is being run by {re.escape(holder)}"):
        wf.run()
    assert calls == {"a": 1}
    assert len(wf.history()) == 2


def test_a_coordination_belongs_to_one_workflow(store: Any) -> None:
    cid = new_cid()
    Workflow("first", cid, [appending("a", Calls())], store).run("s")
    with pytest.raises(ValueError, match="is a run of workflow 'first', not 'second'"):
        Workflow("second", cid, [appending("a", Calls())], store).run("s")
    assert (record(cid).runner, record(cid).attempts) == ("", 0)  # nothing written


# -- start -------------------------------------------------------------------------------


@pytest.fixture
def registered(store: Any) -> Any:
    calls = Calls()
    definition = Workflow.define(
        "orders", [appending("reserve", calls), appending("ship", calls, done)], store
    )
    definition.calls = calls
    yield definition
    workflow_registry.unregister("orders")


def test_start_runs_once_per_idempotency_key(registered: Any) -> None:
    first = Workflow.start("orders", "o1", idempotency_key="event-1")
    again = Workflow.start("orders", "o1-again", idempotency_key="event-1")

    assert first.created and not again.created
    assert first.coordination_id == again.coordination_id
    assert first.result == Completed("o1:reserve:ship", first.coordination_id)
    assert again.result == first.result
    assert registered.calls == {"reserve": 1, "ship": 1}
    assert WorkflowRun.objects.filter(idempotency_key="event-1").count() == 1
    other = Workflow.start("orders", "o2", idempotency_key="event-2")
    assert other.created and other.coordination_id != first.coordination_id


def test_start_with_a_coordination_id_and_for_coordination(registered: Any) -> None:
    cid = new_cid()
    started = registered.start("o", coordination_id=cid, idempotency_key=f"k-{cid}")
    assert started.coordination_id == cid
    assert Workflow.for_coordination(cid).current_result() == Completed("o:reserve:ship", cid)
    with pytest.raises(LookupError, match="no workflow named 'nope'"):
        Workflow.start("nope", "x")


def test_start_inside_a_transaction_runs_after_commit(registered: Any) -> None:
    with transaction.atomic():
        started = Workflow.start("orders", "o", idempotency_key="in-tx")
        assert started.created
        assert registered.calls == {}
        assert started.result.status == RunStatus.RUNNING
    assert registered.calls == {"reserve": 1, "ship": 1}
    assert record(started.coordination_id).status == RunStatus.COMPLETED


def test_a_start_rolled_back_with_its_transaction_leaves_nothing(registered: Any) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        Workflow.start("orders", "o", idempotency_key="rolled-back")
        raise RuntimeError("handler failed")
    assert registered.calls == {}
    assert not WorkflowRun.objects.filter(idempotency_key="rolled-back").exists()
    assert Workflow.start("orders", "o", idempotency_key="rolled-back").created


# -- resume in a fresh process -------------------------------------------------------------


def _resume_in_subprocess(env: dict[str, str], cid: str, decision: Any) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.workflow_procs", "resume", cid, json.dumps(decision)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check_resume_across_processes(alias: str, env: dict[str, str]) -> None:
    store = OrmSnapshotStore(using=alias)
    definitions = workflow_procs.define_workflows(store, using=alias)
    workflow_procs.effect_using = alias
    try:
        started = definitions[workflow_procs.APPROVAL].start({"order": 7})
        cid = started.coordination_id
        assert started.result == Hibernated(
            {"order": 7, "prepared": True, "asked": True}, cid, "ask"
        )
        connections[alias].close()  # nothing of ours stays open on the database

        out = _resume_in_subprocess(env, cid, {"approved": True})
    finally:
        workflow_procs.effect_using = "default"
        workflow_registry.unregister(workflow_procs.APPROVAL)
        workflow_registry.unregister(workflow_procs.RACE)

    assert out["kind"] == "Completed"
    assert out["status"] == RunStatus.COMPLETED
    assert out["final_state"]["decision"] == {"approved": True}
    assert out["final_state"]["pid"] != os.getpid()
    history = sorted(store.list(), key=lambda s: s.seq)
    history = [s for s in history if s.coordination_id == cid]
    assert [s.metadata[LAST_STEP] for s in history] == ["", "prepare", "ask", "decide"]
    assert all(b.parent_id == a.id for a, b in itertools.pairwise(history))
    run = WorkflowRun.objects.using(alias).get(pk=cid)
    assert (run.status, run.head_snapshot_id, run.resume_input) == (
        "completed",
        history[-1].id,
        None,
    )
    effects = Effect.objects.using(alias).filter(stream__startswith=cid)
    assert sorted(effects.values_list("stream", flat=True)) == [f"{cid}:decide", f"{cid}:prepare"]


@pytest.mark.subprocess
def test_resume_in_a_fresh_process_sqlite_file() -> None:
    name = connections["default"].settings_dict["NAME"]
    _check_resume_across_processes("default", {"FW_WF_DB_ENGINE": "sqlite3", "FW_WF_DB_NAME": name})


@on_lane("postgres", databases=["postgres"])
def test_resume_in_a_fresh_process_postgres() -> None:
    db = connections["postgres"].settings_dict
    env = {
        "FW_WF_DB_ENGINE": "postgresql",
        "FW_WF_DB_NAME": db["NAME"],
        "FW_WF_DB_HOST": str(db["HOST"]),
        "FW_WF_DB_PORT": str(db["PORT"]),
        "FW_WF_DB_USER": str(db["USER"]),
        "FW_WF_DB_PASSWORD": str(db["PASSWORD"]),
    }
    _check_resume_across_processes("postgres", env)
