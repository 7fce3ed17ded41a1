"""Loops and branches (issue 47, item 8): ``advance(state, to="step")`` continues at a
named step, earlier or later; the snapshots stay one chain; where a run continues is
decided by its latest snapshot (a resume, a crash, another runner, an upgrade);
``goes_to`` declares the graph, and a jump it does not allow, or to a step the
workflow lacks, fails the run with a clear reason."""

from __future__ import annotations

import itertools
import json
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from flowwarden_django.models import WorkflowRun
from flowwarden_django.workflows import (
    Advance,
    Completed,
    Failed,
    Hibernated,
    NeedsUpgrade,
    Running,
    RunStatus,
    Sleeping,
    Workflow,
    WorkflowGraph,
    advance,
    done,
    hibernate,
    sleep,
    step,
    workflow_registry,
)
from flowwarden_django.workflows.backends.memory import InMemorySnapshotStore
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.definition.metadata import FURTHEST_STEP, LAST_STEP, NEXT_STEP
from flowwarden_django.workflows.definition.steps import step_after
from flowwarden_django.workflows.operations.recovery import (
    last_step_of,
    position_of,
    recover_stalled_runs,
)
from flowwarden_django.workflows.operations.upgrades import (
    UPGRADE_METADATA,
    upgrade_registry,
    upgrade_runs,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["memory", "orm"])
def store(request: pytest.FixtureRequest) -> Any:
    return InMemorySnapshotStore() if request.param == "memory" else OrmSnapshotStore()


@pytest.fixture
def name() -> Iterator[str]:
    """A workflow name of this test; its definitions and upgrades are forgotten after."""
    workflow = f"loops-{uuid.uuid4().hex[:8]}"
    yield workflow
    workflow_registry.unregister(workflow)
    upgrade_registry.unregister(workflow)


def new_cid() -> str:
    return f"loop-{uuid.uuid4().hex[:12]}"


def record(cid: str) -> WorkflowRun:
    return WorkflowRun.objects.get(pk=cid)


def trail(state: dict[str, Any], step_name: str) -> dict[str, Any]:
    return {**state, "trail": [*state.get("trail", []), step_name]}


def counter_loop(times: int, calls: Counter, *, declared: bool = True) -> list[Any]:
    """``start``, then ``bump`` and ``check`` until ``n`` reaches *times*, then
    ``finish``: ``check`` jumps back to ``bump``."""

    @step("start")
    def start(state: dict[str, Any]) -> Any:
        calls["start"] += 1
        return advance({**state, "n": 0})

    @step("bump")
    def bump(state: dict[str, Any]) -> Any:
        calls["bump"] += 1
        return advance({**state, "n": state["n"] + 1})

    @step("check", goes_to=["bump"] if declared else None)
    def check(state: dict[str, Any]) -> Any:
        calls["check"] += 1
        if state["n"] < times:
            return advance(state, to="bump")
        return advance(state)

    @step("finish")
    def finish(state: dict[str, Any]) -> Any:
        calls["finish"] += 1
        return done({**state, "finished": True})

    return [start, bump, check, finish]


# -- loops and branches ---------------------------------------------------------------


@pytest.mark.parametrize("declared", [True, False], ids=["goes_to", "undeclared"])
def test_a_backward_jump_loops_in_one_chain_until_it_advances(store: Any, declared: bool) -> None:
    calls: Counter = Counter()
    cid = new_cid()
    wf = Workflow("counter", cid, counter_loop(5, calls, declared=declared), store)

    assert wf.run({}) == Completed({"n": 5, "finished": True}, cid)

    assert calls == {"start": 1, "bump": 5, "check": 5, "finish": 1}
    history = wf.history()
    # One chain: the seed, then one snapshot per step executed, at consecutive seq.
    assert [s.seq for s in history] == list(range(1, 14))
    assert history[0].parent_id is None
    for parent, child in itertools.pairwise(history):
        assert child.parent_id == parent.id
    steps = ["start", *["bump", "check"] * 5, "finish"]
    assert [s.metadata[LAST_STEP] for s in history] == ["", *steps]
    # Each jump is recorded on its step's snapshot, and only there.
    jumps = [s.metadata.get(NEXT_STEP) for s in history]
    assert jumps == [None, None, *([None, "bump"] * 4), None, None, None]
    # From the first jump on, the snapshots record the furthest step completed.
    assert [s.metadata.get(FURTHEST_STEP) for s in history[:4]] == [None, None, None, "check"]
    assert {s.metadata[FURTHEST_STEP] for s in history[4:-1]} == {"check"}
    assert history[-1].metadata[FURTHEST_STEP] == "finish"
    run = record(cid)
    assert (run.status, run.last_step, run.head_snapshot_id) == (
        RunStatus.COMPLETED,
        "finish",
        history[-1].id,
    )


