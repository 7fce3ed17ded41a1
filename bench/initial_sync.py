"""Documents copied per second by an initial sync against the ``find`` loop a user would
hand-write.

Run from the repository root::

    .venv/bin/python bench/initial_sync.py [--docs N] [--batch N] [--rounds N] [--warmup N]
                                           [--profile]

What is measured
----------------
One scripted MongoDB replica set (``flowwarden_django.testkit.scripted_mongo``, the
mockupdb-based fake the real pymongo driver talks to over loopback) runs as a
subprocess with ``--seed N``: ``N`` documents ``{"_id": n, "seq": n}`` stored without
change events, as a collection that existed before the stream. Both paths copy all
of them, in ``_id`` order, ``--batch`` documents per ``find``, over the same
``MongoClient``, handing each to the same handler (it only counts its calls), and
each round must have handled exactly ``N`` documents, the last one being ``_id`` N.

1. **Runtime**: ``StreamConsumer(spec, OrmCheckpointStore(using="default"),
   source_factory).run(burst=True)`` with a ``StreamSpec`` declared
   ``CheckpointSpec(start_position="COPY_EXISTING", copy_batch_size=--batch)`` whose
   only handler is the ``snapshot`` one (``on_snapshot(doc)``), on a
   ``PymongoChangeSource``. The stream's checkpoint is deleted before each round, so
   every round is a first start. The round is timed from ``run()`` to the
   ``initial_sync_finished`` signal (its receiver stops the consumer): the checkpoint
   read, the progress record's claim, ``estimated_document_count``, capturing the
   change-stream position and saving it as the seen anchor, then per batch one
   ``find().sort("_id", 1).limit(batch)``, the change context, the attempt loop and
   dispatch of each document, and one conditional progress write; then the final
   ``done`` write. Opening the change stream afterwards is not timed.
2. **Hand-written loop**: what a user would write without this app::

       claim: upsert {"phase": "copying", "batch": 0} into the progress row
       last = None
       while True:
           query = {} if last is None else {"_id": {"$gt": last}}
           docs = list(coll.find(query).sort("_id", 1).limit(batch))
           if not docs: break
           for doc in docs: on_snapshot(doc)
           last = docs[-1]["_id"]
           conditional UPDATE of the progress row (batch, last _id, copied)
           if len(docs) < batch: break
       conditional UPDATE: {"phase": "done"}

   The writes go to the same checkpoint table (another row) through a raw psycopg
   connection with Django's own connection settings (``bench/_postgres.py``), the same
   statements the ORM store sends (``UPDATE ... WHERE stream_name = %s AND
   initial_sync_batch = %s``), so both paths make one write per batch.

Why the baseline is fair, and what bounds both
----------------------------------------------
Same server, same documents, same client, same batch size, same number of ``find``
commands (the runtime, too, stops at a short or empty batch), same handler, same
number of progress writes to the same table. The paths alternate (runtime first,
then hand-written first, ...) after a warm-up of each; medians are reported. What
remains is the runtime's own work per document (the snapshot change context, the
attempt loop and handler dispatch, the ``event_processed`` signal) and per batch
(the ``copy_filter`` query, the progress record with its canonical ``_id`` and the
ORM store instead of a bare ``execute``, the ``initial_sync_progress`` signal). With
prometheus-client installed, as here, the app connects its Prometheus receivers, so
the runtime also counts every copied document in ``flowwarden_events_processed_total``
and its duration histogram; the first line says whether they are connected.

The scripted server re-reads (filters and sorts) the whole collection in Python for
every ``find`` (it caches per cursor, and each batch is a new cursor), so a batch
costs it time proportional to ``N``: at the default sizes the server, not the client,
sets the pace. The consumer thread's CPU time (``time.thread_time()``, per document)
is therefore reported too: it is the runtime's own cost, independent of the server,
and the "waiting" share (wall time not spent on the consumer thread's CPU) says how
much of each round was spent waiting for the server. A larger ``--batch`` makes the
server's share smaller (fewer re-reads), so the ratio shows more of the runtime's
own overhead; ``--profile`` prints a cProfile of one runtime round by cumulative time.

PostgreSQL defaults to 127.0.0.1:5432, user ``postgres``, database ``fw_bench``
(created if missing); override with FLOWWARDEN_BENCH_PG_HOST, FLOWWARDEN_BENCH_PG_PORT,
FLOWWARDEN_BENCH_PG_USER and FLOWWARDEN_BENCH_PG_DB. The benchmark's rows are deleted
at the end.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import selectors
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pymongo
from psycopg import sql as pgsql
from psycopg.types.json import Jsonb

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _args import positive_int  # noqa: E402  (after the path set-up)
from _postgres import (  # noqa: E402  (after the path set-up; bench/ is the script's dir)
    ALIAS,
    configure_django,
    ensure_database,
    open_raw_connection,
    pg_target,
    server_info,
)

DB, COLL = "app", "orders"
RUNTIME_STREAM = "bench.initial_sync.runtime"
BASELINE_STREAM = "bench.initial_sync.handwritten"
#: ``max_await_time_ms`` of the change stream the runtime opens after the copy (untimed).
MAX_AWAIT_MS = 50


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=positive_int, default=50_000, help="seeded documents")
    parser.add_argument(
        "--batch", type=positive_int, default=1000, help="documents per find (copy_batch_size)"
    )
    parser.add_argument("--rounds", type=positive_int, default=3, help="rounds per path")
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed warm-up rounds per path (0: none)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="print a cProfile of one extra runtime round"
    )
    return parser.parse_args(argv)


# -- the scripted replica set ------------------------------------------------------------ #


def start_scripted_server(docs: int) -> tuple[subprocess.Popen[str], str]:
    """Start the scripted replica set with *docs* seeded documents; return it and its URI."""
    command = [
        sys.executable,
        "-m",
        "flowwarden_django.testkit.scripted_mongo",
        "--port",
        "0",
        "--seed",
        str(docs),
        "--db",
        DB,
        "--coll",
        COLL,
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        ready = selector.select(120)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("READY "):
        stop_scripted_server(proc)
        sys.exit(f"the scripted replica set did not start (said {line!r})")
    return proc, line.split()[1]


def stop_scripted_server(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the server process and wait for it (SIGKILL if it hangs)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the two paths ----------------------------------------------------------------------- #

_calls = [0]


def on_snapshot(doc: Any) -> None:
    """The handler both paths call for each document (it only counts its calls)."""
    _calls[0] += 1


class RoundResult:
    """One timed copy: documents copied, handler calls, wall and thread-CPU seconds, last _id."""

    def __init__(self, docs: int, calls: int, seconds: float, cpu: float, last: Any) -> None:
        self.docs = docs
        self.calls = calls
        self.seconds = seconds
        self.cpu = cpu
        self.last = last

    @property
    def rate(self) -> float:
        """Documents per second."""
        return self.docs / self.seconds

    @property
    def cpu_us(self) -> float:
        """The consumer thread's CPU time per document, in microseconds."""
        return self.cpu / self.docs * 1e6

    @property
    def waiting(self) -> float:
        """The share of the wall time the consumer thread was not on a CPU."""
        return max(0.0, 1.0 - self.cpu / self.seconds)


