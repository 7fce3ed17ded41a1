"""Workflows on Celery: one task per step, in a real worker, on a real Redis broker.

The worker is a subprocess (``celery -A tests.support.celery_app worker``) with
``DJANGO_SETTINGS_MODULE=tests.support.celery_workflow_settings``: its default database is
the PostgreSQL test database of this run (this process's ``postgres`` alias) and
its broker is Redis db 14, on a queue of the test's own. The workflows
(``tests/support/celery_workflows.py``) log every step execution to a file, which is how
steps are counted and how the test sees a step start. Runs are started here through
``CeleryExecutionProvider`` with a producer app on that queue.

The kill test SIGKILLs a step mid-way and checks from the data that it ran again
and the run completed, three ways: the whole worker process group killed and the
message redelivered after the Redis ``visibility_timeout``; the same with a long
visibility timeout, recovered by the sweep (``recover_workflows``); only the pool
child killed (``reject_on_worker_lost`` requeues the message, and the task waits
for the dead runner's lease to end).

The unit tests at the end need no server (SQLite and an in-memory snapshot store):
the fallback to in-process when the broker is unreachable, a failed publish, the step
task's guard against stale or stray tasks, its retry when it meets a live claim, the
sweep's choice of runs, and the per-step ``time_limit``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("celery", reason="the Celery tests need celery")
pytest.importorskip("redis", reason="the Celery workflow tests need redis-py")

from celery import Celery
from celery import _state as celery_state
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from flowwarden_django.integrations.celery import tasks as fw_tasks
from flowwarden_django.integrations.celery.provider import (
    CONFLICT_RETRIES,
    STEP_TASK,
    TIME_LIMIT_MARGIN,
    BrokerUnavailableError,
    CeleryExecutionProvider,
    Origin,
    recover_workflows,
    run_step,
    send_step,
    step_time_limit,
)
from flowwarden_django.models import WorkflowRun
from flowwarden_django.workflows import (
    Completed,
    Hibernated,
    Running,
    RunStatus,
    Workflow,
    advance,
    hibernate,
    step,
    workflow_registry,
)
from flowwarden_django.workflows.backends.memory import InMemorySnapshotStore
from flowwarden_django.workflows.execution.providers import configured_provider, reset_providers
from flowwarden_django.workflows.execution.step_timings import step_timing_of
from flowwarden_django.workflows.operations.recovery import recover_stalled_runs
from flowwarden_django.workflows.runs.records import RunRecords
from tests.support import celery_workflows as flows
from tests.support.celery_procs import CeleryWorker as Worker
from tests.support.celery_procs import wait_until as _wait_until
from tests.support.celery_workflow_settings import transport_options
from tests.support.lanes import lane_marks
from tests.support.step_log import assert_chained, executions

ROOT = Path(__file__).resolve().parents[2]
DB = "postgres"
#: Upper bounds of the waits: a hang fails the test instead of blocking CI.
WAIT = 60.0
#: The liveness bound of the dead-worker test: its run completes within this many
#: seconds of a live worker (issue: 20 s; room for a loaded CI machine).
RECOVERY_BOUND = 30.0
SOLO = ["--pool=solo"]
PREFORK = ["--pool=prefork", "--concurrency=1"]


def on_servers(test: Callable[..., Any]) -> Callable[..., Any]:
    """The postgres and redis lanes: skipped, or failed in CI, when a server is down."""
    for mark in [
        *lane_marks("postgres", databases=["default", DB]),
        pytest.mark.lane("redis"),
    ]:
        test = mark(test)
    return test


def execution(value: Any) -> Any:
    return override_settings(FLOWWARDEN={"WORKFLOW_EXECUTION": value})


@pytest.fixture(autouse=True)
def _fresh_providers() -> Iterator[None]:
    reset_providers()
    yield
    reset_providers()


# -- the worker, the queue, the producer ----------------------------------------------- #


@pytest.fixture
def producer(broker_url: str, queue: str) -> Iterator[Celery]:
    """The app this process publishes steps with; not made the current app."""
    app = Celery("fw-wf-producer", broker=broker_url, fixups=[], set_as_current=False)
    app.conf.task_default_queue = queue
    app.conf.broker_transport_options = transport_options(queue)
    yield app
    app.close()


@pytest.fixture
def provider(producer: Celery) -> CeleryExecutionProvider:
    return CeleryExecutionProvider(app=producer)


@pytest.fixture
def definitions() -> Iterator[dict[str, Any]]:
    """The test workflows, registered in this process on the ``postgres`` alias."""
    defined = flows.define_workflows(DB)
    yield defined
    for name in defined:
        workflow_registry.unregister(name)


# -- helpers ------------------------------------------------------------------------------ #


def new_state(tmp_path: Path) -> dict[str, Any]:
    return {"log": str(tmp_path / "steps.log"), "trail": []}


def received(worker: Worker) -> int:
    """How many step tasks *worker* has received (its log says so for each)."""
    prefix = f"Task {STEP_TASK}["
    return sum(1 for line in worker.log().splitlines() if prefix in line and "] received" in line)


def wait_for_status(wf: Workflow, status: str, worker: Worker) -> None:
    _wait_until(lambda: wf.status() == status, WAIT, f"run {wf.coordination_id} {status}", worker)


# -- with a worker ------------------------------------------------------------------------ #


@on_servers
def test_each_step_is_one_task_and_the_snapshots_form_a_chain(
    definitions, provider, start_worker, tmp_path
):
    worker = start_worker(SOLO)
    state = new_state(tmp_path)
    with execution(provider):
        started = Workflow.start(flows.THREE, state, idempotency_key=uuid.uuid4().hex)
    cid = started.coordination_id
    assert (started.created, started.result) == (True, Running(state, cid, ""))

    wf = definitions[flows.THREE].workflow(cid)
    wait_for_status(wf, RunStatus.COMPLETED, worker)
    assert wf.current_result() == Completed({**state, "trail": ["one", "two", "three"]}, cid)
    assert_chained(wf, ["one", "two", "three"])
    # For the admin's timeline: each step records the provider and worker that ran it.
    timings = [step_timing_of(s.metadata) for s in wf.history()[1:]]
    assert {(t.provider, bool(t.worker)) for t in timings if t} == {("celery", True)}
    runs = executions(state["log"])
    assert [e["step"] for e in runs] == ["one", "two", "three"]
    # One task per step: three task ids, and the worker received three tasks.
    assert len({e["task"] for e in runs} - {None}) == 3
    assert received(worker) == 3, worker.log_tail()


@on_servers
def test_a_hibernated_run_holds_no_task_and_resumes_through_the_provider(
    definitions, provider, start_worker, tmp_path, queue, redis_client
):
    worker = start_worker(SOLO)
    state = new_state(tmp_path)
    cid = f"pause-{uuid.uuid4().hex[:12]}"
    wf = definitions[flows.PAUSING].workflow(cid)
    unacked_key = transport_options(queue)["unacked_key"]
    with execution(provider):
        assert wf.run(state) == Running(state, cid, "")
        wait_for_status(wf, RunStatus.HIBERNATED, worker)
        # The pause step's task published nothing before its message was acked: once
        # the message is gone from the unacked set, the queue must be empty.
        _wait_until(
            lambda: redis_client.hlen(unacked_key) == 0,
            WAIT,
            "the pause step's message to be acked",
            worker,
        )
        assert redis_client.llen(queue) == 0
        assert received(worker) == 2
        paused = {**state, "trail": ["one", "pause"]}
        assert wf.current_result() == Hibernated(paused, cid, "pause")

        assert wf.resume(input={"approved": True}) == Running(paused, cid, "pause")
        wait_for_status(wf, RunStatus.COMPLETED, worker)

    final = {**state, "trail": ["one", "pause", "decide"], "decision": {"approved": True}}
    assert wf.current_result() == Completed(final, cid)
    assert [e["step"] for e in executions(state["log"])] == ["one", "pause", "decide"]
    assert_chained(wf, ["one", "pause", "decide"])
    assert received(worker) == 3
    assert wf.run_record().resume_input is None


@on_servers
def test_a_loop_runs_one_task_per_step_and_resumes_at_its_jump_target(
    definitions, provider, start_worker, tmp_path
):
    """``check`` jumps back to ``bump`` twice (each step its own task), then hibernates
    back to it; resumed through the provider, the run continues at ``bump``."""
    worker = start_worker(SOLO)
    state = new_state(tmp_path)
    cid = f"loop-{uuid.uuid4().hex[:12]}"
    wf = definitions[flows.LOOPING].workflow(cid)
    with execution(provider):
        wf.run(state)
        wait_for_status(wf, RunStatus.HIBERNATED, worker)
        assert [e["step"] for e in executions(state["log"])] == ["bump", "check"] * 3
        assert received(worker) == 6
        wf.resume()
        wait_for_status(wf, RunStatus.COMPLETED, worker)
    steps = ["bump", "check"] * 4
    assert [e["step"] for e in executions(state["log"])] == steps
    assert received(worker) == 8
    assert wf.current_result() == Completed({**state, "trail": steps, "n": 4}, cid)
    assert_chained(wf, steps)


@on_servers
def test_a_two_second_sleep_holds_no_task_and_wakes_by_the_sweep_not_before_its_time(
    definitions, provider, start_worker, tmp_path, queue, redis_client
):
    worker = start_worker(SOLO, execution="celery")  # which runs the workers' sweep
    state = {**new_state(tmp_path), "nap": 2.0}
    cid = f"sleep-{uuid.uuid4().hex[:12]}"
    wf = definitions[flows.SLEEPING].workflow(cid)
    with execution(provider):
        wf.run(state)
    wait_for_status(wf, RunStatus.SLEEPING, worker)
    wake_at = wf.run_record().wake_at
    assert redis_client.llen(queue) == 0  # nothing queued while it sleeps
    # A liveness deadline (WAIT), not the wake latency (about one sweep interval, 2 s),
    # which a loaded machine may stretch.
    wait_for_status(wf, RunStatus.COMPLETED, worker)
    after = wf.history()[-1]
    late = (after.created_at - wake_at).total_seconds()
    print(f"\n[celery] a 2 s sleep woke {late:.2f} s after its wake time", file=sys.stderr)
    assert late >= 0  # not woken early; how late is a figure, not a pass/fail bound
    assert [e["step"] for e in executions(state["log"])] == ["one", "nap", "three"]
    assert_chained(wf, ["one", "nap", "three"])
    assert wf.run_record().wake_at is None


@on_servers
def test_a_cancel_during_a_long_step_runs_no_next_step(
    definitions, provider, start_worker, tmp_path
):
    worker = start_worker(SOLO)
    state = {**new_state(tmp_path), "sleep": 3.0}
    cid = f"cancel-{uuid.uuid4().hex[:12]}"
    wf = definitions[flows.SLOW_SECOND].workflow(cid)
    with execution(provider):
        wf.run(state)
    _wait_until(
        lambda: any(e["step"] == "slow" for e in executions(state["log"])),
        WAIT,
        "the slow step to start",
        worker,
    )
    with execution(provider):
        assert wf.cancel("order withdrawn", by="ops").cancelled
    # The slow step's task finishes (its result discarded), and nothing follows it.
    _wait_until(lambda: finished_tasks(worker) >= 2, WAIT, "the slow step's task", worker)
    time.sleep(1.0)  # a next step, were one queued, would have started by now
    assert [e["step"] for e in executions(state["log"])] == ["one", "slow"]
    record = wf.run_record()
    assert (record.status, record.failure_reason) == (RunStatus.CANCELLED, "order withdrawn")
    assert [s.metadata["workflow.lastStep"] for s in wf.history()] == ["", "one", "one"]
    assert "cancelled" in worker.log() or received(worker) == 2


@on_servers
@pytest.mark.slow
def test_a_parent_whose_child_s_worker_is_killed_completes_once_with_five_results(
    definitions, provider, start_worker, tmp_path
):
    """Issue 31: a parent spawns five children on two workers; the pool child running
    the third child's step is SIGKILLed (the spawn committed, children mid-way). Every
    child completes, the parent continues once with the five results, no child is
    doubled and only the killed step ran twice."""
    workers = [start_worker(PREFORK, lease="2s", execution="celery") for _ in range(2)]
    state = {**new_state(tmp_path), "stall": 3}
    cid = f"fan-{uuid.uuid4().hex[:12]}"
    wf = definitions[flows.FAN_OUT].workflow(cid)
    with execution(provider):
        wf.run(state)

    def stalled() -> list[dict[str, Any]]:
        return [e for e in executions(state["log"]) if e.get("n") == 3]

    children = WorkflowRun.objects.using(DB).filter(parent_coordination_id=cid)
    _wait_until(
        lambda: bool(stalled()) and children.filter(status=RunStatus.COMPLETED).count() == 4,
        WAIT,
        "four children done and the third's step running",
        workers[0],
    )
    os.kill(stalled()[0]["pid"], signal.SIGKILL)
    wait_for_status(wf, RunStatus.COMPLETED, workers[0])
    log = executions(state["log"])
    enrich_pids = Counter(e["pid"] for e in log if e["step"] == "enrich")
    print(f"\n[celery] children's steps by process: {dict(enrich_pids)}", file=sys.stderr)
    assert Counter(e["step"] for e in log if e["cid"] == cid) == {"fan_out": 1, "collect": 1}
    assert [e["children"] for e in log if e["step"] == "collect"] == [5]
    assert Counter(e["n"] for e in log if e["step"] == "enrich") == {1: 1, 2: 1, 3: 2, 4: 1, 5: 1}
    assert children.count() == 5
    assert set(children.values_list("status", flat=True)) == {RunStatus.COMPLETED}
    assert wf.current_result().final_state["total"] == 150


class Beat:
    """``celery beat`` with django-celery-beat's database scheduler, beside a worker."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        import subprocess

        from tests.support.story_procs import die_with_parent

        self.log_path = log_path
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.support.celery_app",
            "beat",
            "-S",
            "django_celery_beat.schedulers:DatabaseScheduler",
            "--loglevel=INFO",
            "--max-interval=1",
        ]
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    def sent(self, name: str) -> int:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text.count(f"Sending due task {name} ")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def scheduled_runs(name: str) -> Any:
    return WorkflowRun.objects.using(DB).filter(idempotency_key__startswith=f"schedule:{name}:")