def test_the_last_step_loops_back_and_completes_only_when_it_advances_without_to(
    store: Any,
) -> None:
    calls: Counter = Counter()

    @step("a")
    def a(state: dict[str, Any]) -> Any:
        calls["a"] += 1
        return advance({**state, "n": state["n"] + 1})

    @step("z")
    def z(state: dict[str, Any]) -> Any:
        calls["z"] += 1
        return advance(state, to="a") if state["n"] < 3 else advance(state)

    cid = new_cid()
    wf = Workflow("tail", cid, [a, z], store)
    assert wf.run({"n": 0}) == Completed({"n": 3}, cid)
    assert calls == {"a": 3, "z": 3}
    assert [s.metadata[LAST_STEP] for s in wf.history()] == ["", "a", "z", "a", "z", "a", "z"]


def test_a_forward_jump_skips_the_steps_between(store: Any) -> None:
    ran: list[str] = []

    def named(step_name: str, **options: Any) -> Any:
        @step(step_name, **options)
        def run(state: dict[str, Any]) -> Any:
            ran.append(step_name)
            if step_name == "a" and state.get("express"):
                return advance(trail(state, step_name), to="d")
            return advance(trail(state, step_name))

        return run

    steps = [named("a", goes_to=["d"]), named("b"), named("c"), named("d")]
    express, normal = new_cid(), new_cid()
    assert Workflow("branch", express, steps, store).run({"express": True}) == Completed(
        {"express": True, "trail": ["a", "d"]}, express
    )
    assert Workflow("branch", normal, steps, store).run({}) == Completed(
        {"trail": ["a", "b", "c", "d"]}, normal
    )
    assert ran == ["a", "d", "a", "b", "c", "d"]
    history = Workflow("branch", express, steps, store).history()
    assert [s.seq for s in history] == [1, 2, 3]
    assert history[1].metadata[NEXT_STEP] == "d"


def test_jumping_to_the_next_step_is_always_allowed(store: Any) -> None:
    @step("a", goes_to=[])
    def a(state: Any) -> Any:
        return advance(state, to="b")

    @step("b")
    def b(state: Any) -> Any:
        return done(state)

    cid = new_cid()
    assert Workflow("next", cid, [a, b], store).run("s") == Completed("s", cid)


# -- errors ---------------------------------------------------------------------------


def test_a_jump_to_a_step_the_workflow_lacks_fails_the_run_and_persists_nothing(
    store: Any,
) -> None:
    calls: Counter = Counter()

    @step("a")
    def a(state: Any) -> Any:
        calls["a"] += 1
        return advance(state, to="shp")

    @step("ship")
    def ship(state: Any) -> Any:
        return done(state)

    cid = new_cid()
    wf = Workflow("typo", cid, [a, ship], store)
    result = wf.run("s")
    assert isinstance(result, Failed)
    assert result.last_step_name == "a"
    assert result.reason == (
        "step 'a' jumps to 'shp', which is not a step of workflow 'typo' (its steps: a, ship)"
    )
    assert calls == {"a": 1}  # not retried: the code is wrong, not the world
    assert [s.metadata[LAST_STEP] for s in wf.history()] == [""]
    assert (record(cid).status, record(cid).failure_reason) == (RunStatus.FAILED, result.reason)
    assert wf.current_result() == Failed("s", cid, "a", result.reason)


