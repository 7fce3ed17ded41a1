"""Workflow runs across server restarts, healed without a human (issue 17).

Each scenario restarts a private server (``tests/chaos/servers.py``) while runs are
in flight, lets a beat-like sweep thread recover what stalled, and checks from the
data that every run completed, each step once (the snapshot chain: the seed, then one
snapshot per step, each the child of the one before), within one sweep interval +
10 s of the server's return. It prints one ``chaos [...]`` line per scenario.

1. In-process runs, PostgreSQL restarted (``immediate``: a crash). Clients start the
   runs from a few threads and retry a start that raised with the same idempotency
   key (as a client retries a request); a start that raises must raise the original
   database error, never one from releasing the claim. The sweep is
   ``manage.py flowwarden_workflows recover`` (which continues stalled runs inline),
   called every :data:`SWEEP` seconds with the default ``WORKFLOW_RECOVER_AFTER``.
2. Celery runs, the broker (a Redis without persistence) restarted: two solo worker
   subprocesses (``tests.chaos.celery_chaos_settings``) on the private broker and the
   private PostgreSQL; the sweep is ``recover_workflows(app)`` every :data:`SWEEP`
   seconds. Some runs are started during the outage: no start may raise (the first
   one's publish fails after kombu's retries, the next ones run in the caller).
3. The same with RabbitMQ as the broker (durable queues: its messages survive) and
   one prefork worker (concurrency 2).

Then three quick deterministic tests of what the scenarios rely on: a sweep that
cannot queue a run gives it back, a claim whose row was not read back is let go, a
stale step task does not touch the run.

``log_lines_during_outage`` counts the ``flowwarden_django`` log records written
between the server's stop and its return: this process's (a handler on the logger)
and, for Celery, the worker's (its log lines name their logger).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connections,
)
from django.test import override_settings
from django.utils import timezone

from flowwarden_django.models import WorkflowRun
from flowwarden_django.workflows import RunStatus, workflow_registry
from flowwarden_django.workflows.definition.metadata import LAST_STEP
from flowwarden_django.workflows.execution.providers import reset_providers
from flowwarden_django.workflows.execution.releases import pending_releases
from flowwarden_django.workflows.operations.recovery import recover_stalled_runs
from flowwarden_django.workflows.runs.records import RunRecords, recover_after
from tests.chaos import workflow_app
from tests.chaos.report import report
from tests.chaos.servers import PrivatePostgres, PrivateServer
from tests.support.celery_procs import CeleryWorker
from tests.support.step_log import executions as step_executions

pytestmark = pytest.mark.chaos

ROOT = Path(__file__).resolve().parents[2]
#: The beat interval of the simulated sweep (seconds).
SWEEP = 5.0
#: The bound on the seconds from the server's return to every run completed.
BOUND = SWEEP + 10.0
#: How long a scenario waits for the runs at most (a hang fails instead of blocking CI).
WAIT = 45.0
#: At most this many ``flowwarden_django`` log records during an outage (a few per
#: interrupted runner or failing loop; far fewer than the steps).
MAX_OUTAGE_LOG_LINES = 30


# -- helpers ------------------------------------------------------------------------------


class _Stamped(logging.Handler):
    """Keeps the ``time.monotonic()`` stamp of every record it sees."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.stamps: list[tuple[float, logging.LogRecord]] = []
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._guard:
            self.stamps.append((time.monotonic(), record))

    def between(self, start: float, end: float) -> list[logging.LogRecord]:
        with self._guard:
            return [record for stamp, record in self.stamps if start <= stamp <= end]


@contextlib.contextmanager
def flowwarden_log() -> Iterator[_Stamped]:
    """A handler on the ``flowwarden_django`` logger, at INFO for the block."""
    logger = logging.getLogger("flowwarden_django")
    handler = _Stamped()
    level = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


