"""The Celery lanes of ``bench/queues.py`` (its docstring says what is measured): a
``celery worker`` subprocess on RabbitMQ runs the steps of the unqueued and the
queued runs, and the raw chain's tasks."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from _postgres import ALIAS, checkpoint, pg_target
from workflow_providers import WorkerProcess, _wait, sigterm_as_exit, stop_all

#: The worker's execution slots (threads), as ``bench/workflow_providers.py``'s.
WORKER_CONCURRENCY = 4
CELERY_POOL = ["--pool=threads", f"--concurrency={WORKER_CONCURRENCY}"]
_env: dict[str, str] = {}


def broker_url() -> str:
    """The RabbitMQ broker of the Celery lanes."""
    return os.environ.get("FLOWWARDEN_BENCH_CELERY_BROKER", "amqp://guest:guest@127.0.0.1:5672//")


def prepare(args: argparse.Namespace) -> dict[str, Any]:
    """Check the broker, name this run's Celery queue; the ``CELERY_*`` settings of the
    benchmark process (the worker's, from ``bench.queues_settings``)."""
    from kombu import Connection

    url = broker_url()
    try:
        with Connection(url, connect_timeout=5) as connection:
            connection.ensure_connection(max_retries=1)
    except Exception as exc:
        print(f"RabbitMQ is not reachable at {url} ({exc})", file=sys.stderr)
        sys.exit(2)
    target = pg_target()
    queue = f"fw-bench-q-{uuid.uuid4().hex[:12]}"
    root = str(Path(__file__).resolve().parent.parent)
    _env.update(
        {
            "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
            "DJANGO_SETTINGS_MODULE": "bench.queues_settings",
            "FLOWWARDEN_BENCH_PG_HOST": target["host"],
            "FLOWWARDEN_BENCH_PG_PORT": target["port"],
            "FLOWWARDEN_BENCH_PG_USER": target["user"],
            "FLOWWARDEN_BENCH_PG_DB": target["dbname"],
            "FLOWWARDEN_BENCH_CELERY_BROKER": url,
            "FLOWWARDEN_BENCH_CELERY_QUEUE": queue,
            "FLOWWARDEN_BENCH_EXECUTION": "celery",
            "FLOWWARDEN_BENCH_QUEUE_CONCURRENCY": str(args.concurrency),
        }
    )
    os.environ.update(
        FLOWWARDEN_BENCH_CELERY_BROKER=url,
        FLOWWARDEN_BENCH_CELERY_QUEUE=queue,
        FLOWWARDEN_BENCH_QUEUE_CONCURRENCY=str(args.concurrency),
    )
    from bench import queues_settings

    return {
        name: getattr(queues_settings, name)
        for name in dir(queues_settings)
        if name.startswith("CELERY_")
    }


def start_worker(log_path: Path, count_file: Path) -> WorkerProcess:
    """``celery -A bench.providers_celery worker`` with ``bench.queues_settings``."""
    from bench.providers_celery import READY_LINE

    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "bench.providers_celery",
        "worker",
        *CELERY_POOL,
        "--loglevel=WARNING",
        f"--hostname=fw-bench-q-{uuid.uuid4().hex[:8]}@%h",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]
    env = {**os.environ, **_env, "FLOWWARDEN_BENCH_COUNT_FILE": str(count_file)}
    return WorkerProcess("the Celery worker", command, env, log_path, READY_LINE)


def start(lane: str, ms: int, prefix: str = "") -> str:
    """Start one run of *lane* (the worker runs its steps); its id."""
    from bench.providers_app.queued import BENCH, QUEUE, start_raw_chain
    from bench.queues import PREFIX, initial_state

    cid = f"{prefix or PREFIX}{lane}-{uuid.uuid4().hex}"
    if lane == "raw":
        start_raw_chain(cid, initial_state(ms))
    else:
        placing = {"queue": QUEUE} if lane == "queued" else {}
        BENCH.start(initial_state(ms), coordination_id=cid, **placing)
    return cid


def wait(cids: list[str], alive: list[Any]) -> None:
    """Wait until every run of *cids* is completed (raw: has its last row)."""
    from bench.providers_app.queued import STEPS
    from flowwarden_django.models import SnapshotRecord, WorkflowRun

    runs = WorkflowRun.objects.using(ALIAS)
    rows = SnapshotRecord.objects.using(ALIAS)

    def done(pending: set[str]) -> set[str]:
        raw = {cid for cid in pending if "-raw-" in cid}
        finished = set(
            rows.filter(coordination_id__in=raw, seq=STEPS + 1).values_list(
                "coordination_id", flat=True
            )
        )
        ours = pending - raw
        states = runs.filter(coordination_id__in=ours).exclude(status="running")
        for cid, status in states.values_list("coordination_id", "status"):
            if status != "completed":
                raise RuntimeError(f"run {cid} is {status}, not completed")
            finished.add(cid)
        return finished

    _wait(set(cids), done, alive)