def test_a_jump_its_step_does_not_declare_fails_the_run_naming_the_declared_steps(
    store: Any,
) -> None:
    @step("poll", goes_to=["poll", "ship"], max_retries=3, retry_delay=0)
    def poll(state: Any) -> Any:
        return advance(state, to="start")

    steps = [step("start")(lambda state: advance(state)), poll, step("ship")(done)]
    cid = new_cid()
    result = Workflow("declared", cid, steps, store).run("s")
    assert isinstance(result, Failed)
    assert result.reason == (
        "step 'poll' jumps to 'start', which its goes_to does not declare "
        "(declared: 'poll', 'ship'); add it to goes_to, or jump elsewhere"
    )
    # Nothing of the failed step was saved: a later run executes it again.
    assert [s.metadata[LAST_STEP] for s in Workflow("declared", cid, steps, store).history()] == [
        "",
        "start",
    ]


def test_goes_to_is_checked_when_the_workflow_is_defined(name: str, store: Any) -> None:
    a = step("a", goes_to=["a", "c"])(lambda state: advance(state))
    b = step("b")(lambda state: advance(state))
    with pytest.raises(ValueError, match=r"step 'a' of workflow 'w' goes_to 'c', which is not"):
        Workflow("w", new_cid(), [a, b], store)
    with pytest.raises(ValueError, match=r"goes_to 'c', which is not one of its steps \(a, b\)"):
        Workflow.define(name, [a, b], store)
    assert name not in workflow_registry
    with pytest.raises(ValueError, match="list of step names, not the string"):
        step("x", goes_to="a")(lambda state: advance(state))
    with pytest.raises(ValueError, match="non-blank strings"):
        step("x", goes_to=["a", " "])(lambda state: advance(state))
    for bad in ("", "  ", 3):
        with pytest.raises(ValueError, match="names a step of the workflow"):
            advance({}, to=bad)  # type: ignore[arg-type]
    assert advance({}, to=None) == Advance({}) == advance({})


def test_the_graph_shows_the_next_step_and_the_declared_jumps(name: str, store: Any) -> None:
    steps = [
        step("poll", goes_to=["wait", "ship"])(lambda state: advance(state)),
        step("wait", goes_to=["poll"])(lambda state: sleep(state, 60, to="poll")),
        step("ship")(lambda state: done(state)),
    ]
    definition = Workflow.define(name, steps, store)
    graph = definition.graph()
    assert graph == WorkflowGraph(
        ("poll", "wait", "ship"),
        {"poll": ("wait", "ship"), "wait": ("ship", "poll"), "ship": ()},
        frozenset({"ship"}),
    )
    assert graph.successors("wait") == ("ship", "poll")
    assert graph.may_jump_anywhere("ship") and not graph.may_jump_anywhere("poll")
    assert definition.workflow(new_cid()).graph() == graph
    assert step_after(steps, "wait") is steps[2]
    assert step_after(steps, "wait", "poll") is steps[0]
    assert step_after(steps, "wait", "gone") is None


# -- where a run continues -------------------------------------------------------------


def test_a_run_hibernated_with_a_jump_resumes_at_its_target(store: Any) -> None:
    """A run that polls: ``poll`` hibernates back to itself until the input says the
    parcel is delivered; a new ``Workflow`` (another process) resumes it each time."""
    polls: list[Any] = []

    @step("poll", goes_to=["poll"])
    def poll(state: dict[str, Any], ctx: Any) -> Any:
        polls.append(ctx.input)
        if ctx.input == "delivered":
            return advance(trail(state, "poll"))
        return hibernate(trail(state, "poll"), to="poll")

    @step("ship")
    def ship(state: dict[str, Any]) -> Any:
        return done(trail(state, "ship"))

    cid = new_cid()
    first = Workflow("poller", cid, [poll, ship], store).run({})
    assert first == Hibernated({"trail": ["poll"]}, cid, "poll")
    for attempt in range(2, 4):
        again = Workflow("poller", cid, [poll, ship], store).resume(input="not yet")
        assert again == Hibernated({"trail": ["poll"] * attempt}, cid, "poll")
    last = Workflow("poller", cid, [poll, ship], store).resume(input="delivered")
    assert last == Completed({"trail": ["poll"] * 4 + ["ship"]}, cid)
    assert polls == [None, "not yet", "not yet", "delivered"]
    assert [s.seq for s in Workflow("poller", cid, [poll, ship], store).history()] == list(
        range(1, 7)
    )