def runtime_round(
    store: Any,
    source_factory: Callable[[Any], Any],
    batch: int,
    profiler: cProfile.Profile | None = None,
) -> RoundResult:
    """Copy through ``StreamConsumer``; time ``run()`` up to ``initial_sync_finished``."""
    from flowwarden_django.streams import metrics
    from flowwarden_django.streams.initial_sync.copier import decode_id
    from flowwarden_django.streams.runtime.threaded import StreamConsumer
    from flowwarden_django.streams.spec import CheckpointSpec, RestartPolicySpec, StreamSpec

    spec = StreamSpec(
        name=RUNTIME_STREAM,
        collection=COLL,
        database=DB,
        handlers={"snapshot": on_snapshot},
        checkpoint=CheckpointSpec(
            start_position="COPY_EXISTING",
            copy_batch_size=batch,
            save_every_n=100,
            save_interval_seconds=0,
            idle_heartbeat_interval_seconds=0,
        ),
        # A restart would copy again and spoil the count: fail fast instead.
        restart_policy=RestartPolicySpec(max_attempts=1, initial_delay=0),
    )
    store.delete(RUNTIME_STREAM)
    consumer = StreamConsumer(spec, store, source_factory)
    finished: list[tuple[float, float]] = []

    def on_finished(sender: str, **kwargs: Any) -> None:
        if profiler is not None:
            profiler.disable()
        finished.append((time.perf_counter(), time.thread_time()))
        consumer.stop()  # the copy is done: do not stream

    metrics.initial_sync_finished.connect(on_finished, sender=RUNTIME_STREAM, weak=False)
    calls_before = _calls[0]
    try:
        began, cpu_began = time.perf_counter(), time.thread_time()
        if profiler is not None:
            profiler.enable()
        consumer.run(burst=True)
    finally:
        metrics.initial_sync_finished.disconnect(on_finished, sender=RUNTIME_STREAM)
    if consumer.restarts or consumer.last_error is not None or not finished:
        sys.exit(f"the runtime did not finish its copy: {consumer.last_error!r}")
    ended, cpu_ended = finished[0]
    saved = store.find(RUNTIME_STREAM)
    progress = saved.initial_sync if saved is not None else None
    if progress is None or progress.get("phase") != "done":
        sys.exit(f"the runtime's copy did not end as done: {progress!r}")
    last = decode_id(progress["last_id"]) if progress.get("last_id") else None
    return RoundResult(
        consumer.documents_copied,
        _calls[0] - calls_before,
        ended - began,
        cpu_ended - cpu_began,
        last,
    )