def statements(lane: str, worker: WorkerProcess, count_file: Path) -> Counter[str]:
    """The statements of one run of *lane* (trivial steps), by kind: the start's, in
    this process, and its step tasks', counted by the worker."""
    from django.db import connections

    from bench.providers_app.queued import COUNT_PREFIX, STEPS, statement_kind

    kinds: Counter[str] = Counter()

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        kinds[statement_kind(sql, params)] += 1
        return execute(sql, params, many, context)

    with connections[ALIAS].execute_wrapper(count):
        cid = start(lane, 0, COUNT_PREFIX)
    wait([cid], [worker])
    deadline = time.monotonic() + 30
    while True:  # the last task's line is written after the run completed
        lines = [json.loads(line) for line in count_file.read_text().splitlines() if line]
        mine = [line for line in lines if line["cid"] == cid]
        if len(mine) >= STEPS or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    if len(mine) != STEPS:
        raise RuntimeError(f"the worker counted {len(mine)} step tasks of {cid}, not {STEPS}")
    for line in mine:
        kinds.update(line["kinds"])
    return kinds


def measure(lane: str, ms: int, runs: int, threads: int, worker: WorkerProcess) -> dict[str, Any]:
    """One sequential batch (*runs* runs one after the other) and one concurrent batch
    (*threads* runs started at once from as many threads): their elapsed seconds and ids."""
    cids: list[str] = []
    begun = time.perf_counter()
    for _ in range(runs):
        cid = start(lane, ms)
        wait([cid], [worker])
        cids.append(cid)
    sequential = time.perf_counter() - begun
    started: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def one() -> None:
        from django.db import connections

        try:
            barrier.wait(timeout=30)
            cid = start(lane, ms)
            with lock:
                started.append(cid)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    begun = time.perf_counter()
    workers = [threading.Thread(target=one) for _ in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    if errors:
        raise errors[0]
    wait(started, [worker])
    concurrent = time.perf_counter() - begun
    return {"sequential": sequential, "concurrent": concurrent, "cids": cids + started}


def celery_main(args: argparse.Namespace, figures: Any) -> list[str]:
    """The Celery lanes; the statement lines."""
    import celery
    from django.test.utils import override_settings
    from kombu import Connection

    from bench.providers_app import raw_chain
    from bench.providers_app.queued import STEPS
    from bench.providers_celery import app as celery_app
    from bench.queues import KINDS, LANES, check_runs, ms_of, queue_settings, rotated

    celery_app.set_default()
    settings = {
        "WORKFLOW_EXECUTION": "celery",
        "WORKFLOW_QUEUES": queue_settings(args.concurrency),
    }
    workdir = tempfile.TemporaryDirectory(prefix="fw-bench-queues-")
    count_file = Path(workdir.name) / "statements.jsonl"
    count_file.touch()
    worker = None
    lines = [
        f"celery {celery.__version__}: one worker {' '.join(CELERY_POOL)} on RabbitMQ "
        f"{broker_url().split('@')[-1]}; {args.celery_runs} sequential runs and "
        f"{args.concurrent} concurrent runs (from as many threads) per lane and round"
    ]
    print(lines[0], flush=True)
    try:
        with sigterm_as_exit(), override_settings(FLOWWARDEN=settings):
            worker = start_worker(Path(workdir.name) / "worker.log", count_file)
            pid = worker.proc.pid
            for _ in range(args.warmup):
                for kind in KINDS:
                    for lane in LANES:
                        measure(lane, ms_of(kind, args), 1, min(args.concurrent, 8), worker)
            counted = {lane: statements(lane, worker, count_file) for lane in LANES[:2]}
            lines.append("celery statements of one run (start + the worker's tasks), per step:")
            for lane, kinds in counted.items():
                lines.append(_line(lane, kinds, STEPS))
            extra = counted["queued"] - counted["unqueued"]
            lines.append(_line("extra", extra, STEPS) + f"; {sum(extra.values())} per run")
            for line in lines[1:]:
                print(line, flush=True)
            for number in range(args.rounds):
                for kind in KINDS:
                    ms = ms_of(kind, args)
                    cids: list[str] = []
                    checkpoint()
                    for lane in rotated(LANES, number):
                        got = measure(lane, ms, args.celery_runs, args.concurrent, worker)
                        sub_steps = {"sequential": args.celery_runs, "concurrent": args.concurrent}
                        for sub, runs in sub_steps.items():
                            key = (f"celery {sub}", kind, lane)
                            figures.add(key, got[sub], runs * STEPS)
                        cids += got["cids"]
                    check_runs(cids, pid)
                print(
                    f"celery round {number + 1}/{args.rounds}: "
                    + ", ".join(
                        f"{kind} {sub} {_ratio(figures, f'celery {sub}', kind)}"
                        for kind in KINDS
                        for sub in ("sequential", "concurrent")
                    ),
                    flush=True,
                )
    finally:
        stop_all(
            worker.stop if worker else None,
            lambda: _delete_queue(Connection, _env["FLOWWARDEN_BENCH_CELERY_QUEUE"]),
            raw_chain.close_connection,
            workdir.cleanup,
        )
    return lines


def _line(label: str, kinds: Counter[str], steps: int) -> str:
    from bench.queues import statements_line

    return statements_line(label, kinds, steps)


def _ratio(figures: Any, mode: str, kind: str) -> str:
    q = figures.elapsed[(mode, kind, "queued")][-1]
    u = figures.elapsed[(mode, kind, "unqueued")][-1]
    return f"{q / u:.3f}"


def _delete_queue(connection_class: Any, queue: str) -> None:
    with connection_class(broker_url()) as connection:
        connection.default_channel.queue_delete(queue)