@on_servers
@pytest.mark.slow
@pytest.mark.parametrize("steps_on", ["in-process", "celery"])
def test_a_beat_schedule_starts_exactly_one_run_per_tick(
    definitions, start_worker, tmp_path, broker_url, queue, steps_on
):
    """Issue 31: django-celery-beat sends the start task every 3 s: one run per tick,
    each keyed by its tick; the same tick sent again starts nothing; ticks missed while
    no worker ran start one run, for the latest tick. The runs' steps run in the
    worker's task (in-process) or as step tasks (the Celery provider)."""
    pytest.importorskip("django_celery_beat")
    from flowwarden_django.integrations.celery.schedules import START_TASK, schedule_workflow

    name = f"fw-every-3s-{uuid.uuid4().hex[:6]}"
    template = {"log": str(tmp_path / "steps.log"), "trail": [], "tick": "{tick}"}
    schedule_workflow(name, flows.THREE, state=template, every=timedelta(seconds=3), using=DB)
    worker = start_worker(SOLO, execution="celery" if steps_on == "celery" else "")
    # Ready before beat sends: a start that waits a period for a worker is late, and
    # counts for the tick it runs in (the documented policy), not the one it was sent in.
    worker.wait_ready()
    beat = Beat(worker.env, tmp_path / "beat.log")
    try:
        _wait_until(lambda: beat.sent(name) >= 4, WAIT, "four ticks sent", worker)
    finally:
        beat.stop()

    # What reached the broker: beat logs a send just before publishing it, and was
    # killed at any point after that line. Every start the worker received has its
    # run completed (a late one would be received before the runs before it end).
    def starts_received() -> int:
        return sum(
            1
            for line in worker.log().splitlines()
            if f"Task {START_TASK}[" in line and "] received" in line
        )

    def a_run_per_start() -> bool:
        done = scheduled_runs(name).filter(status=RunStatus.COMPLETED).count()
        return starts_received() >= 3 and done == starts_received()

    _wait_until(a_run_per_start, WAIT, "a run per tick", worker)
    sent = starts_received()
    assert sent >= 3, worker.log_tail()
    runs = list(scheduled_runs(name))
    assert len({run.idempotency_key for run in runs}) == sent <= beat.sent(name)
    assert {run.status for run in runs} == {RunStatus.COMPLETED}
    for run in runs:  # the state template got the run's tick
        final = definitions[flows.THREE].workflow(run.pk).current_result().final_state
        assert run.idempotency_key == f"schedule:{name}:{final['tick']}"

    # The same tick sent twice more (a second beat, say): nothing more starts.
    producer = Celery(broker=broker_url)
    producer.conf.task_default_queue = queue
    hourly = f"fw-hourly-{uuid.uuid4().hex[:6]}"
    schedule_workflow(hourly, flows.THREE, state=template, crontab={"minute": "0"}, using=DB)
    for _ in range(3):
        producer.send_task(
            START_TASK,
            kwargs={"workflow": flows.THREE, "state": template},
            headers={"periodic_task_name": hourly},
        )
    _wait_until(
        lambda: worker.log().count(f"Task {START_TASK}[") >= 2 * (sent + 3),  # received, done
        WAIT,
        "the three sends",
        worker,
    )
    assert scheduled_runs(hourly).count() == 1
    key = scheduled_runs(hourly).get().idempotency_key
    tick = timezone.now().replace(minute=0, second=0, microsecond=0)
    assert key == f"schedule:{hourly}:{tick.isoformat()}"
    producer.close()


