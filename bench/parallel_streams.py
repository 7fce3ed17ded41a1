"""Throughput of one stream handled in parallel (``parallelism`` = 1, 4, 16, 64), on
the threaded and the asyncio runtimes and on Celery, against a hand-written pymongo
loop.

Run from the repository root::

    .venv/bin/python bench/parallel_streams.py [--events N] [--noop-events N]
        [--rounds N] [--sleep-ms MS] [--levels 1,4,16,64]

What is measured
----------------
One scripted MongoDB replica set (``flowwarden_django.testkit.scripted_mongo``, the
mockupdb-based server the real pymongo driver talks to over loopback) runs as a
subprocess with a sentinel insert followed by the benchmark's inserts, each of its
own document (so every event has its own key: the default key, the document key).

1. **A handler that waits 5 ms** (``--sleep-ms``), as one doing I/O does: a plain
   ``def`` that calls ``time.sleep`` on the threaded runtime, an ``async def`` that
   awaits ``asyncio.sleep`` on the asyncio runtime; on **Celery**
   (``execution="celery"``) the threaded runtime reads the stream and keeps the
   window, and a ``celery worker`` subprocess (``--pool=threads``, as many threads as
   the highest level, Redis broker and result backend; ``bench.providers_app.stream_events``)
   runs the handler, which calls ``time.sleep``. Each runtime reads ``--events``
   events in burst mode (from the sentinel to the end of the log, then stops) once per
   ``parallelism`` level; the anchor is the ``raw loop``: the loop a user would write
   with pymongo alone (``watch()``, ``try_next()``, call the handler, every 100 events
   write the token to PostgreSQL), which can only wait for one handler at a time.
   Each level's events/s is given as its speed-up over ``parallelism=1`` on the same
   runtime and over the raw loop.
2. **A no-op handler**: the cost of the window itself, ``parallelism=16`` against
   ``parallelism=1`` on ``--noop-events`` events, each runtime, alternating which
   goes first; the cost is the median over ``--rounds`` of each round's pair (the
   two runs of a round are back to back, so the machine's drift between rounds,
   up to 1.5x on this shared machine, cancels).

Every run uses the ORM checkpoint store on PostgreSQL (``save_every_n=100``, no age
threshold, idle heartbeat off), one restart attempt (a restart would re-read events
and is reported as a failure), and is checked to have handled every event exactly
once and to end with its processed anchor at the last event.

The server answers one request at a time (mockupdb holds a lock per request), so at
high levels the server, not the window, sets the pace: the table prints the server's
CPU per event beside each figure. PostgreSQL: as the other benchmarks
(``bench/_postgres.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bson
import pymongo
from psycopg.types.json import Jsonb

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _args import positive_int  # noqa: E402  (after the path set-up)
from _postgres import (  # noqa: E402
    ALIAS,
    configure_django,
    ensure_database,
    open_raw_connection,
    pg_target,
)
from stream_throughput import (  # noqa: E402
    COLL,
    DB,
    MAX_AWAIT_MS,
    baseline_sql,
    process_cpu_seconds,
    sentinel_token,
    start_scripted_server,
    stop_scripted_server,
)

STREAM = "bench.parallel_streams"
RAW_STREAM = "bench.parallel_streams.raw"
SAVE_EVERY_N = 100
RUNTIMES = ("threads", "asyncio")
#: The sleep table's runtimes: those of the no-op comparison, and Celery.
SLEEP_RUNTIMES = (*RUNTIMES, "celery")


def levels_list(text: str) -> list[int]:
    """``1,4,16,64`` as a list of whole numbers >= 1."""
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of whole numbers: {text!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError("levels must be whole numbers of at least 1")
    return levels


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=positive_int, default=1200, help="events per run")
    parser.add_argument(
        "--noop-events", type=positive_int, default=20000, help="events per no-op run"
    )
    parser.add_argument("--rounds", type=positive_int, default=7, help="no-op rounds")
    parser.add_argument("--sleep-ms", type=float, default=5.0, help="the handler's wait")
    parser.add_argument("--levels", type=levels_list, default=[1, 4, 16, 64])
    parser.add_argument(
        "--no-celery", action="store_true", help="leave out the Celery lane (no Redis needed)"
    )
    return parser.parse_args(argv)


class Run:
    """One timed run: events handled, seconds, this process's CPU and the server's
    CPU meanwhile."""

    def __init__(
        self, events: int, seconds: float, server_seconds: float | None, cpu_seconds: float = 0.0
    ) -> None:
        self.events = events
        self.seconds = seconds
        self.server_seconds = server_seconds
        self.cpu_seconds = cpu_seconds

    @property
    def cpu_us(self) -> float:
        """This process's CPU per event (every thread's), in microseconds."""
        return self.cpu_seconds / self.events * 1e6

    @property
    def rate(self) -> float:
        return self.events / self.seconds

    @property
    def server_us(self) -> float | None:
        if self.server_seconds is None:
            return None
        return self.server_seconds / self.events * 1e6


class Bench:
    """The server, the clients and the store, and one method per kind of run."""

    def __init__(self, uri: str, server_pid: int, events: int) -> None:
        from flowwarden_django.streams.backends.orm import OrmCheckpointStore

        self.uri = uri
        self.server_pid = server_pid
        self.events = events
        self.client: pymongo.MongoClient[Any] = pymongo.MongoClient(
            uri, serverSelectionTimeoutMS=5000
        )
        self.store = OrmCheckpointStore(using=ALIAS)
        self.start = sentinel_token(self.client)
        self.last: Any = None

    def close(self) -> None:
        self.store.delete(STREAM)
        self.store.delete(RAW_STREAM)
        self.client.close()

    def spec(self, handler: Callable[..., Any], parallelism: int, execution: str = "inline") -> Any:
        from flowwarden_django.streams.spec import CheckpointSpec, RestartPolicySpec, StreamSpec

        return StreamSpec(
            name=STREAM,
            collection=COLL,
            database=DB,
            handlers={"insert": handler},
            checkpoint=CheckpointSpec(
                save_every_n=SAVE_EVERY_N,
                save_interval_seconds=0,
                idle_heartbeat_interval_seconds=0,
            ),
            restart_policy=RestartPolicySpec(max_attempts=1, initial_delay=0),
            parallelism=parallelism,
            execution=execution,
        )

    def reset(self) -> None:
        from django.utils import timezone

        self.store.delete(STREAM)
        self.store.save_seen(STREAM, self.start, timezone.now())

    def timed(self, run: Callable[[], int]) -> Run:
        before = process_cpu_seconds(self.server_pid)
        began, cpu_began = time.perf_counter(), time.process_time()
        events = run()
        seconds, cpu = time.perf_counter() - began, time.process_time() - cpu_began
        after = process_cpu_seconds(self.server_pid)
        server = None if before is None or after is None else after - before
        return Run(events, seconds, server, cpu)

    def check(self, label: str, handled: int, calls: int, last: Any) -> None:
        if handled != self.events or calls != self.events:
            sys.exit(f"{label}: handled {handled} events ({calls} calls), expected {self.events}")
        if self.last is None:
            self.last = last
        elif last != self.last:
            sys.exit(f"{label}: ended at {last!r}, expected {self.last!r}")

    # -- the runs ---------------------------------------------------------------------

    def threads(self, parallelism: int, wait: float) -> Run:
        from flowwarden_django.streams.runtime.threaded import StreamConsumer
        from flowwarden_django.streams.source import PymongoChangeSource

        calls = [0]

        def handler(doc: Any) -> None:
            if wait:
                time.sleep(wait)
            calls[0] += 1  # one key per event: never two calls of one key at once

        def source_factory(spec: Any) -> PymongoChangeSource:
            return PymongoChangeSource(
                self.client, DB, COLL, stream_name=spec.name, max_await_ms=MAX_AWAIT_MS
            )

        self.reset()
        consumer = StreamConsumer(self.spec(handler, parallelism), self.store, source_factory)

        def run() -> int:
            consumer.run(burst=True)
            return consumer.events_handled

        result = self.timed(run)
        self.verify(f"threads p={parallelism}", consumer, calls[0])
        return result

    def celery(self, parallelism: int, wait: float) -> Run:
        """The threaded runtime reads; the Celery worker runs the handler (its wait is
        the worker's, set when it started)."""
        from flowwarden_django.streams.runtime.threaded import StreamConsumer
        from flowwarden_django.streams.source import PymongoChangeSource

        def source_factory(spec: Any) -> PymongoChangeSource:
            return PymongoChangeSource(
                self.client, DB, COLL, stream_name=spec.name, max_await_ms=MAX_AWAIT_MS
            )

        self.reset()
        spec = self.spec(lambda doc: None, parallelism, execution="celery")
        consumer = StreamConsumer(spec, self.store, source_factory)

        def run() -> int:
            consumer.run(burst=True)
            return consumer.events_handled

        result = self.timed(run)
        # The handler's calls are counted by the worker: the consumer's count instead.
        self.verify(f"celery p={parallelism}", consumer, consumer.events_handled)
        return result

    def asyncio(self, parallelism: int, wait: float) -> Run:
        from flowwarden_django.streams.async_source import AsyncPymongoChangeSource
        from flowwarden_django.streams.runtime.event_loop import AsyncStreamConsumer

        calls = [0]

        async def handler(doc: Any) -> None:
            if wait:
                await asyncio.sleep(wait)
            calls[0] += 1

        self.reset()  # before the loop: the ORM store is sync
        consumer_box: list[Any] = []

        async def main() -> int:
            client: pymongo.AsyncMongoClient[Any] = pymongo.AsyncMongoClient(
                self.uri, serverSelectionTimeoutMS=5000
            )

            def source_factory(spec: Any) -> AsyncPymongoChangeSource:
                return AsyncPymongoChangeSource(
                    client, DB, COLL, stream_name=spec.name, max_await_ms=MAX_AWAIT_MS
                )

            consumer = AsyncStreamConsumer(
                self.spec(handler, parallelism), self.store, source_factory
            )
            consumer_box.append(consumer)
            await client.admin.command("ping")
            try:
                await consumer.run(burst=True)
            finally:
                await client.close()
            return consumer.events_handled

        result = self.timed(lambda: asyncio.run(main()))
        self.verify(f"asyncio p={parallelism}", consumer_box[0], calls[0])
        return result

    def verify(self, label: str, consumer: Any, calls: int) -> None:
        if consumer.restarts or consumer.last_error is not None:
            sys.exit(f"{label}: the stream restarted: {consumer.last_error!r}")
        saved = self.store.find(STREAM)
        self.check(label, consumer.events_handled, calls, saved.last_processed_token)

    def raw_loop(self, wait: float) -> Run:
        """The hand-written loop: one handler call at a time."""
        conn = open_raw_connection()
        sql = baseline_sql()
        calls = [0]

        def handler(doc: Any) -> None:
            if wait:
                time.sleep(wait)
            calls[0] += 1

        def run() -> int:
            count = unsaved = 0
            token: Any = None
            collection = self.client[DB][COLL]
            with collection.watch(resume_after=self.start, max_await_time_ms=MAX_AWAIT_MS) as s:
                while (event := s.try_next()) is not None:
                    handler(event.get("fullDocument"))
                    count += 1
                    unsaved += 1
                    token = event["_id"]
                    if unsaved >= SAVE_EVERY_N:
                        params = (RAW_STREAM, bson.encode(token), datetime.now(UTC), Jsonb({}))
                        conn.execute(sql, params)
                        unsaved = 0
            if unsaved:
                params = (RAW_STREAM, bson.encode(token), datetime.now(UTC), Jsonb({}))
                conn.execute(sql, params)
            self.check("raw loop", count, calls[0], token)
            return count

        try:
            return self.timed(run)
        finally:
            conn.close()


def server_note(run: Run) -> str:
    return "" if run.server_us is None else f"{run.server_us:.0f}"


class CeleryLane:
    """The Celery worker of the Celery lane, on a queue of this run's own."""

    def __init__(self, target: dict[str, str], levels: list[int], sleep_ms: float) -> None:
        import uuid

        from workflow_providers import WorkerProcess, redis_url

        self.broker_url = redis_url()
        self.queue = f"fw-bench-streams-{uuid.uuid4().hex[:12]}"
        self.levels = levels
        self.sleep_ms = sleep_ms
        self.target = target
        self.worker: Any = None
        self._process_class = WorkerProcess
        os.environ.update(
            FLOWWARDEN_BENCH_CELERY_BROKER=self.broker_url,
            FLOWWARDEN_BENCH_CELERY_QUEUE=self.queue,
        )

    def settings(self) -> dict[str, Any]:
        """The ``CELERY_*`` settings of the benchmark process (the worker's)."""
        from bench import providers_settings as worker_settings

        return {
            name: getattr(worker_settings, name)
            for name in dir(worker_settings)
            if name.startswith("CELERY_")
        }

    def start(self, log_dir: Path) -> None:
        from bench.providers_celery import READY_LINE
        from bench.providers_celery import app as celery_app

        celery_app.set_default()  # what Celery's Django fixup does in a project
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "DJANGO_SETTINGS_MODULE": "bench.providers_settings",
            "FLOWWARDEN_BENCH_PG_HOST": self.target["host"],
            "FLOWWARDEN_BENCH_PG_PORT": self.target["port"],
            "FLOWWARDEN_BENCH_PG_USER": self.target["user"],
            "FLOWWARDEN_BENCH_PG_DB": self.target["dbname"],
            "FLOWWARDEN_BENCH_SLEEP_MS": str(self.sleep_ms),
        }
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "bench.providers_celery",
            "worker",
            "--pool=threads",
            f"--concurrency={max(self.levels)}",
            "--loglevel=WARNING",
            f"--hostname=fw-bench-streams-{self.queue[-8:]}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        self.worker = self._process_class(
            "the Celery worker", command, env, log_dir / "celery-worker.log", READY_LINE
        )

    def stop(self) -> None:
        from workflow_providers import delete_celery_queue

        if self.worker is None:
            return
        self.worker.stop()
        self.worker = None
        options = self.settings()["CELERY_BROKER_TRANSPORT_OPTIONS"]
        delete_celery_queue(self.broker_url, self.queue, list(options.values()))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its results."""
    import tempfile

    args = parse_args(argv)
    target = pg_target()
    ensure_database(target)
    lane = None if args.no_celery else CeleryLane(target, args.levels, args.sleep_ms)
    configure_django(target, **(lane.settings() if lane else {}))

    from django.core.management import call_command
    from django.db import connections

    call_command("migrate", verbosity=0)
    runtimes = RUNTIMES if lane is None else SLEEP_RUNTIMES
    logs = tempfile.TemporaryDirectory(prefix="fw-bench-streams-")
    if lane is not None:
        lane.start(Path(logs.name))
    wait = args.sleep_ms / 1000
    print(
        f"one stream, {args.events} events per run with a handler that waits "
        f"{args.sleep_ms:g} ms, {args.noop_events} events per no-op run x {args.rounds} "
        f"rounds; ORM checkpoint store (save_every_n={SAVE_EVERY_N}); levels {args.levels}",
        flush=True,
    )
    try:
        results: dict[tuple[str, int], Run] = {}
        noop: dict[tuple[str, int], list[float]] = {}
        noop_cpu: dict[tuple[str, int], list[float]] = {}
        for events, phase in ((args.events, "sleep"), (args.noop_events, "noop")):
            proc, uri = start_scripted_server(events + 1)
            bench = Bench(uri, proc.pid, events)
            try:
                if phase == "sleep":
                    raw = bench.raw_loop(wait)
                    print(f"raw loop: {raw.rate:.0f} events/s", flush=True)
                    for runtime in runtimes:
                        for level in args.levels:
                            run = getattr(bench, runtime)(level, wait)
                            results[runtime, level] = run
                            print(
                                f"{runtime} parallelism={level}: {run.rate:.0f} events/s",
                                flush=True,
                            )
                else:
                    if lane is not None:
                        lane.stop()  # its idle threads off the CPUs the no-op runs measure
                    bench.threads(1, 0)  # warm-up: imports, connections, the server's caches
                    for number in range(1, args.rounds + 1):
                        for runtime in RUNTIMES:
                            order = (1, 16) if number % 2 else (16, 1)
                            for level in order:
                                run = getattr(bench, runtime)(level, 0)
                                noop.setdefault((runtime, level), []).append(run.rate)
                                noop_cpu.setdefault((runtime, level), []).append(run.cpu_us)
                        print(
                            f"no-op round {number}/{args.rounds}: "
                            + ", ".join(
                                f"{runtime} p=1 {noop[runtime, 1][-1]:.0f}/s p=16 "
                                f"{noop[runtime, 16][-1]:.0f}/s"
                                for runtime in RUNTIMES
                            ),
                            flush=True,
                        )
            finally:
                bench.close()
                connections.close_all()
                stop_scripted_server(proc)
    finally:
        if lane is not None:
            lane.stop()
        logs.cleanup()

    print()
    print(f"handler waits {args.sleep_ms:g} ms; raw pymongo loop: {raw.rate:.0f} events/s")
    print(f"{'runtime':<9} {'parallelism':>11} {'events/s':>9} {'x p=1':>7} {'x raw':>7}")
    for runtime in runtimes:
        one = results[runtime, args.levels[0]].rate
        for level in args.levels:
            run = results[runtime, level]
            print(
                f"{runtime:<9} {level:>11} {run.rate:>9.0f} {run.rate / one:>7.2f} "
                f"{run.rate / raw.rate:>7.2f}"
            )
    print()
    print("no-op handler (the window's own cost), medians; the cost is the median of each")
    print("round's own p=16 against p=1 (run back to back: the machine's drift cancels)")
    for runtime in RUNTIMES:
        one = statistics.median(noop[runtime, 1])
        sixteen = statistics.median(noop[runtime, 16])
        pairs = zip(noop[runtime, 1], noop[runtime, 16], strict=True)
        cost = statistics.median(1 - at_16 / at_1 for at_1, at_16 in pairs)
        cpu_one = statistics.median(noop_cpu[runtime, 1])
        cpu_sixteen = statistics.median(noop_cpu[runtime, 16])
        print(
            f"{runtime:<9} p=1 {one:>7.0f}/s  p=16 {sixteen:>7.0f}/s  "
            f"cost of the window {100 * cost:>5.1f}%  "
            f"(this process's CPU per event: {cpu_one:.1f} us, {cpu_sixteen:.1f} us)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
