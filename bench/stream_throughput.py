"""Events per second through ``StreamConsumer`` against the loop a user would hand-write.

Run from the repository root::

    .venv/bin/python bench/stream_throughput.py [--events N] [--rounds N] [--warmup N]
                                               [--profile]

What is measured
----------------
One scripted MongoDB replica set (``flowwarden_django.testkit.scripted_mongo``, the
mockupdb-based fake the real pymongo driver talks to over loopback) runs as a
subprocess with a log of ``1 + N`` insert events on ``app.orders``. The first one is
a sentinel: its resume token is the start position, so each loop below resumes after
it and reads exactly the same ``N`` events, from the same server, through
``collection.watch()`` with the same ``max_await_time_ms`` and the default batch size,
on the same ``MongoClient``. Each loop stops at the first poll that returns nothing
(the end of the log) and must have handled exactly ``N`` events, ending at the same
token.

1. **Runtime**: ``StreamConsumer(spec, OrmCheckpointStore(using="default"),
   source_factory).run(burst=True)`` with a ``StreamSpec`` whose only handler is the
   no-op ``insert`` handler and whose checkpoint policy is ``save_every_n=100`` (no
   age threshold unless ``--save-interval`` gives one, no idle heartbeat), on a
   ``PymongoChangeSource``. ``--save-interval 5`` measures the default checkpoint
   settings: an age threshold checked after each event, and the flusher thread. Before each round
   the stream's checkpoint is reset to a seen anchor at the start token, so the resume
   cascade (one checkpoint read, then resume after the seen anchor) opens the stream
   where the baseline does. Everything ``run()`` does is timed: the checkpoint read,
   opening the cursor, handler dispatch, the per-event metric signals, the
   processed-anchor policy and its upserts on PostgreSQL through the Django ORM
   connection.
2. **Hand-written loop**: what a user would write without this app::

       with coll.watch(resume_after=start, max_await_time_ms=...) as stream:
           while (event := stream.try_next()) is not None:
               handler = handlers.get(event["operationType"])  # {"insert": handle}
               ...handler(event["fullDocument"]); every 100 events: upsert the token

   The upsert is one ``INSERT ... ON CONFLICT DO UPDATE`` of the token's BSON bytes and
   a timestamp into the same checkpoint table (another row), executed with
   ``conn.execute()`` on an autocommit psycopg connection; a last upsert covers a
   partial final block, as the runtime's flush on stop does.

Why the baseline is fair
------------------------
Both loops read the same events from the same server over the same client, call the
same handler function, and write the same number of checkpoints (``N / 100``) to the
same table on the same PostgreSQL server. The raw connection is opened with the
keyword arguments Django itself uses (``connections["default"].get_connection_params()``,
Django's cursor base class, autocommit, the session time zone), as in
``bench/checkpoint_writes.py``. The server runs in its own process, so its work does
not compete with the measured loop for the GIL; both loops wait for it equally (about
a third of the hand-written loop's time is spent in ``recv``), and both pay the same
final idle ``getMore`` (the server answers an idle poll after 20 ms). What remains is
the runtime's own cost per event: dispatch through its handler caller (the change
context is made only for handlers that take one), the anchor policy, the per-event
metric signals, and the ORM store instead of a bare ``execute``; less the runtime's
one saving: it takes the events pymongo already holds from the last ``getMore``'s
batch without ``try_next()``'s nested calls (``streams/runtime/buffered.py``), where
the hand-written loop calls the public ``try_next()`` for each. With prometheus-client
installed, as here, the app connects its Prometheus receivers to ``event_received`` and
``event_processed``, so the runtime also counts every event and its duration; the first
line says whether they are connected. The paths alternate (runtime first, then
hand-written first, ...) after a warm-up of each, and the medians are reported.

What the server's speed does to the figures
-------------------------------------------
The loop and the server take turns: a ``getMore`` waits for its reply, and the server
idles while the loop handles the batch. An event's wall time is therefore the
consumer's CPU time for it, plus the server's, plus the waits for PostgreSQL's commits
and the loopback, and all but the first are the same for both paths: the quicker the
server, the lower the wall-clock ratio, for the same runtime. So each round also
measures

* the consumer thread's CPU time (``time.thread_time()``) per event, for both paths:
  the runtime's own cost is the difference, whatever the server's speed;
* the scripted server's CPU time per event (all its threads, from Linux's
  ``/proc/<pid>/task/*/schedstat``; left out where that cannot be read).

The last lines compare them: when the server spends at least half of the hand-written
loop's wall time per event on its own CPU, the server, not the loop, sets the pace of
the baseline and the wall-clock ratio hides the runtime's cost; the benchmark says so
(then read the CPU figures). ``--profile`` prints a cProfile of one extra runtime
round (by own and by cumulative time).

PostgreSQL defaults to 127.0.0.1:5432, user ``postgres``, database ``fw_bench``
(created if missing); override with FLOWWARDEN_BENCH_PG_HOST, FLOWWARDEN_BENCH_PG_PORT,
FLOWWARDEN_BENCH_PG_USER and FLOWWARDEN_BENCH_PG_DB. The benchmark's rows are deleted
at the end.
"""

