"""A runner killed mid-step, with the default settings, in-process: its run completes
within seconds; and a step far longer than the claim's lease is never taken over
while its process lives.

Both run the ``wf-slow-second`` workflow (``tests.support.workflow_procs``: four steps, the
second sleeping ``state["sleep"]`` seconds) in a ``tests.support.workflow_procs start``
subprocess against the PostgreSQL test database, beside a ``tests.support.workflow_procs
sweep`` subprocess: ``manage.py flowwarden_workflows recover --every``, the in-process
sweep as the README sets it up. Every step execution is logged to a file
(``tests.support.step_log``), which is how the steps are counted; the snapshots are checked
to be one chain. The Celery and Temporal twins are in ``tests/integrations``.
"""

from __future__ import annotations

import json
import signal
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from flowwarden_django.models import WorkflowRun
from flowwarden_django.workflows import RunStatus, workflow_registry
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from tests.support import workflow_procs
from tests.support.lanes import lane_marks
from tests.support.line_processes import JsonLinesProcess, database_env
from tests.support.step_log import assert_chained, executions

DB = "postgres"
#: The liveness bound: a run whose runner died completes within this many seconds of
#: a live runner (here the sweep) being there. The issue asks for 20 s; the bound
#: leaves room for a loaded CI machine, and the test prints the figure.
RECOVERY_BOUND = 30.0
#: How long the long step sleeps: six times the default claim lease (10 s).
LONG_STEP = 60.0

pytestmark = [
    *lane_marks("postgres", databases=["default", DB]),
    pytest.mark.slow,
    pytest.mark.subprocess,
]


class Proc(JsonLinesProcess):
    """A ``python -m tests.support.workflow_procs ...`` subprocess and its output lines."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        db = connections[DB].settings_dict
        env = {"FW_WF_DB_ENGINE": "postgresql", **database_env(db, str(db["HOST"]), db["PORT"])}
        super().__init__(["tests.support.workflow_procs", *args], env, log_path)


@pytest.fixture
def definitions() -> Any:
    defined = workflow_procs.define_workflows(OrmSnapshotStore(using=DB), using=DB)
    yield defined
    for name in defined:
        workflow_registry.unregister(name)


def _status(cid: str) -> str | None:
    run = WorkflowRun.objects.using(DB).filter(pk=cid).first()
    return None if run is None else run.status


def _wait(condition: Any, timeout: float, what: str, *procs: Proc) -> float:
    """Poll *condition* until it holds; the ``time.monotonic()`` when it did."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{what} did not happen within {timeout:.0f} s\n"
                + "\n".join(proc.describe() for proc in procs)
            )
        time.sleep(0.05)
    return time.monotonic()


def test_a_killed_in_process_runner_s_run_completes_by_the_sweep(definitions, tmp_path):
    """SIGKILL the process running the 3 s second step, start the sweep: the run
    completes, the killed step ran twice, every other step once, one chain."""
    cid = f"dead-inprocess-{uuid.uuid4().hex[:8]}"
    state = {"log": str(tmp_path / "steps.log"), "sleep": 3.0, "trail": []}
    runner = Proc(["start", workflow_procs.SLOW_SECOND, cid, json.dumps(state)], tmp_path / "r")
    sweeper = None
    try:
        _wait(
            lambda: any(e["step"] == "slow" for e in executions(state["log"])),
            60,
            "the slow step's start",
            runner,
        )
        time.sleep(1.0)  # mid-step
        runner.stop(signal.SIGKILL)
        assert runner.proc.returncode == -signal.SIGKILL
        sweeper = Proc(["sweep"], tmp_path / "sweep")
        sweeper.wait_for_line("Sweeping for stalled runs")
        live_at = time.monotonic()
        done_at = _wait(
            lambda: _status(cid) == RunStatus.COMPLETED,
            RECOVERY_BOUND,
            "the run's completion",
            sweeper,
        )
    finally:
        runner.stop(signal.SIGKILL)
        if sweeper is not None:
            sweeper.stop()
    counts = Counter(e["step"] for e in executions(state["log"]))
    print(
        f"\n[in-process] SIGKILL mid-step, default settings: the run completed "
        f"{done_at - live_at:.1f} s after the sweep started; step executions {dict(counts)}",
        file=sys.stderr,
    )
    assert counts == {"one": 1, "slow": 2, "three": 1, "four": 1}
    assert_chained(
        definitions[workflow_procs.SLOW_SECOND].workflow(cid), ["one", "slow", "three", "four"]
    )


#: How long the sleeping run may take to complete before the test fails: a liveness
#: deadline, not the wake latency (about one sweep interval, 2 s), which a loaded
#: machine may stretch; the test only checks that it never wakes early.
SLEEP_DEADLINE = 60.0