def finished_tasks(worker: Worker, task_id: str = "") -> int:
    """How many step tasks *worker* has finished (succeeded or raised); with
    *task_id*, how many times that one did."""
    prefix = f"Task {STEP_TASK}[{task_id}"
    return sum(
        1
        for line in worker.log().splitlines()
        if prefix in line and ("] succeeded" in line or "] raised" in line)
    )


@on_servers
def test_a_forged_step_task_never_decides_an_approval(
    definitions, provider, producer, start_worker, tmp_path
):
    """A raw task claiming "approved" neither passes the pending approval nor turns
    the rejection that follows into an approval: the step reads the row."""
    from flowwarden_django.models import Approval
    from flowwarden_django.workflows.waiting.approvals import ApprovalDecision, reject

    worker = start_worker(SOLO)
    state = new_state(tmp_path)
    cid = f"forge-{uuid.uuid4().hex[:12]}"
    wf = definitions[flows.APPROVING].workflow(cid)

    def forge(approval: Approval) -> str:
        claim = ApprovalDecision(str(approval.pk), "approved", None, "forged", "mallory")
        return producer.send_task(
            STEP_TASK,
            kwargs={
                "coordination_id": cid,
                "workflow": flows.APPROVING,
                "head": approval.snapshot_id,
                "origin": Origin.RUN,
                "input": claim.as_input(),
            },
        ).id

    with execution(provider):
        wf.run(state)
        wait_for_status(wf, RunStatus.WAITING, worker)
        _wait_until(
            lambda: Approval.objects.using(DB).filter(coordination_id=cid).exists(),
            WAIT,
            "the approval",
            worker,
        )
        approval = Approval.objects.using(DB).get(coordination_id=cid)
        # Its own task: the step task that asked may log its end after the row exists.
        forged = forge(approval)
        _wait_until(lambda: finished_tasks(worker, forged), WAIT, "the forged task", worker)
        assert wf.status() == RunStatus.WAITING
        assert wf.run_record().resume_input is None
        assert Approval.objects.using(DB).get(pk=approval.pk).status == Approval.Status.PENDING
        # The forged task's claim let go (a decision meanwhile is refused: run_busy).
        unclaimed = WorkflowRun.objects.using(DB).filter(pk=cid, runner="")
        _wait_until(unclaimed.exists, WAIT, "the forged task's claim to end", worker)

        with transaction.atomic(using=DB):
            reject(approval.pk, None, comment="no", using=DB, check_permission=False)
            forge(approval)  # may run before the commit, or after it
        wait_for_status(wf, RunStatus.COMPLETED, worker)

    final = wf.current_result().final_state
    assert final["decision"] == ["rejected", "no", None]
    assert [e["step"] for e in executions(state["log"])] == ["one", "ask", "settle"]
    assert_chained(wf, ["one", "ask", "settle"])