from __future__ import annotations

import argparse
import cProfile
import glob
import io
import os
import pstats
import selectors
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bson
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
RUNTIME_STREAM = "bench.stream_throughput.runtime"
BASELINE_STREAM = "bench.stream_throughput.handwritten"
SAVE_EVERY_N = 100
#: ``max_await_time_ms`` of both cursors (the scripted server answers an idle poll
#: after at most 20 ms anyway).
MAX_AWAIT_MS = 100


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=positive_int, default=20_000, help="events per round")
    parser.add_argument("--rounds", type=positive_int, default=3, help="rounds per path")
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed warm-up rounds per path (0: none)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="print a cProfile of one extra runtime round"
    )
    parser.add_argument(
        "--save-interval",
        type=float,
        default=0.0,
        help="the runtime's save_interval_seconds (0: no age threshold; 5: the default)",
    )
    return parser.parse_args(argv)


# -- PostgreSQL and Django (as in bench/checkpoint_writes.py) -------------------------- #


# -- the scripted replica set ------------------------------------------------------------ #


def start_scripted_server(events: int) -> tuple[subprocess.Popen[str], str]:
    """Start the scripted replica set with *events* logged inserts; return it and its URI."""
    command = [
        sys.executable,
        "-m",
        "flowwarden_django.testkit.scripted_mongo",
        "--port",
        "0",
        "--events",
        str(events),
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
        ready = selector.select(60)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("READY "):
        stop_scripted_server(proc)
        sys.exit(f"the scripted replica set did not start (said {line!r})")
    return proc, line.split()[1]


def process_cpu_seconds(pid: int) -> float | None:
    """CPU time used so far by every live thread of process *pid* (Linux), else None.

    ``schedstat`` counts nanoseconds; without it, ``stat`` counts clock ticks (and
    includes threads that have ended).
    """
    total, seen = 0, False
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as stats:
                total += int(stats.read().split()[0])
                seen = True
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    if seen:
        return total / 1e9
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def stop_scripted_server(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the server process and wait for it (SIGKILL if it hangs)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def sentinel_token(client: pymongo.MongoClient[Any]) -> Mapping[str, Any]:
    """The resume token of the first logged event (the sentinel, ``seq`` 1)."""
    oldest = client.local["oplog.rs"].find_one({}, sort=[("$natural", 1)])["ts"]
    with client[DB][COLL].watch(
        start_at_operation_time=oldest, max_await_time_ms=MAX_AWAIT_MS
    ) as stream:
        event = stream.try_next()
    if event is None or event["fullDocument"]["seq"] != 1:
        sys.exit(f"expected the sentinel insert first, got {event!r}")
    return event["_id"]


# -- the two loops ----------------------------------------------------------------------- #

_calls = [0]


def handle(doc: Any) -> None:
    """The no-op handler both loops call (it only counts its calls)."""
    _calls[0] += 1


class RoundResult:
    """One timed pass over the events: events handled, handler calls, wall and consumer
    thread CPU seconds, the last token, and the server's CPU seconds meanwhile."""

    def __init__(
        self, events: int, calls: int, seconds: float, cpu_seconds: float, last: Any
    ) -> None:
        self.events = events
        self.calls = calls
        self.seconds = seconds
        self.cpu_seconds = cpu_seconds
        self.last = last
        self.server_seconds: float | None = None

    @property
    def rate(self) -> float:
        return self.events / self.seconds

    @property
    def wall_us(self) -> float:
        """Wall-clock microseconds per event."""
        return self.seconds * 1e6 / self.events

    @property
    def cpu_us(self) -> float:
        """The consumer thread's CPU microseconds per event."""
        return self.cpu_seconds * 1e6 / self.events

    @property
    def server_us(self) -> float | None:
        """The scripted server's CPU microseconds per event (None: not measurable)."""
        if self.server_seconds is None:
            return None
        return self.server_seconds * 1e6 / self.events


def runtime_round(
    store: Any,
    source_factory: Callable[[Any], Any],
    start: Mapping[str, Any],
    profiler: cProfile.Profile | None = None,
    save_interval: float = 0.0,
) -> RoundResult:
    """Run the consumer in burst mode from *start*; time ``run()``."""
    from django.utils import timezone

    from flowwarden_django.streams.runtime.threaded import StreamConsumer
    from flowwarden_django.streams.spec import CheckpointSpec, RestartPolicySpec, StreamSpec

    spec = StreamSpec(
        name=RUNTIME_STREAM,
        collection=COLL,
        database=DB,
        handlers={"insert": handle},
        checkpoint=CheckpointSpec(
            save_every_n=SAVE_EVERY_N,
            save_interval_seconds=save_interval,
            idle_heartbeat_interval_seconds=0,
        ),
        # A restart would re-read events and spoil the count: fail fast instead.
        restart_policy=RestartPolicySpec(max_attempts=1, initial_delay=0),
    )
    store.delete(RUNTIME_STREAM)
    store.save_seen(RUNTIME_STREAM, start, timezone.now())
    consumer = StreamConsumer(spec, store, source_factory)
    calls_before = _calls[0]
    began, cpu_began = time.perf_counter(), time.thread_time()
    if profiler is not None:
        profiler.enable()
    try:
        consumer.run(burst=True)
    finally:
        if profiler is not None:
            profiler.disable()
    seconds, cpu_seconds = time.perf_counter() - began, time.thread_time() - cpu_began
    if consumer.restarts or consumer.last_error is not None:
        sys.exit(f"the runtime restarted its stream: {consumer.last_error!r}")
    saved = store.find(RUNTIME_STREAM)
    last = saved.last_processed_token if saved else None
    return RoundResult(
        consumer.events_handled, _calls[0] - calls_before, seconds, cpu_seconds, last
    )


def baseline_sql() -> str:
    """The hand-written upsert of the token into the checkpoint table."""
    from flowwarden_django.models import StreamCheckpoint

    statement = pgsql.SQL(
        "INSERT INTO {table} (stream_name, last_processed_token, last_processed_at, metadata) "
        "VALUES (%s, %s, %s, %s) ON CONFLICT (stream_name) DO UPDATE SET "
        "last_processed_token = EXCLUDED.last_processed_token, "
        "last_processed_at = EXCLUDED.last_processed_at"
    ).format(table=pgsql.Identifier(StreamCheckpoint._meta.db_table))
    return statement.as_string(None)


def baseline_round(
    coll: Any, conn: psycopg.Connection[Any], sql: str, start: Mapping[str, Any]
) -> RoundResult:
    """The loop a user would write without this app; time it from ``watch()`` on."""
    handlers: dict[str, Callable[[Any], None]] = {"insert": handle}
    calls_before = _calls[0]
    count = unsaved = 0
    token: Any = None
    began, cpu_began = time.perf_counter(), time.thread_time()
    with coll.watch(resume_after=start, max_await_time_ms=MAX_AWAIT_MS) as stream:
        while True:
            event = stream.try_next()
            if event is None:  # the end of the log: an empty poll
                break
            handler = handlers.get(event["operationType"])
            if handler is not None:
                handler(event.get("fullDocument"))
            count += 1
            unsaved += 1
            token = event["_id"]
            if unsaved >= SAVE_EVERY_N:
                params = (BASELINE_STREAM, bson.encode(token), datetime.now(UTC), Jsonb({}))
                conn.execute(sql, params)
                unsaved = 0
    if unsaved:
        conn.execute(sql, (BASELINE_STREAM, bson.encode(token), datetime.now(UTC), Jsonb({})))
    seconds, cpu_seconds = time.perf_counter() - began, time.thread_time() - cpu_began
    return RoundResult(count, _calls[0] - calls_before, seconds, cpu_seconds, token)


def check(name: str, result: RoundResult, events: int, last: list[Any]) -> None:
    """Exit 1 unless the round handled exactly *events* events and ended at the same
    token as every round before it (the first round's token is kept in *last*)."""
    if result.events != events or result.calls != events:
        sys.exit(
            f"{name}: handled {result.events} events ({result.calls} handler calls), "
            f"expected {events}"
        )
    if not last:
        last.append(result.last)
    elif result.last != last[0]:
        sys.exit(f"{name}: ended at {result.last!r}, expected {last[0]!r}")


def print_profile(profiler: cProfile.Profile, events: int) -> None:
    """The runtime round's profile: the top functions by own and by cumulative time."""
    for order in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(25)
        print(f"-- cProfile of one runtime round ({events} events), by {order} --")
        print(text.getvalue())


def median_of(values: list[float | None]) -> float | None:
    """The median of *values*, or None when any is unknown."""
    if any(value is None for value in values):
        return None
    return statistics.median(value for value in values if value is not None)


def summary(runtime: list[RoundResult], baseline: list[RoundResult]) -> list[str]:
    """The closing lines: both paths' rates and CPU per event, the server's share, the
    runtime's own cost and the ratio."""
    runtime_rate = statistics.median(r.rate for r in runtime)
    baseline_rate = statistics.median(r.rate for r in baseline)
    runtime_cpu = statistics.median(r.cpu_us for r in runtime)
    baseline_cpu = statistics.median(r.cpu_us for r in baseline)
    baseline_wall = statistics.median(r.wall_us for r in baseline)
    server = median_of([r.server_us for r in runtime + baseline])
    lines = [
        f"runtime (StreamConsumer): {runtime_rate:.0f} events/s, "
        f"{runtime_cpu:.1f} us consumer-thread CPU/event",
        f"hand-written loop: {baseline_rate:.0f} events/s, "
        f"{baseline_cpu:.1f} us consumer-thread CPU/event",
    ]
    if server is None:
        lines.append("scripted server: its CPU time is not readable here (no Linux /proc)")
    else:
        share = server / baseline_wall
        verdict = (
            "the server is the bottleneck: it, not the loop, sets the baseline's pace and "
            "the wall-clock ratio hides the runtime's cost (read the CPU figures)"
            if share >= 0.5
            else "not the bottleneck"
        )
        lines.append(
            f"scripted server: {server:.1f} us CPU/event, {share:.0%} of the hand-written "
            f"loop's {baseline_wall:.1f} us wall time per event: {verdict}"
        )
    lines.append(
        f"runtime's own cost: +{runtime_cpu - baseline_cpu:.1f} us consumer-thread CPU/event "
        f"(CPU ratio hand-written / runtime: {baseline_cpu / runtime_cpu:.2f})"
    )
    lines.append(f"ratio (runtime / hand-written): {runtime_rate / baseline_rate:.2f}")
    return lines


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
    observed = [
        name
        for name, signal in (
            ("event_received", metrics.event_received),
            ("event_processed", metrics.event_processed),
        )
        if signal.has_listeners(RUNTIME_STREAM)
    ]
    print(
        f"PostgreSQL {version} at {target['host']}:{target['port']}/{target['dbname']}, "
        f"synchronous_commit={synchronous_commit}; {args.rounds} rounds x {args.events} "
        f"events per path, {args.warmup} warm-up round(s) each, save_every_n={SAVE_EVERY_N}, "
        f"runtime save_interval_seconds={args.save_interval:g}, "
        f"max_await_time_ms={MAX_AWAIT_MS}; receivers (Prometheus) of "
        f"{' and '.join(observed) if observed else 'no per-event signal'}"
        f"{' connected' if observed else ''}",
        flush=True,
    )

    proc, uri = start_scripted_server(args.events + 1)
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000)
    store = OrmCheckpointStore(using=ALIAS)
    conn = open_raw_connection()
    sql = baseline_sql()
    print(f"scripted replica set at {uri} (subprocess {proc.pid}), 1 + {args.events} inserts")

    def source_factory(spec: Any) -> PymongoChangeSource:
        return PymongoChangeSource(
            client, spec.database, spec.collection, stream_name=spec.name, max_await_ms=MAX_AWAIT_MS
        )

    def with_server_cpu(run: Callable[[], RoundResult]) -> RoundResult:
        before = process_cpu_seconds(proc.pid)
        result = run()
        after = process_cpu_seconds(proc.pid)
        if before is not None and after is not None:
            result.server_seconds = after - before
        return result

    coll = client[DB][COLL]
    runtime_results: list[RoundResult] = []
    baseline_results: list[RoundResult] = []
    try:
        start = sentinel_token(client)
        #: The token of the last event, set by the first round: every round must end there.
        last: list[Any] = []

        def run_runtime(profiler: cProfile.Profile | None = None) -> RoundResult:
            result = with_server_cpu(
                lambda: runtime_round(store, source_factory, start, profiler, args.save_interval)
            )
            check("runtime", result, args.events, last)
            return result

        def run_baseline() -> RoundResult:
            result = with_server_cpu(lambda: baseline_round(coll, conn, sql, start))
            check("hand-written loop", result, args.events, last)
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
            servers = [r.server_us for r in (runtime, baseline)]
            server = (
                ""
                if None in servers
                else f"; server {servers[0]:.1f} / {servers[1]:.1f} us CPU/event"
            )
            print(
                f"round {number}/{args.rounds}: runtime {runtime.rate:.0f}/s "
                f"({runtime.cpu_us:.1f} us CPU/event) hand-written {baseline.rate:.0f}/s "
                f"({baseline.cpu_us:.1f} us CPU/event){server}",
                flush=True,
            )
        if args.profile:
            profiler = cProfile.Profile()
            run_runtime(profiler)
            print_profile(profiler, args.events)
    finally:
        store.delete(RUNTIME_STREAM)
        store.delete(BASELINE_STREAM)
        conn.close()
        client.close()
        connections.close_all()
        stop_scripted_server(proc)

    for line in summary(runtime_results, baseline_results):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