def test_a_sleep_with_a_jump_continues_at_its_target_when_it_wakes(store: Any) -> None:
    @step("poll")
    def poll(state: dict[str, Any]) -> Any:
        state = {**state, "polls": state["polls"] + 1}
        return advance(state) if state["polls"] == 3 else advance(state, to="nap")

    @step("ship")
    def ship(state: dict[str, Any]) -> Any:
        return done(state)

    @step("nap", goes_to=["poll"])
    def nap(state: dict[str, Any]) -> Any:
        return sleep(state, 3600, to="poll")

    cid = new_cid()
    wf = Workflow("napper", cid, [poll, ship, nap], store)
    first = wf.run({"polls": 0})
    assert isinstance(first, Sleeping) and first.last_step_name == "nap"
    assert record(cid).status == RunStatus.SLEEPING
    assert isinstance(wf.run(), Sleeping)  # woken early: poll, then nap again
    assert wf.run() == Completed({"polls": 3}, cid)
    steps = [s.metadata[LAST_STEP] for s in wf.history()]
    assert steps == ["", "poll", "nap", "poll", "nap", "poll", "ship"]


def test_max_steps_stops_after_a_jump_and_the_next_runner_continues_at_the_target(
    store: Any,
) -> None:
    """A provider that runs one step per task: each task is a new ``Workflow`` and
    ``run_local(max_steps=1)``, as a crash between two steps leaves the run."""
    calls: Counter = Counter()
    cid = new_cid()
    results = []
    while True:
        wf = Workflow("counter", cid, counter_loop(3, calls), store)
        result = wf.run_local({} if not results else None, max_steps=1)
        results.append(result)
        if not isinstance(result, Running):
            break
    assert results[-1] == Completed({"n": 3, "finished": True}, cid)
    assert calls == {"start": 1, "bump": 3, "check": 3, "finish": 1}
    # The Running after each check that jumped names its target.
    assert [(r.last_step_name, r.next_step_name) for r in results[:4]] == [
        ("start", ""),
        ("bump", ""),
        ("check", "bump"),
        ("bump", ""),
    ]


def test_a_fork_of_a_snapshot_that_jumped_continues_at_its_target(store: Any) -> None:
    calls: Counter = Counter()
    cid = new_cid()
    wf = Workflow("counter", cid, counter_loop(3, calls), store)
    assert wf.run({}) == Completed({"n": 3, "finished": True}, cid)
    jumped = next(s for s in wf.history() if s.metadata.get(NEXT_STEP) == "bump")
    assert jumped.state == {"n": 1}
    forked = wf.fork(jumped.id, {"n": 2})
    assert forked.metadata[NEXT_STEP] == "bump"
    assert wf.run() == Completed({"n": 3, "finished": True}, cid)
    assert calls["bump"] == 4  # three passes, then one more from the fork


def test_the_recovery_sweep_continues_a_stalled_run_at_its_jump_target(
    name: str, store: Any
) -> None:
    """A runner stopped right after ``check`` jumped (its execution ended there, as a
    dead runner's does once its claim runs out): the sweep hands the run over, and
    whatever continues it starts at ``bump``."""
    calls: Counter = Counter()
    definition = Workflow.define(name, counter_loop(2, calls), store)
    cid = new_cid()
    stopped = definition.workflow(cid).run_local({}, max_steps=3)
    assert (stopped.last_step_name, stopped.next_step_name) == ("check", "bump")
    assert position_of(record(cid)) == ("check", "bump")
    assert last_step_of(record(cid)) == "check"

    def enqueue(run: WorkflowRun) -> None:
        Workflow.for_coordination(run.pk).run()

    assert recover_stalled_runs(enqueue, older_than=timedelta(0)) == [cid]
    assert Workflow.for_coordination(cid).current_result() == Completed(
        {"n": 2, "finished": True}, cid
    )
    assert calls == {"start": 1, "bump": 2, "check": 2, "finish": 1}