@on_servers
@pytest.mark.parametrize("recovery", ["redelivery", "sweep", "pool-child"])
def test_a_step_killed_mid_way_runs_again_and_the_run_completes(
    recovery, definitions, provider, producer, start_worker, tmp_path
):
    """SIGKILL while ``slow`` sleeps; ``slow`` runs again, the other steps once.

    * ``redelivery``: the worker's whole process group is killed; a new worker gets
      the unacked message back after the 3 s visibility timeout (the dead runner's
      2 s lease is over by then).
    * ``sweep``: the same with a 1 h visibility timeout (kombu's default): the message
      stays with the dead worker and ``recover_workflows`` queues the step again once
      the lease has ended.
    * ``pool-child``: only the prefork child running the step is killed; the worker
      requeues the message (``reject_on_worker_lost``), and the task, finding the
      dead child's claim still live, retries when it ends.
    """
    visibility = 3.0 if recovery == "redelivery" else 3600.0
    first = start_worker(PREFORK, lease="2s", visibility_timeout=visibility)
    state = new_state(tmp_path)
    cid = f"kill-{recovery}-{uuid.uuid4().hex[:8]}"
    wf = definitions[flows.KILLABLE].workflow(cid)
    with execution(provider):
        assert wf.run(state) == Running(state, cid, "")

    def slow_started() -> list[dict[str, Any]]:
        return [e for e in executions(state["log"]) if e["step"] == "slow"]

    _wait_until(lambda: bool(slow_started()), WAIT, "the slow step to start", first)
    killed_at = time.monotonic()
    if recovery == "pool-child":
        os.kill(slow_started()[0]["pid"], signal.SIGKILL)
        worker = first
    else:
        first.kill()
        assert first.proc.returncode == -signal.SIGKILL
        worker = start_worker(PREFORK, lease="2s", visibility_timeout=visibility)
    if recovery == "sweep":
        _wait_until(
            lambda: cid in recover_workflows(producer, older_than=timedelta(0), using=DB),
            WAIT,
            "the sweep to find the stalled run",
            worker,
        )
    wait_for_status(wf, RunStatus.COMPLETED, worker)
    took = time.monotonic() - killed_at

    counts = Counter(e["step"] for e in executions(state["log"]))
    killed_task, rerun_task = (e["task"] for e in slow_started())
    # Whether the requeued task met the dead runner's live claim (and retried) depends
    # on how fast the kill was noticed: reported, not asserted.
    retried = f"Task {STEP_TASK}[{killed_task}] retry: Retry in" in worker.log()
    print(
        f"\n[{recovery}] run completed {took:.1f} s after the SIGKILL; "
        f"step executions: {dict(counts)}"
        + (f"; waited for the dead runner's lease: {retried}" if recovery == "pool-child" else ""),
        file=sys.stderr,
    )
    assert counts == {"one": 1, "slow": 2, "three": 1}
    # Which message ran the step again: the killed one (redelivered or requeued), or a
    # new one queued by the sweep.
    assert (killed_task == rerun_task) is (recovery != "sweep")
    assert wf.current_result() == Completed({**state, "trail": ["one", "slow", "three"]}, cid)
    assert_chained(wf, ["one", "slow", "three"])