class Sweeper(threading.Thread):
    """Calls *sweep* every *interval* seconds (the first call after one interval),
    like beat; an error is kept and the next tick tries again."""

    def __init__(self, sweep: Callable[[], Any], interval: float = SWEEP) -> None:
        super().__init__(name="chaos-sweeper", daemon=True)
        self.sweep, self.interval = sweep, interval
        self.stopping = threading.Event()
        self.ticks = 0
        self.errors: list[BaseException] = []
        self.recovered: list[str] = []

    def run(self) -> None:
        try:
            while not self.stopping.wait(self.interval):
                self.ticks += 1
                try:
                    self.recovered += self.sweep() or []
                except Exception as exc:  # the database or the broker is down: next tick
                    self.errors.append(exc)
                finally:
                    close_old_connections()
        finally:
            connections.close_all()

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)
        assert not self.is_alive(), "the sweep thread did not stop"


def wait_completed(alias: str, keys: list[str], timeout: float) -> tuple[int, float]:
    """Poll until every run of *keys* is completed (or *timeout*): how many are, and
    when (``time.monotonic()``) the last one was seen completed."""
    deadline = time.monotonic() + timeout
    completed = 0
    while True:
        try:
            completed = (
                WorkflowRun.objects.using(alias)
                .filter(idempotency_key__in=keys, status=RunStatus.COMPLETED)
                .count()
            )
        except DatabaseError:
            close_old_connections()
        now = time.monotonic()
        if completed == len(keys) or now > deadline:
            return completed, now
        time.sleep(0.05)


def chain_faults(alias: str, definition: Any, keys: list[str]) -> dict[str, Any]:
    """The runs of *keys* whose snapshots are not exactly the seed and one snapshot per
    step of *definition*, chained; and the number of duplicated step snapshots."""
    steps = [s.name for s in definition.steps]
    runs = WorkflowRun.objects.using(alias).filter(idempotency_key__in=keys)
    faults: dict[str, Any] = {}
    duplicates = 0
    for run in runs:
        history = definition.workflow(run.coordination_id).history()
        names = [s.metadata.get(LAST_STEP) for s in history]
        duplicates += len(names) - len(set(names))
        chained = (
            [s.seq for s in history] == list(range(1, len(steps) + 2))
            and names == ["", *steps]
            and history[0].parent_id is None
            and [s.parent_id for s in history[1:]] == [s.id for s in history[:-1]]
        )
        if not chained or run.runner or run.last_step != steps[-1]:
            faults[run.coordination_id] = {
                "steps": names,
                "seqs": [s.seq for s in history],
                "status": run.status,
                "runner": run.runner,
                "last_step": run.last_step,
            }
    return {"faults": faults, "duplicates": duplicates, "runs": runs.count()}


def unfinished(alias: str, keys: list[str], errors: dict[str, list[BaseException]]) -> str:
    """The runs of *keys* not completed, and where their callers' first errors came
    from (for a failure's message)."""
    lines = []
    runs = WorkflowRun.objects.using(alias).filter(idempotency_key__in=keys)
    for run in runs.exclude(status=RunStatus.COMPLETED):
        first = (errors.get(run.idempotency_key) or [None])[0]
        where = (
            ""
            if first is None
            else " <- ".join(
                f"{f.name}:{f.lineno}"
                for f in reversed(traceback.extract_tb(first.__traceback__))
                if "flowwarden_django" in f.filename
            )
        )
        lines.append(
            f"{run.coordination_id} {run.status} runner={run.runner!r} "
            f"claimed_until={run.claimed_until} updated_at={run.updated_at} "
            f"last_step={run.last_step!r} first error {first!r} at {where}"
        )
    return "\n".join(lines)


def note(line: str) -> None:
    report(line)


# -- 1. in-process runs, PostgreSQL restarted ---------------------------------------------

INPROCESS_RUNS = 50
INPROCESS_THREADS = 10
PG_RESTART_AFTER = 1.0
PG_DOWN = 6.0


