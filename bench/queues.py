"""The cost of a workflow queue's admission per step: the same workflow run with and
without a queue, in one run, in-process and on Celery, on PostgreSQL.

Run from the repository root::

    .venv/bin/python bench/queues.py [--runs N] [--threads K] [--rounds N] [--step-ms MS]
        [--concurrency C] [--celery-runs N] [--concurrent N] [--modes inprocess,celery]

What is measured
----------------
The workflow is ``bench.queues`` (``bench/providers_app/queued.py``): 5 steps on the
ORM snapshot store; each waits ``--step-ms`` milliseconds (10 by default), increments
a counter and returns. The wait stands for what a queued step does: a queue exists
to bound the calls a workflow makes to a carrier's, a payment provider's or a
language model's API, so its steps are such calls, and 10 ms is a fast one (a
service in the same region; most take longer, which only shrinks the share the
admission adds). A sleep, not a busy loop: a call waits on the network, holding no
CPU and no GIL. The same workflow with **trivial** steps (no wait) is measured too:
there the admission's statements are most of what is left, and the figure says so.

Every run is started with ``definition.start(state)``; the **queued** runs with
``start(state, queue="bench-queue")``, a queue of ``concurrency`` *C* (1000 by
default) that the runs never fill (at most 12 steps run at once): so what is timed
is the admission (taking a slot, keeping it between steps, giving it back and looking
for waiting runs), never waiting. What the gate sends on PostgreSQL (printed from
Django's query log by kind, ``queue ...`` being the gate's; the Celery worker's
counted in the worker):

* the first step of an execution: one conditional ``UPDATE`` that takes a free slot
  (``FOR UPDATE SKIP LOCKED``, unless another run waits), committed synchronously;
* between two steps of one in-process execution: one ``SELECT`` of whether another
  run waits (the slot is kept);
* a step that leaves its run running (every Celery step but the last): the same
  ``SELECT`` when it ends, and the slot is kept for the next step's task, which uses
  it without a statement in the same worker process (one ``UPDATE`` takes it again
  in another);
* the end: one ``UPDATE`` giving the slot back (its commit not waiting for the WAL
  flush) and one ``SELECT`` of whether runs wait (the dispatch looks no further).

So 1.4 statements more per step of a 5-step run, in-process and on Celery, against
1.6 and 1.4 for the step itself; how much of a step's time that is depends on what
the step does, hence the two kinds of steps.

1. **In-process**: *runs* runs per lane and round, from *K* threads of this process
   (each runs its share one after the other, the steps in the thread), in three
   lanes: **unqueued**, **queued**, and **raw**: the least a durable step needs, the
   same wait then one autocommitted ``INSERT`` of a snapshot-shaped row per step
   (after a seed row), on a psycopg connection per thread opened with Django's own
   settings (``bench/_postgres.py``).
2. **Celery**: the same lanes with the steps run by one ``celery worker``
   subprocess (``--pool=threads --concurrency=4``) on RabbitMQ: one task per step;
   the raw lane is a Celery ``chain`` of plain tasks (the wait, one ``INSERT``),
   with the delivery options of flowwarden's step task (``bench/workflow_providers.py``
   explains the anchor). Two modes, as ``bench/workflow_providers.py``: sequential
   (*celery_runs* runs one after the other: the latency each step pays) and
   concurrent (*concurrent* runs, 12 by default, started at once from as many
   threads: the worker's 4 threads busy). A run is done when its
   ``WorkflowRun`` reads ``completed`` (raw: when its last row exists), polled every
   2 ms; the worker's statements are counted by the worker (``FLOWWARDEN_BENCH_COUNT_FILE``).

Figures: steps per second (steps x runs / elapsed), the time per step (its inverse
times the threads or the runs at once: what one run's step takes), the admission's cost per step
(queued minus unqueued time per step) and the **ratio** queued / unqueued time per
step (1.00: no cost; the Done-when bound of issue 48 is 1.15), and each flowwarden
lane against its raw engine.

Why the comparison is fair
--------------------------
The queued and unqueued runs are runs of one definition, with the same state,
started the same way from the same threads, on the same database and worker; only
``queue=`` differs, so the difference is the admission and nothing else. Each round
runs every lane back to back, rotating which lane goes first; each lane is warmed up
first (the queue's slot rows are made by the warm-up, once per process, as in a
deployment). The ratio reported is the median of the rounds' own ratios: a round
compares lanes run seconds apart, so a drift of the machine's speed (several tens of
percent on this shared machine) moves both sides alike; the medians of the lanes are
printed too. Every run is checked after its round: completed, its counter 0 to 5 in
chained rows, its steps run where its lane says (a fallback to in-process execution
fails the benchmark instead of flattering it).

PostgreSQL: ``bench/_postgres.py`` (FLOWWARDEN_BENCH_PG_* variables). RabbitMQ at
FLOWWARDEN_BENCH_CELERY_BROKER (default ``amqp://guest:guest@127.0.0.1:5672//``), on a
queue of this run's own, deleted at the end. The benchmark's rows (and its queue's
slot rows) are deleted at the start and at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
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
    open_raw_connection,
    pg_target,
    prepared_statements,
    server_info,
    vacuum_workflow_tables,
)

#: Every coordination id of the benchmark starts with this (cleanup deletes them).
PREFIX = "bench-q-"
LANES = ("unqueued", "queued", "raw")
KINDS = ("call", "trivial")
MODES = ("inprocess", "celery")
#: The benchmark's workflow queue (``bench.providers_app.queued.QUEUE``).
QUEUE = "bench-queue"
#: The Done-when bound of issue 48: queued time per step / unqueued.
BOUND = 1.15


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", type=positive_int, default=48, help="in-process runs per lane and round"
    )
    parser.add_argument("--threads", type=positive_int, default=4, help="threads starting runs (K)")
    parser.add_argument("--rounds", type=positive_int, default=6, help="rounds")
    parser.add_argument("--warmup", type=positive_int, default=1, help="untimed rounds")
    parser.add_argument("--step-ms", type=int, default=10, help="what a step waits (its call)")
    parser.add_argument(
        "--concurrency", type=positive_int, default=1000, help="the queue's concurrency"
    )
    parser.add_argument(
        "--celery-runs",
        type=positive_int,
        default=6,
        help="sequential Celery runs per lane and round",
    )
    parser.add_argument(
        "--concurrent",
        type=positive_int,
        default=12,
        help="Celery runs started at once per lane and round (and threads starting them)",
    )
    parser.add_argument(
        "--modes",
        type=lambda text: tuple(m for m in MODES if m in {t.strip() for t in text.split(",")}),
        default=MODES,
        help="inprocess, celery or both (default)",
    )
    return parser.parse_args(argv)


def new_cid(lane: str) -> str:
    """A fresh coordination id of the benchmark."""
    return f"{PREFIX}{lane}-{uuid.uuid4().hex}"


def initial_state(ms: int) -> dict[str, Any]:
    """The state every run starts from (*ms*: what each step waits)."""
    return {"order": 42, "n": 0, "pid": 0, "ms": ms}


def queue_settings(concurrency: int) -> dict[str, Any]:
    """``FLOWWARDEN["WORKFLOW_QUEUES"]`` of the benchmark."""
    return {QUEUE: {"concurrency": concurrency}}


# -- the threads -------------------------------------------------------------------------


class Threads:
    """*k* threads of this process kept for the whole benchmark (each keeps its database
    connections): ``each(fn)`` calls *fn* once on every one of them at once."""

    def __init__(self, k: int) -> None:
        self.k = k
        self._work: list[Callable[[], Any] | None] = [None] * k
        self._results: list[Any] = [None] * k
        self._start = threading.Barrier(k + 1)
        self._done = threading.Barrier(k + 1)
        self._stop = False
        self._threads = [
            threading.Thread(target=self._loop, args=(n,), name=f"bench-q-{n}", daemon=True)
            for n in range(k)
        ]
        for thread in self._threads:
            thread.start()

    def _loop(self, n: int) -> None:
        while True:
            self._start.wait()
            if self._stop:
                return
            work = self._work[n]
            try:
                self._results[n] = work() if work is not None else None
            except BaseException as exc:  # handed to the caller
                self._results[n] = exc
            self._done.wait()

    def each(self, fn: Callable[[], Any]) -> list[Any]:
        """Call *fn* on every thread at once; their results (an exception is raised)."""
        self._work = [fn] * self.k
        self._start.wait()
        self._done.wait()
        for result in self._results:
            if isinstance(result, BaseException):
                raise result
        return list(self._results)

    def close(self) -> None:
        """Close each thread's connections, then end the threads."""
        from django.db import connections

        from bench.providers_app import raw_chain

        def close() -> None:
            connections.close_all()
            raw_chain.close_connection()
            raw = getattr(_local, "raw", None)
            if raw is not None:
                raw.close()

        self.each(close)
        self._stop = True
        self._start.wait()
        for thread in self._threads:
            thread.join(timeout=10)