@on_servers
@pytest.mark.slow
def test_a_killed_worker_s_run_completes_with_the_default_settings(
    definitions, provider, start_worker, tmp_path
):
    """The README's setup and defaults (``WORKFLOW_EXECUTION = "celery"``, a 10 s
    claim lease, Redis' 1 h visibility timeout, no beat), ``--pool=threads``: the
    worker is SIGKILLed while the 3 s second step runs and a new one is started. Its
    own recovery sweep finds the dead runner's claim run out and queues the step
    again: the run completes, the killed step ran twice, every other step once."""
    threads = ["--pool=threads", "--concurrency=4"]
    first = start_worker(threads, lease="", execution="celery")
    first.wait_ready()
    state = {**new_state(tmp_path), "sleep": 3.0}
    cid = f"dead-celery-{uuid.uuid4().hex[:8]}"
    wf = definitions[flows.SLOW_SECOND].workflow(cid)
    with execution(provider):
        wf.run(state)
    _wait_until(
        lambda: any(e["step"] == "slow" for e in executions(state["log"])),
        WAIT,
        "the slow step to start",
        first,
    )
    time.sleep(1.0)  # mid-step
    first.kill()
    assert first.proc.returncode == -signal.SIGKILL
    second = start_worker(threads, lease="", execution="celery")
    second.wait_ready()
    live_at = time.monotonic()
    _wait_until(
        lambda: wf.status() == RunStatus.COMPLETED, RECOVERY_BOUND, "the run's completion", second
    )
    took = time.monotonic() - live_at
    counts = Counter(e["step"] for e in executions(state["log"]))
    print(
        f"\n[celery] worker SIGKILLed mid-step, default settings: the run completed "
        f"{took:.1f} s after a new worker was ready; step executions {dict(counts)}",
        file=sys.stderr,
    )
    assert counts == {"one": 1, "slow": 2, "three": 1, "four": 1}
    assert_chained(wf, ["one", "slow", "three", "four"])


# -- versions ------------------------------------------------------------------------------ #


@pytest.fixture
def versions() -> Iterator[Callable[..., dict[tuple[str, int], Any]]]:
    """``versions(1, 2)``: define those versions of the versioned workflows here."""
    defined: list[str] = []

    def define(*numbers: int) -> dict[tuple[str, int], Any]:
        found = flows.define_versions(DB, numbers)
        defined.extend(name for name, _ in found)
        return found

    yield define
    from flowwarden_django.workflows.operations.upgrades import upgrade_registry

    for name in set(defined):
        workflow_registry.unregister(name)
        upgrade_registry.unregister(name)


def versioned_worker(start_worker: Callable[..., Worker], versions: str, tag: str) -> Worker:
    return start_worker(
        SOLO,
        env={"FLOWWARDEN_TEST_WORKFLOW_VERSIONS": versions, "FLOWWARDEN_TEST_WORKER_TAG": tag},
    )


@on_servers
def test_a_rolling_deploy_runs_each_version_on_the_workers_that_define_it(
    versions, provider, start_worker, tmp_path
):
    """Two workers on one queue, one with version 1 of the workflow and one with
    version 2: every step of a version-1 run ran on the first, every step of a
    version-2 run on the second (the other hands them back)."""
    defined = versions(1, 2)
    old = versioned_worker(start_worker, "1", "old")
    new = versioned_worker(start_worker, "2", "new")
    state = new_state(tmp_path)
    runs: dict[str, int] = {}
    with execution(provider):
        for _ in range(4):
            for version in (1, 2):
                started = defined[(flows.ROLLING, version)].start(state)
                runs[started.coordination_id] = version
    for cid, version in runs.items():
        wf = defined[(flows.ROLLING, version)].workflow(cid)
        worker = old if version == 1 else new
        wait_for_status(wf, RunStatus.COMPLETED, worker)
        assert_chained(wf, ["r1", "r2"] if version == 1 else ["r1", "r2", "r3"])
    done = executions(state["log"])
    assert len(done) == 4 * 2 + 4 * 3  # every step once
    for execution_ in done:
        version = runs[execution_["cid"]]
        assert (execution_["version"], execution_["tag"]) == (
            version,
            "old" if version == 1 else "new",
        ), execution_
    assert WorkflowRun.objects.using(DB).filter(pk__in=runs, workflow_version=2).count() == 4
    # The steps that reached the wrong worker first (about half of the 20) were sent on.
    handed_back = sum(w.log().count("does not define version") for w in (old, new))
    assert handed_back > 0, (old.log_tail(), new.log_tail())