def test_inprocess_runs_heal_after_a_postgres_restart(
    private_postgres: PrivatePostgres, private_postgres_alias: str, tmp_path: Path
) -> None:
    pg, alias = private_postgres, private_postgres_alias
    definitions = workflow_app.define_workflows(alias)
    definition = definitions[workflow_app.INPROCESS]
    state = {"log": str(tmp_path / "steps.log"), "sleep": 0.02, "trail": []}
    tag = uuid.uuid4().hex[:8]
    keys = [f"chaos-ip-{tag}-{n}" for n in range(INPROCESS_RUNS)]
    caller_errors: list[BaseException] = []
    errors_by_key: dict[str, list[BaseException]] = {}
    other_errors: list[BaseException] = []
    errors_lock = threading.Lock()

    def client(my_keys: list[str]) -> None:
        """Starts its runs one after the other; a start that raised is retried with
        the same key (its run may exist: then the retry returns it)."""
        try:
            for key in my_keys:
                deadline = time.monotonic() + WAIT
                while True:
                    try:
                        definition.start(dict(state), idempotency_key=key)
                        break
                    except Exception as exc:
                        with errors_lock:
                            caller_errors.append(exc)
                            errors_by_key.setdefault(key, []).append(exc)
                        close_old_connections()  # what Django does after each request
                        if time.monotonic() > deadline:
                            with errors_lock:
                                other_errors.append(TimeoutError(f"{key} never started"))
                            break
                        time.sleep(0.2)
        except BaseException as exc:
            other_errors.append(exc)
        finally:
            connections.close_all()

    sweep_output = io.StringIO()

    def sweep() -> list[str]:
        call_command("flowwarden_workflows", "recover", "--database", alias, stdout=sweep_output)
        return []

    clients = [
        threading.Thread(target=client, args=(keys[n::INPROCESS_THREADS],), daemon=True)
        for n in range(INPROCESS_THREADS)
    ]
    sweeper = Sweeper(sweep)
    began = time.monotonic()
    try:
        with (
            override_settings(
                FLOWWARDEN={**settings.FLOWWARDEN, "WORKFLOW_EXECUTION": "inprocess"}
            ),
            flowwarden_log() as logged,
        ):
            assert recover_after().total_seconds() == 10.0  # the default
            sweeper.start()
            for thread in clients:
                thread.start()
            pg.restart_in_background(after=PG_RESTART_AFTER, down=PG_DOWN, mode="immediate")
            pg.join_background(timeout=60)
            went_down, came_back = pg.outages[-1]
            completed, done_at = wait_completed(alias, keys, came_back - time.monotonic() + WAIT)
            for thread in clients:
                thread.join(30)
            outage_logs = logged.between(went_down, came_back)
    finally:
        sweeper.stop()
        for name in definitions:
            workflow_registry.unregister(name)
    recovery = done_at - came_back
    chains = chain_faults(alias, definition, keys)
    continued = sweep_output.getvalue().count("Continuing ")
    kinds = Counter(type(exc).__name__ for exc in caller_errors)
    messages = Counter(str(exc).strip().splitlines()[0][:70] for exc in caller_errors)
    note(
        f"chaos [workflows, in-process x{INPROCESS_RUNS}, postgres down "
        f"{came_back - went_down:.1f}s]: runs={chains['runs']} completed={completed} "
        f"lost={INPROCESS_RUNS - completed} duplicate_steps={chains['duplicates']} "
        f"recovery_s={recovery:.1f} (sweep every {SWEEP:g}s, recover after "
        f"{recover_after().total_seconds():g}s) log_lines_during_outage={len(outage_logs)}"
        f" | caller errors {dict(kinds)}, continued by the sweep {continued}, "
        f"total {time.monotonic() - began:.1f}s; messages {dict(messages.most_common(4))}; "
        f"outage log {dict(Counter(str(r.msg)[:60] for r in outage_logs))}"
    )

    assert not other_errors, other_errors
    assert completed == INPROCESS_RUNS, (
        f"{INPROCESS_RUNS - completed} runs not completed {WAIT:.0f} s after PostgreSQL's "
        f"return; sweeps: {sweeper.ticks}, errors {sweeper.errors[-3:]}\n"
        f"{unfinished(alias, keys, errors_by_key)}\n{sweep_output.getvalue()[-3000:]}"
    )
    assert chains["runs"] == INPROCESS_RUNS
    assert chains["duplicates"] == 0 and not chains["faults"], chains["faults"]
    assert recovery <= BOUND, f"the runs completed {recovery:.1f} s after PostgreSQL's return"
    # The outage reached runners mid-run: they got the database's own error...
    assert caller_errors, "no start met the outage"
    for exc in caller_errors:
        assert isinstance(exc, OperationalError | InterfaceError), repr(exc)
        frames = [f.name for f in traceback.extract_tb(exc.__traceback__)]
        assert not {"release", "release_or_defer"} & set(frames), (
            f"the caller got an error from releasing the claim: {exc!r} via {frames}"
        )
    # ... the sweep, not a human, continued the runs they left, and every claim is let go.
    assert continued >= 1, sweep_output.getvalue()
    assert len(pending_releases) == 0
    assert len(outage_logs) <= MAX_OUTAGE_LOG_LINES, [r.getMessage() for r in outage_logs]