_local = threading.local()


# -- in-process --------------------------------------------------------------------------


def run_inprocess(lane: str, ms: int) -> str:
    """One run of *lane* in this thread, to its end; its id."""
    from bench.providers_app.queued import BENCH, QUEUE, STEPS
    from flowwarden_django.workflows import Completed

    cid = new_cid(lane)
    placing = {"queue": QUEUE} if lane == "queued" else {}
    started = BENCH.start(initial_state(ms), coordination_id=cid, **placing)
    result = started.result
    if not isinstance(result, Completed) or result.final_state["n"] != STEPS:
        raise RuntimeError(f"a {lane} run did not complete: {result!r}")
    return cid


def run_raw(lane: str, ms: int) -> str:
    """The raw engine's run in this thread: a seed row, then per step the wait and one
    autocommitted ``INSERT``; its id."""
    from bench.providers_app.queued import STEPS
    from bench.raw_rows import insert_sql, row

    conn = getattr(_local, "raw", None)
    if conn is None:
        conn = _local.raw = open_raw_connection()
    cid = new_cid(lane)
    state = initial_state(ms)
    sql = insert_sql()
    parent = None
    for seq in range(1, STEPS + 2):
        if seq > 1:
            if ms:
                time.sleep(ms / 1000)
            state = {**state, "n": state["n"] + 1, "pid": os.getpid()}
        values = row(cid, seq, parent, state, f"s{seq - 1}" if seq > 1 else "")
        with conn.cursor() as cursor:
            cursor.execute(sql, values)
        parent = values[0]
    return cid