@on_servers
def test_a_deploy_without_a_step_waits_for_the_upgrade_that_continues_it_once(
    versions, provider, start_worker, tmp_path
):
    """Version 1 ([a, b, c], a pauses) is replaced by version 2 ([b2, c]): the paused
    run is not run again from its first step; the upgrade continues it on a worker
    of version 2, each step once."""
    from flowwarden_django.workflows import VersionNotDefinedError
    from flowwarden_django.workflows.operations.upgrades import upgrade_runs

    first = versions(1)
    old = versioned_worker(start_worker, "1", "old")
    state = new_state(tmp_path)
    with execution(provider):
        cid = first[(flows.UPGRADED, 1)].start(state).coordination_id
    wf = first[(flows.UPGRADED, 1)].workflow(cid)
    wait_for_status(wf, RunStatus.HIBERNATED, old)
    old.terminate()

    # The deploy: this process and the worker define version 2 only.
    workflow_registry.unregister(flows.UPGRADED)
    second = versions(2)
    new = versioned_worker(start_worker, "2", "new")
    new.wait_ready()
    with execution(provider), pytest.raises(VersionNotDefinedError):
        Workflow.for_coordination(cid, using=DB).resume()
    record = WorkflowRun.objects.using(DB).get(pk=cid)
    assert (record.status, record.workflow_version) == (RunStatus.NEEDS_UPGRADE, 1)

    Workflow.define_upgrade(flows.UPGRADED, from_version=1, to_version=2, steps={"a": None})
    with execution(provider):
        (outcome,) = upgrade_runs(flows.UPGRADED, using=DB, by="test")
    assert outcome.upgraded and outcome.continued
    upgraded = second[(flows.UPGRADED, 2)].workflow(cid)
    wait_for_status(upgraded, RunStatus.COMPLETED, new)
    steps = [(e["step"], e["tag"]) for e in executions(state["log"])]
    assert steps == [("a", "old"), ("b2", "new"), ("c", "new")]
    history = upgraded.history()
    assert [s.metadata["workflow.lastStep"] for s in history] == ["", "a", "", "b2", "c"]


# -- without a worker --------------------------------------------------------------------- #


@step("a")
def step_a(state: str) -> Any:
    return advance(state + ":a")


@step("b")
def step_b(state: str) -> Any:
    return hibernate(state + ":b")


@step("c")
def step_c(state: str, ctx: Any) -> Any:
    return advance(f"{state}:c={ctx.input}")


@contextlib.contextmanager
def current_app(app: Celery) -> Iterator[None]:
    previous = celery_state.get_current_app()
    app.set_current()
    try:
        yield
    finally:
        previous.set_current()


@pytest.fixture
def local_workflow() -> Iterator[Any]:
    """A registered three-step workflow (a, b hibernates, c) on an in-memory store."""
    definition = Workflow.define("fw-local", [step_a, step_b, step_c], InMemorySnapshotStore())
    yield definition
    workflow_registry.unregister("fw-local")


@pytest.mark.django_db(transaction=True)
def test_an_unreachable_broker_falls_back_to_in_process_and_logs_it(local_workflow, caplog):
    app = Celery("fw-wf-down", broker="redis://127.0.0.1:1/0", fixups=[], set_as_current=False)
    probes: list[Any] = []
    connection_for_write = app.connection_for_write

    def probe(*args: Any, **kwargs: Any) -> Any:
        probes.append(kwargs)
        return connection_for_write(*args, **kwargs)

    app.connection_for_write = probe  # type: ignore[method-assign]
    with (
        current_app(app),
        execution("celery"),
        caplog.at_level(logging.DEBUG, "flowwarden_django"),
    ):
        provider = configured_provider()
        assert isinstance(provider, CeleryExecutionProvider)
        assert provider.app is app
        first, second = (local_workflow.workflow(uuid.uuid4().hex) for _ in range(2))
        assert first.run("s") == Hibernated("s:a:b", first.coordination_id, "b")
        assert first.resume(input=1) == Completed("s:a:b:c=1", first.coordination_id)
        assert second.run("t") == Hibernated("t:a:b", second.coordination_id, "b")
    app.close()

    assert len(probes) == 1  # the failed check is remembered
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(
        "workflow execution provider 'celery' failed its health check "
        "(BrokerUnavailableError('broker redis://"
    )
    assert "127.0.0.1:1/0 is unreachable: " in warnings[0]
    assert warnings[0].endswith("; running workflows in-process instead")


@pytest.mark.django_db(transaction=True)
def test_a_stale_or_stray_step_task_changes_nothing(local_workflow):
    """The guard runs under the task's claim: a task for an old head, or a chained or
    recovery task on a paused run, is dropped without running a step or leaving its
    input on the run; only the ``run`` task for the current head continues it."""
    cid = uuid.uuid4().hex
    wf = local_workflow.workflow(cid)
    assert wf.run_local("s") == Hibernated("s:a:b", cid, "b")
    head = wf.run_record().head_snapshot_id
    old_head = wf.history()[1].id

    def apply(**kwargs: Any) -> dict[str, Any]:
        kwargs = {"coordination_id": cid, "workflow": "fw-local", **kwargs}
        return fw_tasks.run_workflow_step.apply(kwargs=kwargs).get()

    for origin in (Origin.NEXT, Origin.RECOVER):
        outcome = apply(head=head, origin=origin, input="no")
        assert outcome["status"] == "dropped"
        assert "the run is hibernated" in outcome["reason"]
    outcome = apply(head=old_head, origin=Origin.RUN, input="no")
    assert outcome["status"] == "dropped"
    assert f"moved on from snapshot {old_head}" in outcome["reason"]
    assert apply(coordination_id="no-such-run", head=head)["status"] == "dropped"

    record = wf.run_record()
    assert (record.status, record.head_snapshot_id, record.resume_input, record.runner) == (
        RunStatus.HIBERNATED,
        head,
        None,
        "",
    )
    assert len(wf.history()) == 3

    # The last step completes the run: nothing is queued after it.
    assert apply(head=head, origin=Origin.RUN, input="yes")["status"] == RunStatus.COMPLETED
    assert wf.current_result() == Completed("s:a:b:c=yes", cid)