# -- 2./3. Celery runs, the broker restarted ----------------------------------------------

CELERY_RUNS = 20
#: Runs started before the outage; the others are started while the broker is down.
CELERY_RUNS_BEFORE = 14
BROKER_RESTART_AFTER = 1.5
WORKER_LOG_LINE = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) (flowwarden_django[\w.]*) "
)


@contextlib.contextmanager
def current_celery_app(app: Any) -> Iterator[None]:
    """*app* as this thread's current Celery app (``celery.current_app`` is per thread)."""
    from celery import _state

    previous = _state.get_current_app()
    app.set_current()
    try:
        yield
    finally:
        previous.set_current()


def run_celery_scenario(
    broker: PrivateServer,
    broker_url: str,
    broker_name: str,
    alias: str,
    tmp_path: Path,
    *,
    down: float,
    mode: str,
    pool: list[str],
    workers: int,
) -> None:
    from celery import Celery

    from flowwarden_django.integrations.celery.provider import recover_workflows

    queue = f"fw-chaos-{uuid.uuid4().hex[:10]}"
    db = connections[alias].settings_dict
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FLOWWARDEN_CELERY")},
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.chaos.celery_chaos_settings",
        "FW_CHAOS_DB_NAME": str(db["NAME"]),
        "FW_CHAOS_DB_PORT": str(db["PORT"]),
        "FW_CHAOS_BROKER_URL": broker_url,
        "FW_CHAOS_QUEUE": queue,
    }
    env.pop("FLOWWARDEN_TEST_CELERY_INSTALL", None)
    producer = Celery("fw-chaos-producer", broker=broker_url, fixups=[], set_as_current=False)
    producer.conf.task_default_queue = queue
    producer.conf.broker_connection_retry_on_startup = True
    definitions = workflow_app.define_workflows(alias)
    state = {"log": str(tmp_path / "steps.log"), "sleep": 0.02, "trail": []}
    tag = uuid.uuid4().hex[:8]
    keys = [f"chaos-cl-{tag}-{n}" for n in range(CELERY_RUNS)]
    start_errors: list[BaseException] = []
    start_seconds: list[float] = []
    outage_started = threading.Event()

    def starter() -> None:
        try:
            with current_celery_app(producer):
                for n, key in enumerate(keys):
                    if n == CELERY_RUNS_BEFORE:
                        outage_started.wait(30)
                        time.sleep(0.3)
                    began = time.monotonic()
                    try:
                        definitions[workflow_app.CELERY].start(dict(state), idempotency_key=key)
                    except Exception as exc:
                        start_errors.append(exc)
                    start_seconds.append(time.monotonic() - began)
                    if n >= CELERY_RUNS_BEFORE:
                        time.sleep(0.4)
        finally:
            connections.close_all()

    def sweep() -> list[str]:
        return recover_workflows(producer, using=alias)

    started = [
        CeleryWorker(env, pool, tmp_path / f"worker-{n}.log", name="fw-chaos")
        for n in range(workers)
    ]
    sweeper = Sweeper(sweep)
    starting = threading.Thread(target=starter, name="chaos-starter", daemon=True)
    began = time.monotonic()
    reset_providers()
    try:
        for worker in started:
            worker.wait_ready()
        with (
            override_settings(FLOWWARDEN={**settings.FLOWWARDEN, "WORKFLOW_EXECUTION": "celery"}),
            flowwarden_log() as logged,
        ):
            sweeper.start()
            starting.start()
            broker.restart_in_background(after=BROKER_RESTART_AFTER, down=down, mode=mode)
            while not broker.outages and broker.is_running() and starting.is_alive():
                time.sleep(0.01)
            outage_started.set()
            broker.join_background(timeout=90)
            went_down, came_back = broker.outages[-1]
            completed, done_at = wait_completed(alias, keys, came_back - time.monotonic() + WAIT)
            starting.join(30)
            outage_logs = [r.getMessage() for r in logged.between(went_down, came_back)]
        for worker in started:
            outage_logs += worker.lines_between(went_down, came_back, WORKER_LOG_LINE)
    finally:
        sweeper.stop()
        for worker in started:
            worker.kill()
        producer.close()
        reset_providers()
        for name in definitions:
            workflow_registry.unregister(name)
    recovery = done_at - came_back
    chains = chain_faults(alias, definitions[workflow_app.CELERY], keys)
    executions = step_executions(state["log"])
    counts = Counter((e["cid"], e["step"]) for e in executions)
    reexecuted = sum(n - 1 for n in counts.values())
    in_process = sum(1 for e in executions if e["pid"] == os.getpid())
    dropped = sum(worker.log().count("step task dropped") for worker in started)
    note(
        f"chaos [workflows, celery x{CELERY_RUNS}, {broker_name} down "
        f"{came_back - went_down:.1f}s]: runs={chains['runs']} completed={completed} "
        f"lost={CELERY_RUNS - completed} duplicate_steps={chains['duplicates']} "
        f"recovery_s={recovery:.1f} (sweep every {SWEEP:g}s, recover after "
        f"{recover_after().total_seconds():g}s) log_lines_during_outage={len(outage_logs)}"
        f" | re-executed steps {reexecuted}, steps run in the caller {in_process}, "
        f"queued by the sweep {len(sweeper.recovered)}, duplicate tasks dropped {dropped}, "
        f"slowest start "
        f"{max(start_seconds, default=0):.1f}s, total {time.monotonic() - began:.1f}s"
    )

    assert not start_errors, f"a start raised to its caller: {start_errors!r}"
    assert len(start_seconds) == CELERY_RUNS
    assert completed == CELERY_RUNS, (
        f"{CELERY_RUNS - completed} runs not completed {WAIT:.0f} s after the broker's "
        f"return; sweep errors {sweeper.errors[-3:]}\n{started[0].log_tail()}"
    )
    assert chains["runs"] == CELERY_RUNS
    assert chains["duplicates"] == 0 and not chains["faults"], chains["faults"]
    assert recovery <= BOUND, (
        f"the runs completed {recovery:.1f} s after the broker's return\n{started[0].log_tail()}"
    )
    assert len(outage_logs) <= MAX_OUTAGE_LOG_LINES, outage_logs