def baseline_statements() -> tuple[str, str]:
    """The hand-written claim (an upsert) and conditional progress UPDATE."""
    from flowwarden_django.models import StreamCheckpoint

    table = pgsql.Identifier(StreamCheckpoint._meta.db_table)
    claim = pgsql.SQL(
        "INSERT INTO {table} (stream_name, initial_sync, initial_sync_batch, metadata) "
        "VALUES (%s, %s, %s, %s) ON CONFLICT (stream_name) DO UPDATE SET "
        "initial_sync = EXCLUDED.initial_sync, initial_sync_batch = EXCLUDED.initial_sync_batch"
    ).format(table=table)
    update = pgsql.SQL(
        "UPDATE {table} SET initial_sync = %s, initial_sync_batch = %s "
        "WHERE stream_name = %s AND initial_sync_batch = %s"
    ).format(table=table)
    return claim.as_string(None), update.as_string(None)


def baseline_round(
    coll: Any, conn: psycopg.Connection[Any], statements: tuple[str, str], batch: int
) -> RoundResult:
    """The loop a user would write without this app; time it from the claim on."""
    claim, update = statements
    calls_before = _calls[0]
    count = number = 0
    last: Any = None
    began, cpu_began = time.perf_counter(), time.thread_time()
    progress: dict[str, Any] = {"phase": "copying", "batch": 0, "last_id": None, "copied": 0}
    conn.execute(claim, (BASELINE_STREAM, Jsonb(progress), 0, Jsonb({})))
    while True:
        query = {} if last is None else {"_id": {"$gt": last}}
        docs = list(coll.find(query).sort("_id", 1).limit(batch))
        if not docs:
            break
        for doc in docs:
            on_snapshot(doc)
        last = docs[-1]["_id"]
        count += len(docs)
        progress = {"phase": "copying", "batch": number + 1, "last_id": last, "copied": count}
        conn.execute(update, (Jsonb(progress), number + 1, BASELINE_STREAM, number))
        number += 1
        if len(docs) < batch:
            break
    done = {**progress, "phase": "done", "batch": number + 1}
    conn.execute(update, (Jsonb(done), number + 1, BASELINE_STREAM, number))
    seconds, cpu = time.perf_counter() - began, time.thread_time() - cpu_began
    return RoundResult(count, _calls[0] - calls_before, seconds, cpu, last)


def check(name: str, result: RoundResult, docs: int) -> None:
    """Exit 1 unless the round copied exactly *docs* documents, ending at ``_id`` *docs*."""
    if result.docs != docs or result.calls != docs or result.last != docs:
        sys.exit(
            f"{name}: copied {result.docs} documents ({result.calls} handler calls, last "
            f"_id {result.last!r}), expected {docs}"
        )


