"""Concurrent runners of one coordination on PostgreSQL: threads and two processes.

Exactly one runner advances a coordination; the others get ``ConcurrentRunError`` and
write nothing, so every step runs once and the snapshot ``seq``s have no gap and no
duplicate. Overlap is made to happen, not hoped for: the winner's first step waits
until every other runner has been refused.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import subprocess
import sys
import threading
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.db import connections
from django.utils import timezone

from flowwarden_django.models import WorkflowRun
from flowwarden_django.workflows import (
    Completed,
    ConcurrentRunError,
    SnapshotConflictError,
    StepContext,
    Workflow,
    advance,
    hibernate,
    step,
    workflow_registry,
)
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.definition.metadata import LAST_STEP
from tests.support import workflow_procs
from tests.support.lanes import lane_marks
from tests.testapp.models import Effect

ROOT = Path(__file__).resolve().parents[2]
DB = "postgres"
RUNNERS = 6

pytestmark = lane_marks("postgres", databases=[DB])


def new_cid() -> str:
    return f"race-{uuid.uuid4().hex[:12]}"


def store() -> Any:
    return OrmSnapshotStore(using=DB)


def run_threads(count: int, target: Any) -> None:
    """Start *count* threads on *target* behind a barrier; join them."""
    barrier = threading.Barrier(count)

    def body() -> None:
        try:
            barrier.wait(30)
            target()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads)


def assert_chain(cid: str, steps: list[str]) -> list[Any]:
    history = sorted((s for s in store().list() if s.coordination_id == cid), key=lambda s: s.seq)
    assert [s.seq for s in history] == list(range(1, len(steps) + 2))
    assert [s.metadata[LAST_STEP] for s in history] == ["", *steps]
    assert all(b.parent_id == a.id for a, b in itertools.pairwise(history))
    return history


class Race:
    """A three-step workflow whose first step holds the winner until the others lose."""

    def __init__(self, runners: int) -> None:
        self.lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.results: list[Any] = []
        self.refusals: list[ConcurrentRunError] = []
        self.others_refused = threading.Event()
        self.runners = runners

    def steps(self, first_outcome: Any = advance) -> list[Any]:
        def make(name: str, wait: bool) -> Any:
            @step(name)
            def run(state: dict[str, Any], ctx: StepContext) -> Any:
                with self.lock:
                    self.calls[name] += 1
                if wait:  # the winner stays in its step until all others were refused
                    assert self.others_refused.wait(30), "the other runners never gave up"
                return advance({**state, name: ctx.input})

            return run

        return [make("one", True), make("two", False), make("three", False)]

    def attempt(self, call: Any) -> None:
        try:
            result = call()
        except ConcurrentRunError as exc:
            with self.lock:
                self.refusals.append(exc)
                if len(self.refusals) == self.runners - 1:
                    self.others_refused.set()
            return
        with self.lock:
            self.results.append(result)


def test_threads_racing_to_run_a_new_coordination() -> None:
    race = Race(RUNNERS)
    cid = new_cid()
    wf = Workflow("race", cid, race.steps(), store(), using=DB)

    run_threads(RUNNERS, lambda: race.attempt(lambda: wf.run({"n": 1})))

    assert race.results == [Completed({"n": 1, "one": None, "two": None, "three": None}, cid)]
    assert len(race.refusals) == RUNNERS - 1
    assert all(f"'{cid}' is being run by " in str(e) for e in race.refusals)
    assert race.calls == {"one": 1, "two": 1, "three": 1}
    assert_chain(cid, ["one", "two", "three"])
    run = WorkflowRun.objects.using(DB).get(pk=cid)
    assert (run.status, run.attempts, run.runner) == ("completed", 0, "")  # no retry


def test_threads_racing_to_resume_a_hibernated_run() -> None:
    race = Race(RUNNERS)
    cid = new_cid()

    @step("ask")
    def ask(state: dict[str, Any]) -> Any:
        return hibernate(state)

    wf = Workflow("race", cid, [ask, *race.steps()], store(), using=DB)
    wf.run({})

    run_threads(RUNNERS, lambda: race.attempt(lambda: wf.resume(input="go")))

    assert race.results == [Completed({"one": "go", "two": None, "three": None}, cid)]
    assert len(race.refusals) == RUNNERS - 1
    assert race.calls == {"one": 1, "two": 1, "three": 1}
    assert_chain(cid, ["ask", "one", "two", "three"])
    run = WorkflowRun.objects.using(DB).get(pk=cid)
    assert (run.status, run.attempts, run.resume_input) == ("completed", 0, None)  # a resume


def test_a_runner_whose_lease_was_taken_over_cannot_write_its_step() -> None:
    """The second line of defence: the step snapshot's explicit ``seq``."""
    cid = new_cid()
    calls: Counter[str] = Counter()
    in_step, may_go = threading.Event(), threading.Event()

    def make(name: str) -> Any:
        @step(name)
        def run(state: list[str]) -> Any:
            calls[name] += 1
            if name == "one" and calls[name] == 1:
                in_step.set()
                assert may_go.wait(30)
            return advance([*state, name])

        return run

    wf = Workflow("race", cid, [make("one"), make("two")], store(), using=DB)
    slow_outcome: list[BaseException] = []

    def slow() -> None:
        try:
            wf.run([])
        except BaseException as exc:
            slow_outcome.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=slow)
    thread.start()
    try:
        assert in_step.wait(30)
        # The slow runner's lease runs out while it is still in its step ...
        WorkflowRun.objects.using(DB).filter(pk=cid).update(
            claimed_until=timezone.now() - timedelta(seconds=1)
        )
        # ... so another runner may take the run over, and finishes it.
        assert wf.run([]) == Completed(["one", "two"], cid)
    finally:
        may_go.set()
        thread.join(30)

    assert len(slow_outcome) == 1
    assert isinstance(slow_outcome[0], ConcurrentRunError)
    assert isinstance(slow_outcome[0].__cause__, SnapshotConflictError)
    assert calls == {"one": 2, "two": 1}  # a lost lease can repeat a step, never a snapshot
    assert_chain(cid, ["one", "two"])
    run = WorkflowRun.objects.using(DB).get(pk=cid)
    assert (run.status, run.runner) == ("completed", "")