def test_celery_runs_heal_after_a_redis_broker_restart(
    private_redis, private_postgres: PrivatePostgres, private_postgres_alias: str, tmp_path: Path
) -> None:
    run_celery_scenario(
        private_redis,
        private_redis.url,
        "redis broker",
        private_postgres_alias,
        tmp_path,
        down=7.0,
        mode="term",
        # Solo: a prefork worker (Celery 5.7, kombu 5.7, redis-py 8.1) whose acks fail
        # as Redis goes away never notices the lost connection and stops consuming.
        pool=["--pool=solo"],
        workers=2,
    )


def test_celery_runs_heal_after_a_rabbitmq_broker_restart(
    private_rabbitmq, private_postgres: PrivatePostgres, private_postgres_alias: str, tmp_path: Path
) -> None:
    run_celery_scenario(
        private_rabbitmq,
        private_rabbitmq.url,
        "rabbitmq broker",
        private_postgres_alias,
        tmp_path,
        down=5.0,
        mode="term",
        pool=["--pool=prefork", "--concurrency=2"],
        workers=1,
    )


# -- what the scenarios rely on, deterministically ----------------------------------------


@pytest.fixture
def chaos_workflows(private_postgres_alias: str) -> Iterator[dict[str, Any]]:
    definitions = workflow_app.define_workflows(private_postgres_alias)
    yield definitions
    for name in definitions:
        workflow_registry.unregister(name)