def print_profile(profiler: cProfile.Profile, docs: int) -> None:
    """The runtime round's profile: the top functions by cumulative and by own time."""
    for order in ("cumulative", "tottime"):
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats(order).print_stats(25)
        print(f"-- cProfile of one runtime round ({docs} documents), by {order} --")
        print(text.getvalue())


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its results."""
    args = parse_args(argv)
    target = pg_target()
    ensure_database(target)
    configure_django(target)

    from django.core.management import call_command
    from django.db import connections

    from flowwarden_django.streams import metrics
    from flowwarden_django.streams.backends.orm import OrmCheckpointStore
    from flowwarden_django.streams.source import PymongoChangeSource

    call_command("migrate", verbosity=0)
    version, synchronous_commit = server_info()
    batches = -(-args.docs // args.batch)
    observed = metrics.event_processed.has_listeners(RUNTIME_STREAM)
    print(
        f"PostgreSQL {version} at {target['host']}:{target['port']}/{target['dbname']}, "
        f"synchronous_commit={synchronous_commit}; OrmCheckpointStore; {args.rounds} rounds x "
        f"{args.docs} documents per path in batches of {args.batch} ({batches} batches), "
        f"{args.warmup} warm-up round(s) each; event_processed receivers (Prometheus): "
        f"{'connected' if observed else 'none'}",
        flush=True,
    )

    proc, uri = start_scripted_server(args.docs)
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000)
    store = OrmCheckpointStore(using=ALIAS)
    conn = open_raw_connection()
    statements = baseline_statements()
    print(
        f"scripted replica set at {uri} (subprocess {proc.pid}), {args.docs} seeded documents",
        flush=True,
    )

    def source_factory(spec: Any) -> PymongoChangeSource:
        return PymongoChangeSource(
            client, spec.database, spec.collection, stream_name=spec.name, max_await_ms=MAX_AWAIT_MS
        )

    coll = client[DB][COLL]
    runtime_results: list[RoundResult] = []
    baseline_results: list[RoundResult] = []
    try:

        def run_runtime(profiler: cProfile.Profile | None = None) -> RoundResult:
            result = runtime_round(store, source_factory, args.batch, profiler)
            check("runtime", result, args.docs)
            return result

        def run_baseline() -> RoundResult:
            result = baseline_round(coll, conn, statements, args.batch)
            check("hand-written loop", result, args.docs)
            return result

        for number in range(1, args.warmup + 1):
            warm_base = run_baseline()
            warm_runtime = run_runtime()
            print(
                f"warm-up {number}/{args.warmup}: runtime {warm_runtime.rate:.0f}/s "
                f"hand-written {warm_base.rate:.0f}/s",
                flush=True,
            )
        for number in range(1, args.rounds + 1):
            # Alternate which path goes first, so neither always follows the other.
            if number % 2:
                runtime_results.append(run_runtime())
                baseline_results.append(run_baseline())
            else:
                baseline_results.append(run_baseline())
                runtime_results.append(run_runtime())
            runtime, baseline = runtime_results[-1], baseline_results[-1]
            print(
                f"round {number}/{args.rounds}: runtime {runtime.rate:.0f}/s "
                f"({runtime.cpu_us:.1f} us CPU/doc) hand-written {baseline.rate:.0f}/s "
                f"({baseline.cpu_us:.1f} us CPU/doc)",
                flush=True,
            )
        if args.profile:
            profiler = cProfile.Profile()
            run_runtime(profiler)
            print_profile(profiler, args.docs)
    finally:
        store.delete(RUNTIME_STREAM)
        store.delete(BASELINE_STREAM)
        conn.close()
        client.close()
        connections.close_all()
        stop_scripted_server(proc)

    runtime_rate = statistics.median(r.rate for r in runtime_results)
    baseline_rate = statistics.median(r.rate for r in baseline_results)
    runtime_cpu = statistics.median(r.cpu_us for r in runtime_results)
    baseline_cpu = statistics.median(r.cpu_us for r in baseline_results)
    waiting = statistics.median(r.waiting for r in baseline_results)
    print(
        f"runtime (StreamConsumer, COPY_EXISTING): {runtime_rate:.0f} docs/s, "
        f"{runtime_cpu:.1f} us consumer-thread CPU/doc"
    )
    print(
        f"hand-written find loop: {baseline_rate:.0f} docs/s, "
        f"{baseline_cpu:.1f} us consumer-thread CPU/doc"
    )
    print(f"ratio (runtime / hand-written): {runtime_rate / baseline_rate:.2f}")
    print(
        f"runtime's own CPU cost: +{runtime_cpu - baseline_cpu:.1f} us/doc; the hand-written "
        f"loop waited on the server {waiting:.0%} of its wall time"
        + (" (the server is the bottleneck)" if waiting >= 0.5 else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