@pytest.mark.django_db(transaction=True)
def test_the_sweep_recovers_running_runs_without_a_live_claim_once(local_workflow):
    def seeded(status: str, runner: str = "", claimed_for: timedelta | None = None) -> str:
        cid = f"{status}-{runner or 'free'}-{uuid.uuid4().hex[:6]}"
        local_workflow.workflow(cid).seed("s")
        WorkflowRun.objects.filter(pk=cid).update(
            status=status,
            runner=runner,
            claimed_until=None if claimed_for is None else timezone.now() + claimed_for,
            updated_at=timezone.now() - timedelta(minutes=5),
        )
        return cid

    unclaimed = seeded(RunStatus.RUNNING)
    expired = seeded(RunStatus.RUNNING, "dead-worker", timedelta(seconds=-1))
    seeded(RunStatus.RUNNING, "live-worker", timedelta(minutes=1))
    for status in (RunStatus.HIBERNATED, RunStatus.WAITING, RunStatus.COMPLETED):
        seeded(status)
    seeded(RunStatus.FAILED, "dead-worker", timedelta(seconds=-1))
    WorkflowRun.objects.create(
        coordination_id="unknown-workflow",
        workflow_name="not-defined-here",
        status=RunStatus.RUNNING,
        created_at=timezone.now(),
        updated_at=timezone.now() - timedelta(minutes=5),
    )

    queued: list[WorkflowRun] = []
    age = timedelta(minutes=1)
    assert recover_stalled_runs(queued.append, older_than=age) == [unclaimed, expired]
    assert [r.coordination_id for r in queued] == [unclaimed, expired]
    # Idempotent: the runs it queued are not stalled again until another minute passes.
    assert recover_stalled_runs(queued.append, older_than=age) == []
    assert len(queued) == 2


@pytest.mark.django_db(transaction=True)
def test_a_failed_publish_is_reported_and_the_next_runs_go_in_process(local_workflow, caplog):
    """A broker error never reaches the caller of ``run()``: the run is seeded and
    ``running`` (the recovery sweep queues its step), the failure is logged once per
    outage, and the provider reports itself unavailable for ``failure_ttl``."""
    from flowwarden_django.integrations.celery.provider import publish_failures

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ConnectionRefusedError("the broker went away")

    app = Celery("fw-wf-publish", broker="memory://", fixups=[], set_as_current=False)
    app.send_task = refuse  # type: ignore[method-assign]
    provider = CeleryExecutionProvider(app=app)
    assert provider.is_available()
    wf = local_workflow.workflow(uuid.uuid4().hex)
    publish_failures.succeeded()  # a clean slate
    with caplog.at_level(logging.ERROR, "flowwarden_django"):
        assert provider.run(wf, "s") == Running("s", wf.coordination_id, "")
    assert (wf.status(), len(wf.history())) == (RunStatus.RUNNING, 1)
    assert "queueing a step" in caplog.text and "failed: ConnectionRefusedError" in caplog.text
    with pytest.raises(BrokerUnavailableError, match="publishing a workflow step failed"):
        provider.is_available()

    other = local_workflow.workflow(uuid.uuid4().hex)
    caplog.clear()
    with caplog.at_level(logging.ERROR, "flowwarden_django"), transaction.atomic():
        assert provider.run(other, "t") == Running("t", other.coordination_id, "")
        assert caplog.records == []
    # The same outage: no second traceback.
    assert caplog.records == [] and other.status() == RunStatus.RUNNING
    publish_failures.succeeded()
    app.close()


class Retry(Exception):
    """What the fake task's ``retry`` raises."""


@pytest.mark.django_db(transaction=True)
def test_a_task_meeting_a_live_claim_retries_when_it_ends(local_workflow):
    """A requeued task whose run is still claimed (by a pool child that was killed,
    say) retries once the claim's lease is over, at most ``CONFLICT_RETRIES`` times;
    a task that lost its own claim, or a snapshot race, is dropped instead."""
    cid = uuid.uuid4().hex
    wf = local_workflow.workflow(cid)
    wf.seed("s")
    head = wf.run_record().head_snapshot_id
    RunRecords().claim(cid, "dead-child", timedelta(seconds=60))
    countdowns: list[float] = []

    def retry(countdown: float) -> None:
        countdowns.append(countdown)
        raise Retry

    def task(retries: int) -> Any:
        return SimpleNamespace(request=SimpleNamespace(retries=retries), retry=retry, app=None)

    with pytest.raises(Retry):
        run_step(task(0), cid, workflow="fw-local", head=head, origin=Origin.RUN)
    assert len(countdowns) == 1
    assert 1 < countdowns[0] <= 61  # until the claim ends, plus a second
    outcome = run_step(task(CONFLICT_RETRIES), cid, workflow="fw-local", head=head)
    assert outcome["status"] == "dropped"
    assert "is being run by dead-child" in outcome["reason"]
    assert len(countdowns) == 1
    assert wf.run_record().runner == "dead-child"  # nothing was taken over
    assert len(wf.history()) == 1