def _stalled_run(alias: str, name: str) -> tuple[str, datetime]:
    """A running, unclaimed run of *name* unchanged for a day (older than any other)."""
    cid = f"chaos-unit-{uuid.uuid4().hex[:12]}"
    RunRecords(alias).create(cid, name)
    long_ago = timezone.now() - timedelta(days=1)
    WorkflowRun.objects.using(alias).filter(pk=cid).update(updated_at=long_ago)
    return cid, long_ago


def test_a_sweep_that_cannot_queue_a_run_gives_it_back(private_postgres_alias, chaos_workflows):
    alias = private_postgres_alias
    cid, long_ago = _stalled_run(alias, workflow_app.CELERY)

    def broker_down(run: WorkflowRun) -> None:
        raise ConnectionError("the broker is down")

    with pytest.raises(ConnectionError):
        recover_stalled_runs(broker_down, using=alias, limit=1)
    # Not queued, so not taken: the next sweep takes it at once, not after another 10 s.
    assert RunRecords(alias).get(cid).updated_at == long_ago
    queued: list[WorkflowRun] = []
    assert recover_stalled_runs(queued.append, using=alias, limit=1) == [cid]
    assert [run.coordination_id for run in queued] == [cid]
    assert RunRecords(alias).get(cid).updated_at > long_ago


def test_a_claim_whose_row_is_not_read_back_is_let_go(private_postgres_alias, chaos_workflows):
    """The claim commits, its answer (the row, read back) is lost: the database went
    away in between. The claim is let go once the database answers, not after the
    10-minute lease, and the caller gets the database's error.

    On PostgreSQL the claim is one statement that returns the row, so the answer
    of that very statement is what gets lost here."""
    alias = private_postgres_alias
    cid, _ = _stalled_run(alias, workflow_app.INPROCESS)
    wf = chaos_workflows[workflow_app.INPROCESS].workflow(cid)
    before = RunRecords(alias).get(cid).updated_at
    table = WorkflowRun._meta.db_table

    def lost(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if f'INSERT INTO "{table}" AS run' in sql:  # the claim (and what goes with it)
            raise OperationalError("the connection is closed")
        return result

    with (
        connections[alias].execute_wrapper(lost),
        pytest.raises(OperationalError, match="the connection is closed"),
    ):
        wf.run_local({"log": os.devnull, "trail": []})
    deadline = time.monotonic() + 10
    while RunRecords(alias).get(cid).runner and time.monotonic() < deadline:
        time.sleep(0.05)
    record = RunRecords(alias).get(cid)
    assert (record.runner, record.claimed_until, record.status) == ("", None, RunStatus.RUNNING)
    assert record.updated_at > before  # it was claimed (that moves it), then let go


def test_a_stale_step_task_leaves_the_run_alone(private_postgres_alias, chaos_workflows):
    """A redelivered or duplicated step task of a run that moved on does not claim it,
    so the run's ``updated_at`` still shows the sweep how long it has stalled."""
    pytest.importorskip("celery")
    from flowwarden_django.integrations.celery.provider import Origin, run_step

    alias = private_postgres_alias
    cid, long_ago = _stalled_run(alias, workflow_app.CELERY)
    task = SimpleNamespace(request=SimpleNamespace(retries=0), app=None)
    outcome = run_step(
        task, cid, workflow=workflow_app.CELERY, head="an-older-head", origin=Origin.NEXT
    )
    assert outcome["status"] == "dropped"
    record = RunRecords(alias).get(cid)
    assert (record.updated_at, record.runner, record.attempts) == (long_ago, "", 0)