def test_a_step_that_fails_after_a_jump_is_retried_at_the_jump_target(store: Any) -> None:
    """``check`` jumps back to ``bump``, whose second pass fails: the run stands at
    ``check``'s snapshot and fails at ``bump``; fixed, a resume continues at ``bump``."""
    broken = {"on": True}

    @step("bump")
    def bump(state: dict[str, Any]) -> Any:
        if state["n"] == 1 and broken["on"]:
            raise RuntimeError("the parcel service is down")
        return advance({**state, "n": state["n"] + 1})

    @step("check")
    def check(state: dict[str, Any]) -> Any:
        return advance(state, to="bump") if state["n"] < 2 else done(state)

    cid = new_cid()
    steps = [bump, check]
    result = Workflow("flaky", cid, steps, store).run({"n": 0})
    assert isinstance(result, Failed) and result.last_step_name == "bump"
    assert "the parcel service is down" in result.reason
    again = Workflow("flaky", cid, steps, store)
    assert again.current_result() == Failed({"n": 1}, cid, "bump", result.reason)
    broken["on"] = False
    assert again.resume() == Completed({"n": 2}, cid)
    assert [s.metadata[LAST_STEP] for s in again.history()] == [
        "",
        "bump",
        "check",
        "bump",
        "check",
    ]


def test_a_deploy_without_the_jump_target_leaves_the_run_for_an_upgrade(
    name: str, store: Any
) -> None:
    """v1 [poll, wait, ship]: ``wait`` hibernates back to ``poll``. v2 renames ``poll``
    to ``check``: the run waits as needs_upgrade, an upgrade that does not map the
    target refuses, one that does moves it, and it continues at ``check``."""
    ran: list[tuple[int, str]] = []

    def named(version: int, step_name: str, outcome: Any = advance, **jump: Any) -> Any:
        @step(step_name)
        def run(state: dict[str, Any]) -> Any:
            ran.append((version, step_name))
            return outcome(trail(state, step_name), **jump)

        return run

    v1 = [named(1, "poll"), named(1, "wait", hibernate, to="poll"), named(1, "ship", done)]
    Workflow.define(name, v1, store)
    cid = Workflow.start(name, {}).coordination_id
    assert Workflow.for_coordination(cid).current_result() == Hibernated(
        {"trail": ["poll", "wait"]}, cid, "wait"
    )
    v2 = [named(2, "check"), named(2, "wait", hibernate, to="check"), named(2, "ship", done)]
    workflow_registry.unregister(name)
    Workflow.define(name, v1, store, version=1)
    Workflow.define(name, v2, store, version=2)
    Workflow.define_upgrade(name, from_version=1, to_version=2)
    refused = upgrade_runs(name)
    assert [o.upgraded for o in refused] == [False]
    assert "continues at step 'poll' (its last step jumped there)" in refused[0].reason
    # v1 is gone from this deploy: the run cannot continue, and says why.
    workflow_registry.unregister(name, 1)
    Workflow.define(name, [named(1, "check"), *v1[1:]], store, version=1)
    stuck = Workflow.for_coordination(cid).resume()
    assert isinstance(stuck, NeedsUpgrade)
    assert "the step this run continues at (step 'wait' jumped to it), 'poll'" in stuck.reason
    upgrade_registry.unregister(name)
    Workflow.define_upgrade(name, from_version=1, to_version=2, steps={"poll": "check"})
    moved = upgrade_runs(name)
    assert [(o.upgraded, o.from_step, o.to_step, o.continued) for o in moved] == [
        (True, "wait", "wait", True)
    ]
    history = Workflow.for_coordination(cid).history()
    upgraded = next(s for s in history if UPGRADE_METADATA in s.metadata)
    assert upgraded.metadata[LAST_STEP] == "wait"
    assert (upgraded.metadata[NEXT_STEP], upgraded.metadata[FURTHEST_STEP]) == ("check", "wait")
    # The upgrade continued it (it was needs_upgrade): at check, then wait paused it.
    result = Workflow.for_coordination(cid).current_result()
    assert result == Hibernated({"trail": ["poll", "wait", "check", "wait"]}, cid, "wait")
    assert ran[-2:] == [(2, "check"), (2, "wait")]