def inprocess_round(threads: Threads, lane: str, ms: int, runs: int) -> tuple[float, list[str]]:
    """*runs* runs of *lane* from the threads (each its share): elapsed seconds, ids."""
    run = run_raw if lane == "raw" else run_inprocess
    share = [runs // threads.k + (1 if n < runs % threads.k else 0) for n in range(threads.k)]
    shares = iter(share)
    lock = threading.Lock()

    def work() -> list[str]:
        with lock:
            mine = next(shares)
        return [run(lane, ms) for _ in range(mine)]

    begun = time.perf_counter()
    done = threads.each(work)
    elapsed = time.perf_counter() - begun
    return elapsed, [cid for cids in done for cid in cids]


# -- checks and statements -----------------------------------------------------------


def check_runs(cids: list[str], pid: int) -> None:
    """Raise unless every run of *cids* has its rows chained parent to child, its counter
    going 0 to the last step, each step run in process *pid*, and (flowwarden's) its
    run completed."""
    from bench.providers_app.queued import STEPS
    from flowwarden_django.models import SnapshotRecord, WorkflowRun

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
            raise RuntimeError(f"the steps of run {cid} ran in {sorted(pids)}, not in {pid}")
    ours = [cid for cid in cids if "-raw-" not in cid]
    completed = WorkflowRun.objects.using(ALIAS).filter(pk__in=ours, status="completed").count()
    if completed != len(ours):
        raise RuntimeError(f"{len(ours) - completed} run(s) not completed")


def inprocess_statements(lane: str) -> Counter[str]:
    """The statements of one in-process run of *lane* (trivial steps), by kind."""
    from django.db import connections

    from bench.providers_app.queued import statement_kind

    kinds: Counter[str] = Counter()

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        kinds[statement_kind(sql, params)] += 1
        return execute(sql, params, many, context)

    with connections[ALIAS].execute_wrapper(count):
        run_inprocess(lane, 0)
    return kinds


def statements_line(label: str, kinds: Counter[str], steps: int) -> str:
    """*kinds* per step, one line."""
    total = sum(kinds.values())
    parts = ", ".join(f"{kind} {count / steps:g}" for kind, count in sorted(kinds.items()))
    return f"  {label:<9} {total / steps:.2f} per step ({parts})"


def cleanup() -> None:
    """Delete the benchmark's snapshot rows, runs and queue slots."""
    from django.db import connections

    from bench.providers_app.queued import QUEUE
    from flowwarden_django.models import SnapshotRecord, WorkflowQueueSlot, WorkflowRun
    from flowwarden_django.workflows.queues import slots

    with connections[ALIAS].cursor() as cursor:
        for model in (SnapshotRecord, WorkflowRun):
            cursor.execute(
                f'DELETE FROM "{model._meta.db_table}" WHERE coordination_id LIKE %s',
                [f"{PREFIX}%"],
            )
        cursor.execute(
            f'DELETE FROM "{WorkflowQueueSlot._meta.db_table}" WHERE queue = %s', [QUEUE]
        )
    slots.forget_made()


# -- figures -------------------------------------------------------------------------


class Figures:
    """Elapsed seconds per (mode, kind, lane) and round, and what is printed of them."""

    def __init__(self) -> None:
        self.elapsed: dict[tuple[str, str, str], list[float]] = {}
        self.steps: dict[tuple[str, str, str], int] = {}

    def add(self, key: tuple[str, str, str], elapsed: float, steps: int) -> None:
        self.elapsed.setdefault(key, []).append(elapsed)
        self.steps[key] = steps

    def rate(self, key: tuple[str, str, str]) -> float:
        return self.steps[key] / statistics.median(self.elapsed[key])

    def paired(self, key: tuple[str, str, str], base: tuple[str, str, str]) -> float:
        """The median of the rounds' own ratios: time per step of *key* / of *base*."""
        pairs = zip(self.elapsed[key], self.elapsed[base], strict=True)
        return statistics.median((e / self.steps[key]) / (b / self.steps[base]) for e, b in pairs)

    def cost_ms(self, key: tuple[str, str, str], base: tuple[str, str, str], threads: int) -> float:
        """The median over rounds of what one thread's step of *key* takes beyond one of
        *base* (ms)."""
        pairs = zip(self.elapsed[key], self.elapsed[base], strict=True)
        return statistics.median(
            (e / self.steps[key] - b / self.steps[base]) * threads * 1000 for e, b in pairs
        )

    def table(self, mode: str, sub: str, threads: int) -> list[str]:
        lines = []
        for kind in KINDS:
            u, q, r = ((mode + sub, kind, lane) for lane in LANES)
            if q not in self.elapsed:
                continue
            ratio = self.paired(q, u)
            verdict = "within" if ratio <= BOUND else "ABOVE"
            lines.append(
                f"{mode + sub:<21} {kind:<8} unqueued {self.rate(u):7.0f} steps/s, queued "
                f"{self.rate(q):7.0f}, raw {self.rate(r):7.0f} | per step: unqueued "
                f"{threads * 1000 / self.rate(u):6.2f} ms, "
                f"queued {threads * 1000 / self.rate(q):6.2f} ms, "
                f"admission +{self.cost_ms(q, u, threads):.2f} ms"
            )
            lines.append(
                f"{'':<30} ratio queued/unqueued {ratio:.3f} ({verdict} {BOUND}; of the "
                f"medians {self.rate(u) / self.rate(q):.3f}); vs raw engine: unqueued "
                f"{self.paired(u, r):.2f}x, queued {self.paired(q, r):.2f}x the raw time per step"
            )
        return lines


def rotated(lanes: tuple[str, ...], number: int) -> list[str]:
    """Round *number*'s lane order: each lane goes first in turn, and every other round
    the order is reversed."""
    shift = number % len(lanes)
    order = list(lanes[shift:] + lanes[:shift])
    return order[::-1] if number % 2 else order


def inprocess_main(args: argparse.Namespace, figures: Figures) -> list[str]:
    """The in-process lanes; the statement lines."""
    from bench.providers_app.queued import STEPS

    threads = Threads(args.threads)
    pid = os.getpid()
    try:
        for _ in range(args.warmup):
            for kind in KINDS:
                for lane in LANES:
                    inprocess_round(threads, lane, ms_of(kind, args), args.threads)
        lines = ["in-process statements of one run (Django's query log), per step:"]
        unqueued = inprocess_statements("unqueued")
        queued = inprocess_statements("queued")
        lines.append(statements_line("unqueued", unqueued, STEPS))
        lines.append(statements_line("queued", queued, STEPS))
        extra = queued - unqueued
        lines.append(statements_line("extra", extra, STEPS) + f"; {sum(extra.values())} per run")
        for line in lines:
            print(line, flush=True)
        for number in range(args.rounds):
            for kind in KINDS:
                ms = ms_of(kind, args)
                cids: list[str] = []
                checkpoint()
                for lane in rotated(LANES, number):
                    elapsed, done = inprocess_round(threads, lane, ms, args.runs)
                    figures.add(("inprocess", kind, lane), elapsed, args.runs * STEPS)
                    cids += done
                check_runs(cids, pid)
            print(
                f"in-process round {number + 1}/{args.rounds}: "
                + ", ".join(f"{kind} {_last(figures, 'inprocess', kind)}" for kind in KINDS),
                flush=True,
            )
    finally:
        threads.close()
    return lines


def _last(figures: Figures, mode: str, kind: str) -> str:
    q = figures.elapsed[(mode, kind, "queued")][-1]
    u = figures.elapsed[(mode, kind, "unqueued")][-1]
    r = figures.elapsed[(mode, kind, "raw")][-1]
    return f"queued/unqueued {q / u:.3f} (unqueued/raw {u / r:.2f})"


def ms_of(kind: str, args: argparse.Namespace) -> int:
    return args.step_ms if kind == "call" else 0


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its results."""
    args = parse_args(argv)
    target = pg_target()
    ensure_database(target)
    from bench import queues_celery

    extra = queues_celery.prepare(args) if "celery" in args.modes else {}
    configure_django(
        target,
        extra_apps=("bench.providers_app",),
        **{
            "FLOWWARDEN": {
                "WORKFLOW_EXECUTION": "inprocess",
                "WORKFLOW_QUEUES": queue_settings(args.concurrency),
            }
        },
        **extra,
    )
    from django.core.management import call_command
    from django.db import connections

    import bench.providers_app.queued  # noqa: F401  (defines the workflow)

    call_command("migrate", verbosity=0)
    version, synchronous_commit = server_info()
    print(
        f"PostgreSQL {version} at {target['host']}:{target['port']}/{target['dbname']}, "
        f"synchronous_commit={synchronous_commit}, prepared statements "
        f"{'on' if prepared_statements() else 'off (Django default)'}; {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}; queue concurrency {args.concurrency}; "
        f"{args.rounds} rounds, {args.warmup} warm-up; steps wait {args.step_ms} ms (call) or "
        f"nothing (trivial); {args.threads} threads",
        flush=True,
    )
    figures = Figures()
    lines: list[str] = []
    try:
        cleanup()
        vacuum_workflow_tables()
        if "inprocess" in args.modes:
            print(f"in-process: {args.runs} runs per lane and round", flush=True)
            lines += inprocess_main(args, figures)
        if "celery" in args.modes:
            lines += queues_celery.celery_main(args, figures)
    except (RuntimeError, AssertionError) as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    finally:
        with contextlib.suppress(Exception):
            cleanup()
        connections.close_all()
    print()
    for line in lines:
        print(line)
    if "inprocess" in args.modes:
        for line in figures.table("inprocess", "", args.threads):
            print(line)
    if "celery" in args.modes:
        for line in figures.table("celery", " sequential", 1):
            print(line)
        for line in figures.table("celery", " concurrent", args.concurrent):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