def test_a_two_second_sleep_wakes_by_the_in_process_sweep_not_before_its_time(
    definitions, tmp_path
):
    """Issue 31: a run sleeps 2 s after its first step; its process returns at once
    (nothing held), and ``flowwarden_workflows recover --every`` continues it once
    it is due, never before."""
    cid = f"napper-{uuid.uuid4().hex[:8]}"
    state = {"log": str(tmp_path / "steps.log"), "nap": 2.0, "trail": []}
    sweeper = Proc(["sweep"], tmp_path / "sweep")
    try:
        sweeper.wait_for_line("Sweeping for stalled runs")
        runner = Proc(["start", workflow_procs.NAPPER, cid, json.dumps(state)], tmp_path / "r")
        assert runner.proc.wait(timeout=60) == 0  # returned: the sleep holds no thread
        _wait(
            lambda: _status(cid) == RunStatus.COMPLETED,
            SLEEP_DEADLINE,
            "the run's completion",
            sweeper,
        )
    finally:
        sweeper.stop()
    history = definitions[workflow_procs.NAPPER].workflow(cid).history()
    wake_at = json_time(history[2].metadata["workflow.wakeAt"])
    late = (history[3].created_at - wake_at).total_seconds()
    print(f"\n[in-process] a 2 s sleep woke {late:.2f} s after its wake time", file=sys.stderr)
    assert late >= 0  # not woken early; how late is a figure, not a pass/fail bound
    assert [e["step"] for e in executions(state["log"])] == ["one", "nap", "three"]


def json_time(text: str) -> Any:
    from datetime import datetime

    return datetime.fromisoformat(text)


def test_a_parent_killed_mid_spawn_completes_once_with_its_five_children(definitions, tmp_path):
    """Issue 31: SIGKILL the process while it runs the third of the five children its
    parent spawned (the spawn committed; children 1-2 done, 3 running, 4-5 not
    started); with the sweep, every child completes, the parent continues once, with
    the five results; no child is doubled and only the killed step ran twice."""
    cid = f"fan-out-{uuid.uuid4().hex[:8]}"
    state = {"log": str(tmp_path / "steps.log"), "stall": 3}
    runner = Proc(["start", workflow_procs.FAN_OUT, cid, json.dumps(state)], tmp_path / "r")
    sweeper = None
    try:
        _wait(
            lambda: any(e.get("n") == 3 for e in executions(state["log"])),
            60,
            "the third child's step",
            runner,
        )
        runner.stop(signal.SIGKILL)
        assert runner.proc.returncode == -signal.SIGKILL
        sweeper = Proc(["sweep"], tmp_path / "sweep")
        sweeper.wait_for_line("Sweeping for stalled runs")
        live_at = time.monotonic()
        done_at = _wait(
            lambda: _status(cid) == RunStatus.COMPLETED,
            RECOVERY_BOUND,
            "the parent's completion",
            sweeper,
        )
    finally:
        runner.stop(signal.SIGKILL)
        if sweeper is not None:
            sweeper.stop()
    log = executions(state["log"])
    print(
        f"\n[in-process] SIGKILL mid-spawn: the parent completed {done_at - live_at:.1f} s "
        f"after the sweep started",
        file=sys.stderr,
    )
    assert Counter(e["step"] for e in log if e["cid"] == cid) == {"fan_out": 1, "collect": 1}
    assert [e["children"] for e in log if e["step"] == "collect"] == [5]
    assert Counter(e["n"] for e in log if e["step"] == "enrich") == {1: 1, 2: 1, 3: 2, 4: 1, 5: 1}
    children = WorkflowRun.objects.using(DB).filter(parent_coordination_id=cid)
    assert children.count() == 5
    assert set(children.values_list("status", flat=True)) == {RunStatus.COMPLETED}
    final = definitions[workflow_procs.FAN_OUT].workflow(cid).current_result()
    assert final.final_state["total"] == 150


def test_a_step_six_leases_long_is_never_taken_over_while_its_process_lives(definitions, tmp_path):
    """A 60 s step under the default 10 s lease, with the sweep running all along:
    its claim is renewed, so nothing takes the run over, and it runs once."""
    cid = f"long-step-{uuid.uuid4().hex[:8]}"
    state = {"log": str(tmp_path / "steps.log"), "sleep": LONG_STEP, "trail": []}
    sweeper = Proc(["sweep"], tmp_path / "sweep")
    runner = Proc(["start", workflow_procs.SLOW_SECOND, cid, json.dumps(state)], tmp_path / "r")
    try:
        sweeper.wait_for_line("Sweeping for stalled runs")
        result = json.loads(runner.wait_for_line('{"event": "result"', LONG_STEP + 60))
    finally:
        runner.stop(signal.SIGKILL)
        sweeper.stop()
    counts = Counter(e["step"] for e in executions(state["log"]))
    run = WorkflowRun.objects.using(DB).get(pk=cid)
    print(
        f"\n[in-process] a {LONG_STEP:.0f} s step, default 10 s lease, sweep every 2 s: "
        f"step executions {dict(counts)}, retries {run.attempts}",
        file=sys.stderr,
    )
    assert result["kind"] == "Completed"
    assert counts == {"one": 1, "slow": 1, "three": 1, "four": 1}
    assert run.attempts == 0  # never taken over, never retried
    assert not [line for line in sweeper.printed if "Continuing" in line], sweeper.printed
    assert_chained(
        definitions[workflow_procs.SLOW_SECOND].workflow(cid), ["one", "slow", "three", "four"]
    )