# -- patches across a jump ------------------------------------------------------------


def test_a_patch_answer_stays_false_for_a_run_that_looped_back_before_the_change(
    name: str, store: Any
) -> None:
    """[ask (hibernates), ship, check]: ``check`` loops back to ``ask`` twice. ``old``
    completes ``ship`` with its old code, then the patch of ``ship`` is deployed
    while it waits at ``ask`` again: its next ``ship`` (and every step after) answer
    False, as they would have without the loop; a run started after the change
    answers True on both passes."""
    seen: list[tuple[str, int, str, bool]] = []

    @step("ask")
    def ask(state: dict[str, Any]) -> Any:
        return hibernate(state)

    def old_ship(state: dict[str, Any]) -> Any:
        return advance({**state, "passes": state["passes"] + 1})

    @step("ship", patches=["tracked"])
    def new_ship(state: dict[str, Any], ctx: Any) -> Any:
        seen.append((ctx.coordination_id, state["passes"], "ship", ctx.patched("tracked")))
        return advance({**state, "passes": state["passes"] + 1})

    @step("check")
    def check(state: dict[str, Any], ctx: Any) -> Any:
        if any(s.patches for s in workflow_registry.get(name).steps):
            seen.append((ctx.coordination_id, state["passes"], "check", ctx.patched("tracked")))
        return advance(state, to="ask") if state["passes"] < 2 else done(state)

    Workflow.define(name, [ask, step("ship")(old_ship), check], store)
    old = Workflow.start(name, {"passes": 0}).coordination_id
    assert isinstance(Workflow.for_coordination(old).resume(), Hibernated)  # back at ask
    head = Workflow.for_coordination(old).history()[-1]
    assert (head.metadata[LAST_STEP], head.metadata[FURTHEST_STEP]) == ("ask", "check")
    workflow_registry.unregister(name)
    Workflow.define(name, [ask, new_ship, check], store)  # the patch: the same version
    fresh = Workflow.start(name, {"passes": 0}).coordination_id
    for cid in (old, fresh):
        while not isinstance(result := Workflow.for_coordination(cid).resume(), Completed):
            assert isinstance(result, Hibernated)
    assert [s[1:] for s in seen if s[0] == old] == [(1, "ship", False), (2, "check", False)]
    assert [s[1:] for s in seen if s[0] == fresh] == [
        (0, "ship", True),
        (1, "check", True),
        (1, "ship", True),
        (2, "check", True),
    ]
    for cid, answer in ((old, False), (fresh, True)):
        head = Workflow.for_coordination(cid).history()[-1]
        assert json.loads(head.metadata["workflow.patches"]) == {"tracked": answer}


def test_a_step_that_ran_old_code_and_loops_back_records_its_own_patch_as_false(
    name: str, store: Any
) -> None:
    """Nobody asks: ``ship`` itself records its patch when it completes, False on a
    pass after a loop back over its old code (True on a run's first pass)."""

    @step("ship", patches=["tracked"])
    def ship(state: dict[str, Any]) -> Any:
        return hibernate({**state, "passes": state["passes"] + 1}, to="ship")

    Workflow.define(name, [step("ship")(ship.fn)], store)
    old = Workflow.start(name, {"passes": 0}).coordination_id
    workflow_registry.unregister(name)
    Workflow.define(name, [ship], store)
    fresh = Workflow.start(name, {"passes": 0}).coordination_id
    for cid in (old, fresh):
        Workflow.for_coordination(cid).resume()
    answers = {
        cid: Workflow.for_coordination(cid).history()[-1].metadata["workflow.patches"]
        for cid in (old, fresh)
    }
    assert answers == {old: '{"tracked":false}', fresh: '{"tracked":true}'}