def test_threads_racing_to_start_one_idempotency_key() -> None:
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    def make(name: str) -> Any:
        @step(name)
        def run(state: int) -> Any:
            with lock:
                calls[name] += 1
            return advance(state + 1)

        return run

    definition = Workflow.define("race-start", [make("a"), make("b")], store(), using=DB)
    key = f"event-{uuid.uuid4().hex}"
    started: list[Any] = []

    def start() -> None:
        result = definition.start(0, idempotency_key=key)
        with lock:
            started.append(result)

    try:
        run_threads(RUNNERS, start)
    finally:
        workflow_registry.unregister("race-start")

    assert len(started) == RUNNERS
    assert [s.created for s in started].count(True) == 1
    assert len({s.coordination_id for s in started}) == 1
    assert calls == {"a": 1, "b": 1}
    assert WorkflowRun.objects.using(DB).filter(idempotency_key=key).count() == 1
    cid = started[0].coordination_id
    assert next(s for s in started if s.created).result == Completed(2, cid)
    assert_chain(cid, ["a", "b"])


# -- two processes ---------------------------------------------------------------------


class Proc:
    """A ``tests.support.workflow_procs race`` subprocess and its JSON event lines."""

    def __init__(self, cid: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.workflow_procs", "race", cid],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def next_event(self) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=60)
        except queue.Empty:
            self.proc.kill()
            raise AssertionError(f"no output; stderr: {self.proc.communicate()[1]}") from None
        return json.loads(line)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def finish(self) -> int:
        stderr = self.proc.communicate(timeout=60)[1]
        assert self.proc.returncode == 0, stderr
        return self.proc.returncode


def test_two_processes_racing_on_one_coordination() -> None:
    definitions = workflow_procs.define_workflows(store(), using=DB)
    workflow_procs.effect_using = DB
    cid = new_cid()
    try:
        definitions[workflow_procs.RACE].workflow(cid).seed({"trail": []})
    finally:
        workflow_procs.effect_using = "default"
        for name in definitions:  # every one: a leftover sends later sweeps to postgres
            workflow_registry.unregister(name)
    connections[DB].close()

    db = connections[DB].settings_dict
    env = {
        "FW_WF_DB_ENGINE": "postgresql",
        "FW_WF_DB_NAME": db["NAME"],
        "FW_WF_DB_HOST": str(db["HOST"]),
        "FW_WF_DB_PORT": str(db["PORT"]),
        "FW_WF_DB_USER": str(db["USER"]),
        "FW_WF_DB_PASSWORD": str(db["PASSWORD"]),
    }
    procs = [Proc(cid, env), Proc(cid, env)]
    try:
        assert [p.next_event()["event"] for p in procs] == ["ready", "ready"]
        for p in procs:
            p.send("go")
        first = {id(p): p.next_event() for p in procs}
        winners = [p for p in procs if first[id(p)]["event"] == "in-step"]
        losers = [p for p in procs if first[id(p)]["event"] == "concurrent"]
        assert (len(winners), len(losers)) == (1, 1), first
        assert f"'{cid}' is being run by proc-" in first[id(losers[0])]["message"]
        winners[0].send("continue")
        result = winners[0].next_event()
        for p in procs:
            p.finish()
    finally:
        for p in procs:
            if p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait()

    assert (result["event"], result["kind"]) == ("result", "Completed")
    assert result["final_state"] == {"trail": ["one", "two", "three"]}
    assert_chain(cid, ["one", "two", "three"])
    effects = Effect.objects.using(DB).filter(stream__startswith=f"{cid}:")
    assert sorted(effects.values_list("stream", flat=True)) == [
        f"{cid}:one",
        f"{cid}:three",
        f"{cid}:two",
    ]
    assert {e.order_id for e in effects} == {winners[0].proc.pid}
    run = WorkflowRun.objects.using(DB).get(pk=cid)
    assert (run.status, run.attempts, run.runner) == ("completed", 0, "")  # no retry