def test_a_step_with_a_timeout_gets_a_hard_time_limit(local_workflow):
    timed = step("timed", timeout=10, max_retries=2, retry_delay=0.5)(step_a.fn)
    assert step_time_limit(step_a) is None
    assert step_time_limit(timed) == 31 + TIME_LIMIT_MARGIN
    assert step_time_limit(None) is None

    sent: list[tuple[str, dict[str, Any]]] = []
    app = Celery("fw-wf-memory", broker="memory://", fixups=[], set_as_current=False)
    app.send_task = lambda name, **options: sent.append((name, options))  # type: ignore[method-assign]
    definition = Workflow.define("fw-timed", [step_a, timed], register=False)
    send_step(app, definition, "cid", head="h1", last_step="a", origin=Origin.NEXT)
    send_step(app, definition, "cid", head="h0", last_step="", origin=Origin.RUN, input=7)
    # After a jump, the limit is the jump target's: "timed" jumps back to itself.
    send_step(app, definition, "cid", head="h2", last_step="timed", origin=Origin.NEXT)
    jumped = {"last_step": "timed", "next_step": "timed"}
    send_step(app, definition, "cid", head="h2", origin=Origin.NEXT, **jumped)
    assert [options.get("time_limit") for _, options in sent[2:]] == [
        None,
        31 + TIME_LIMIT_MARGIN,
    ]
    del sent[2:]
    # Every publication retries a broker that does not answer (kombu's retry policy).
    assert all(o.pop("retry") is True and o.pop("retry_policy") for _, o in sent)
    # Logs and task events show where the step is, not its input.
    reprs = [o.pop("kwargsrepr") for _, o in sent]
    shown = {"coordination_id": "cid", "workflow": "fw-timed", "version": 1, "head": "h0"}
    assert reprs[1] == repr({**shown, "origin": "run"})  # no "input": 7
    assert sent == [
        (
            STEP_TASK,
            {
                "kwargs": {
                    "coordination_id": "cid",
                    "workflow": "fw-timed",
                    "version": 1,
                    "head": "h1",
                    "origin": "next",
                    "input": None,
                },
                "time_limit": 31 + TIME_LIMIT_MARGIN,
            },
        ),
        (
            STEP_TASK,
            {
                "kwargs": {
                    "coordination_id": "cid",
                    "workflow": "fw-timed",
                    "version": 1,
                    "head": "h0",
                    "origin": "run",
                    "input": 7,
                },
            },
        ),
    ]


@pytest.mark.parametrize(
    ("setting", "sweeps"),
    [
        ({"WORKFLOW_EXECUTION": "celery"}, True),
        (
            {"WORKFLOW_EXECUTION": f"{CeleryExecutionProvider.__module__}.CeleryExecutionProvider"},
            True,
        ),
        ({"WORKFLOW_EXECUTION": "celery", "CELERY_RUN_WORKFLOW_SWEEP": False}, False),
        ({}, False),
    ],
    ids=["celery", "dotted-path", "turned-off", "in-process"],
)
def test_the_workers_of_a_celery_project_run_the_recovery_sweep(setting, sweeps):
    from flowwarden_django.integrations.celery import WorkflowSweepBootstep, install_from_settings

    app = Celery("fw-wf-sweep", broker="memory://", fixups=[], set_as_current=False)
    with override_settings(FLOWWARDEN=setting):
        install_from_settings(SimpleNamespace(app=app))
    assert (WorkflowSweepBootstep in app.steps["worker"]) is sweeps


def test_a_step_of_a_version_this_worker_lacks_goes_to_that_version_s_queue():
    """The queue is named after the queue the task came from (found by its routing
    key), and every worker consumes, beside each of its queues, those of its versions."""
    from kombu import Queue

    from flowwarden_django.integrations.celery import bootstep
    from flowwarden_django.integrations.celery import provider as provider_module
    from flowwarden_django.workflows import VersionNotDefinedError

    app = Celery("fw-handback", broker="memory://", fixups=[], set_as_current=False)
    app.conf.task_queues = [Queue("steps", routing_key="flow.steps")]
    sent: list[tuple[str, dict[str, Any]]] = []
    app.send_task = lambda name, **options: sent.append((name, options))  # type: ignore[method-assign]
    request = SimpleNamespace(delivery_info={"routing_key": "flow.steps"}, timelimit=(90, None))
    task = SimpleNamespace(app=app, request=request)
    fields = {"coordination_id": "cid", "workflow": "wf", "version": 3, "handbacks": 0}
    outcome = provider_module._hand_back(
        task, "cid", VersionNotDefinedError("wf", 3, [1, 2]), fields
    )
    assert outcome["status"] == "handed back" and outcome["queue"] == "steps.wf.v3"
    ((name, options),) = sent
    assert (name, options["queue"], options["time_limit"]) == (STEP_TASK, "steps.wf.v3", 90)
    assert options["kwargs"] == {**fields, "handbacks": 1}

    Workflow.define("wf", [step_a], InMemorySnapshotStore(), version=3)
    try:
        bootstep.consume_version_queues(instance=SimpleNamespace(app=app))
    finally:
        workflow_registry.unregister("wf")
    assert "steps.wf.v3" in app.amqp.queues
    app.close()


def test_a_step_task_runs_from_its_hand_off_only_on_its_first_delivery():
    """The hand-off travels in a message header (a worker of an earlier release
    ignores it); a redelivery or a retry keeps only its token, so it claims the run
    and checks the head as any copy does."""
    from flowwarden_django.integrations.celery.provider import HANDOFF_HEADER, _handed
    from flowwarden_django.workflows.execution.handoff import Handoff

    carried = {"id": "h1", "seq": 2, "state": "[]", "metadata": "{}"}
    handoff = Handoff("cid", "handoff:abc", 1, time.time(), head=carried)

    def task(retries: int = 0, redelivered: bool = False, **headers: Any) -> Any:
        delivery = {"redelivered": redelivered}
        return SimpleNamespace(
            request=SimpleNamespace(retries=retries, delivery_info=delivery, **headers)
        )

    header = {HANDOFF_HEADER: handoff.as_dict()}
    assert _handed(task(**header), "cid", "h1") == (handoff, False)
    for copy in (task(redelivered=True, **header), task(retries=1, **header)):
        handed, again = _handed(copy, "cid", "h1")
        assert again and handed == handoff.without_head()
    assert _handed(task(**header), "cid", "another-head")[0] == handoff.without_head()
    assert _handed(task(**header), "another-run", "h1") == (None, False)
    assert _handed(task(), "cid", "h1") == (None, False)
