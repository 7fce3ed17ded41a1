"""Fifty change streams in one process: one thread per stream against one event loop.

Run from the repository root::

    .venv/bin/python bench/async_streams.py [--streams N] [--events N] [--rounds N]
                                            [--warmup N] [--sync-handlers] [--store memory|orm]

What is measured
----------------
One scripted MongoDB replica set (``flowwarden_django.testkit.scripted_mongo``, the
mockupdb-based fake the real pymongo driver talks to over loopback) runs as a
subprocess with, for each of ``--streams`` collections ``app.orders_00``,
``app.orders_01``, ..., a sentinel insert followed by ``--events`` inserts (collection
after collection). Stream ``i`` watches ``app.orders_i``; before each run its
checkpoint is set to a seen anchor at its sentinel's resume token, so the resume
cascade opens it right after the sentinel and it reads exactly its ``--events``
events, then stops at the first poll that returns nothing (burst mode). The same
process runs every stream, in one of two ways:

1. **threads**: what ``StreamManager`` does: one ``threading.Thread`` per stream, each
   running ``StreamConsumer(spec, store, source_factory).run(burst=True)`` on a
   ``PymongoChangeSource`` over one shared ``pymongo.MongoClient``; the clock stops
   when every thread has been joined.
2. **asyncio**: ``asyncio.run()`` of ``run_streams([AsyncStreamConsumer(spec, store,
   source_factory), ...], burst=True)`` on ``AsyncPymongoChangeSource`` over one shared
   ``pymongo.AsyncMongoClient``: every stream is a task of one event loop (the memory
   store's ``a...`` methods hop to the loop's default executor, sized by asyncio).

Each run is a fresh child process (the script runs itself with ``--child MODE``), so
both start from the same interpreter with nothing left over from the other. The child
imports what its mode needs, builds the client, the store and the consumers, pings
the server and resets the checkpoints (set-up), reads its resident set size (the
*baseline RSS*, ``VmRSS``), then times the consuming phase and reads, over it,

* **events/s**: every stream's events, over the wall time of the whole phase;
* **CPU s**: the process's user + system time (``getrusage(RUSAGE_SELF)``, every
  thread), and
  **CPU/event**: that over the events;
* **peak RSS**: the process's high-water mark at the end (``VmHWM`` from
  ``/proc/self/status``, else ``ru_maxrss``), and **peak - baseline**: what consuming
  added to the set-up's footprint (thread stacks, cursors, batches in flight);
* the scripted server's CPU per event (all its threads, from Linux's
  ``/proc/<pid>/task/*/schedstat``), for reference;
* asyncio only: the share of the wall time the loop's thread waited for a core while
  it could run (its run-queue delay, ``/proc/thread-self/schedstat``): what a busy
  machine costs the one loop.

The child checks that every stream handled exactly ``--events`` events (its handler's
own count and the consumer's), that no stream restarted or failed, and that each
stream's processed anchor is its collection's last event; it exits non-zero otherwise.
The modes alternate (threads first, then asyncio first, ...), after ``--warmup`` untimed
pair(s), and the medians of ``--rounds`` runs per mode are reported, each figure's median
on its own, then the ratios asyncio / threads.

Why the comparison is fair
--------------------------
Both modes read the same events from the same server, through the same change-stream
options (``max_await_time_ms``, the default batch size, the cursor comment) and one
client each with pymongo's default pool, with the same checkpoint store and the same
checkpoint policy (``save_every_n=100``, no age threshold, so no flusher thread, idle
heartbeat off), the same restart policy (one attempt: a restart would re-read events)
and the same per-event metric signals (with prometheus-client installed the app
connects its receivers, in both modes; the first line says so). The handler is a no-op
that counts its calls: a plain ``def`` for threads, an ``async def`` for asyncio (which
the async consumer awaits in the loop); ``--sync-handlers`` gives asyncio the plain
``def`` too, which it runs through ``sync_to_async(thread_sensitive=True)``, i.e. on
the stream's own thread (its ``ThreadSensitiveContext``), as an ORM-using handler
would: one thread hop per event. The set-up (imports, client,
consumers) is outside the timed phase and its memory is the baseline; the peak
includes it, so both are printed.

What the server does to the figures
-----------------------------------
The scripted server answers each connection on a thread of its own, outside
mockupdb's server-wide lock, so an idle ``getMore`` (each stream's last, empty poll
waits ``--idle-wait`` seconds: 5 ms here, 20 ms by default in the testkit) holds up
no other stream; its threads share one interpreter, though. When the server's CPU per
event approaches the wall time per event, the server sets the pace and events/s says
little about either client: read CPU/event and the memory figures then. The last line
says which is the case. On a busy machine events/s favours threads: the asyncio
process is one thread waiting for a core where the threaded one has 50; compare
CPU/event then, and the load averages printed first and last.

``--store orm`` keeps the checkpoints in PostgreSQL through the ORM
(``OrmCheckpointStore``) instead of in memory: threads then hold one database
connection each, and so does each asyncio stream (on its thread-sensitive thread).
PostgreSQL as in
``bench/stream_throughput.py`` (``FLOWWARDEN_BENCH_PG_*``); the rows are deleted at the
end. ``FLOWWARDEN_BENCH_PROFILE=/tmp/profile-%s`` writes each child's cProfile
(``%s``: the mode) for ``pstats``.
"""

from __future__ import annotations

import argparse
import cProfile
import glob
import json
import os
import resource
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _args import positive_int  # noqa: E402  (after the path set-up)
from _postgres import ALIAS, configure_django, ensure_database, pg_target  # noqa: E402

DB = "app"
STREAM_PREFIX = "bench.async_streams."
SAVE_EVERY_N = 100
#: ``max_await_time_ms`` of every cursor, in both modes.
MAX_AWAIT_MS = 100
MODES = ("threads", "asyncio")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options (``--serve`` and ``--child`` are internal)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=positive_int, default=50, help="streams (collections)")
    parser.add_argument("--events", type=positive_int, default=500, help="events per stream")
    parser.add_argument("--rounds", type=positive_int, default=3, help="timed runs per mode")
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed runs per mode first (0: none)"
    )
    parser.add_argument(
        "--sync-handlers",
        action="store_true",
        help="asyncio mode runs the plain def handler too (through sync_to_async)",
    )
    parser.add_argument(
        "--store", choices=("memory", "orm"), default="memory", help="checkpoint store"
    )
    parser.add_argument(
        "--idle-wait",
        type=float,
        default=0.005,
        help="longest wait of the scripted server's idle getMore (s)",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--setup", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def collection_name(index: int) -> str:
    return f"orders_{index:02d}"


def stream_name(index: int) -> str:
    return f"{STREAM_PREFIX}{collection_name(index)}"


# -- the scripted replica set (its own process) ----------------------------------------- #


def serve(args: argparse.Namespace) -> int:
    """The server process: log the events, print ``READY <uri>`` and the tokens (one JSON
    line), serve until SIGTERM."""
    from flowwarden_django.testkit.scripted_mongo import ScriptedReplicaSet

    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stopping.set())
    with ScriptedReplicaSet(idle_wait=args.idle_wait) as server:
        starts, lasts = [], []
        for index in range(args.streams):
            docs = ({"_id": n, "seq": n} for n in range(args.events + 1))  # 0: the sentinel
            tokens = server.insert_many(DB, collection_name(index), docs)
            starts.append(tokens[0])
            lasts.append(tokens[-1])
        print(f"READY {server.uri}", flush=True)
        print(json.dumps({"start": starts, "last": lasts}), flush=True)
        while not stopping.wait(0.1):
            pass
    return 0


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str, dict[str, Any]]:
    """Start the server process; return it, its URI and its tokens."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--serve",
        "--streams",
        str(args.streams),
        "--events",
        str(args.events),
        "--idle-wait",
        str(args.idle_wait),
    ]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        ready = selector.select(120)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("READY "):
        stop_server(proc)
        sys.exit(f"the scripted replica set did not start (said {line!r})")
    tokens = json.loads(proc.stdout.readline())
    return proc, line.split()[1], tokens


def stop_server(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the server process and wait for it (SIGKILL if it hangs)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def thread_wait_seconds() -> float | None:
    """How long the calling thread has waited for a core while runnable (its run-queue
    delay, ``/proc/thread-self/schedstat``, Linux), else None."""
    try:
        with open("/proc/thread-self/schedstat") as stats:
            return int(stats.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def process_cpu_seconds(pid: int) -> float | None:
    """CPU time used so far by every live thread of process *pid* (Linux), else None."""
    total, seen = 0, False
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as stats:
                total += int(stats.read().split()[0])
                seen = True
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return total / 1e9 if seen else None


# -- a child: one mode, measured ----------------------------------------------------------- #


def status_kib(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``), else None."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def current_rss_mib() -> float:
    kib = status_kib("VmRSS")
    return kib / 1024 if kib is not None else peak_rss_mib()


def peak_rss_mib() -> float:
    kib = status_kib("VmHWM")
    if kib is None:
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kib / 1024


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def setup_django(store: str) -> None:
    """Django for the runtime: PostgreSQL for ``--store orm``, else no database."""
    if store == "orm":
        configure_django(pg_target())
        return
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "flowwarden_django"],
        DATABASES={},
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()


def make_store(kind: str) -> Any:
    if kind == "orm":
        from flowwarden_django.streams.backends.orm import OrmCheckpointStore

        return OrmCheckpointStore(using=ALIAS)
    from flowwarden_django.streams.backends.memory import InMemoryCheckpointStore

    return InMemoryCheckpointStore()


def make_spec(index: int, handler: Callable[..., Any]) -> Any:
    from flowwarden_django.streams.spec import CheckpointSpec, RestartPolicySpec, StreamSpec

    return StreamSpec(
        name=stream_name(index),
        collection=collection_name(index),
        database=DB,
        handlers={"insert": handler},
        checkpoint=CheckpointSpec(
            save_every_n=SAVE_EVERY_N, save_interval_seconds=0, idle_heartbeat_interval_seconds=0
        ),
        # A restart would re-read events and spoil the count: fail fast instead.
        restart_policy=RestartPolicySpec(max_attempts=1, initial_delay=0),
    )


def counting_handler(calls: list[int], index: int, *, asynchronous: bool) -> Callable[..., Any]:
    """The no-op handler of stream *index*: it only counts its calls in ``calls[index]``."""
    if asynchronous:

        async def handle_async(doc: Any) -> None:
            calls[index] += 1

        return handle_async

    def handle(doc: Any) -> None:
        calls[index] += 1

    return handle


def reset_checkpoints(store: Any, starts: list[Mapping[str, Any]]) -> None:
    """Each stream's checkpoint: a seen anchor at its sentinel (nothing processed)."""
    from django.utils import timezone

    for index, start in enumerate(starts):
        store.delete(stream_name(index))
        store.save_seen(stream_name(index), start, timezone.now())


class Phase:
    """The timed consuming phase: wall clock, process CPU, RSS before, server CPU."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid

    def __enter__(self) -> Phase:
        self.baseline_rss = current_rss_mib()
        self.server_before = process_cpu_seconds(self.server_pid)
        self.wait_before = thread_wait_seconds()
        self.cpu_before = cpu_seconds()
        self.began = time.perf_counter()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.seconds = time.perf_counter() - self.began
        self.cpu = cpu_seconds() - self.cpu_before
        waited = thread_wait_seconds()
        self.waited = (
            None if waited is None or self.wait_before is None else waited - self.wait_before
        )
        after = process_cpu_seconds(self.server_pid)
        self.server_cpu = (
            None if after is None or self.server_before is None else after - self.server_before
        )
        self.peak_rss = peak_rss_mib()


def run_threads(setup: dict[str, Any], store: Any, calls: list[int]) -> tuple[Phase, list[Any]]:
    """Every stream on its own thread, as ``StreamManager`` runs them."""
    import pymongo

    from flowwarden_django.streams.runtime.threaded import StreamConsumer
    from flowwarden_django.streams.source import PymongoChangeSource

    client: pymongo.MongoClient[Any] = pymongo.MongoClient(
        setup["uri"], serverSelectionTimeoutMS=5000
    )

    def source_factory(spec: Any) -> PymongoChangeSource:
        return PymongoChangeSource(
            client, spec.database, spec.collection, stream_name=spec.name, max_await_ms=MAX_AWAIT_MS
        )

    consumers = [
        StreamConsumer(
            make_spec(i, counting_handler(calls, i, asynchronous=False)), store, source_factory
        )
        for i in range(setup["streams"])
    ]
    failures: list[BaseException] = []

    def run(consumer: StreamConsumer) -> None:
        try:
            consumer.run(burst=True)
        except BaseException as exc:
            failures.append(exc)

    threads = [
        threading.Thread(target=run, args=(c,), name=f"fw-stream-{c.spec.name}") for c in consumers
    ]
    reset_checkpoints(store, setup["start"])
    client.admin.command("ping")
    try:
        with Phase(setup["server_pid"]) as phase:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        client.close()
    if failures:
        sys.exit(f"threads: a stream failed: {failures[0]!r}")
    return phase, consumers


def run_asyncio(
    setup: dict[str, Any], store: Any, calls: list[int], *, sync_handlers: bool
) -> tuple[Phase, list[Any]]:
    """Every stream as a task of one event loop (``run_streams``)."""
    import asyncio

    import pymongo

    from flowwarden_django.streams.async_source import AsyncPymongoChangeSource
    from flowwarden_django.streams.runtime.event_loop import AsyncStreamConsumer, run_streams

    async def main() -> tuple[Phase, list[AsyncStreamConsumer]]:
        client: pymongo.AsyncMongoClient[Any] = pymongo.AsyncMongoClient(
            setup["uri"], serverSelectionTimeoutMS=5000
        )

        def source_factory(spec: Any) -> AsyncPymongoChangeSource:
            return AsyncPymongoChangeSource(
                client,
                spec.database,
                spec.collection,
                stream_name=spec.name,
                max_await_ms=MAX_AWAIT_MS,
            )

        consumers = [
            AsyncStreamConsumer(
                make_spec(i, counting_handler(calls, i, asynchronous=not sync_handlers)),
                store,
                source_factory,
            )
            for i in range(setup["streams"])
        ]
        await client.admin.command("ping")
        try:
            with Phase(setup["server_pid"]) as phase:
                await run_streams(consumers, burst=True)
        finally:
            await client.close()
        return phase, consumers

    reset_checkpoints(store, setup["start"])  # before the loop: the ORM store is sync
    return asyncio.run(main())


def verify(
    mode: str, consumers: list[Any], calls: list[int], store: Any, setup: dict[str, Any]
) -> None:
    """Exit 1 unless every stream handled exactly its events and ended at its last one."""
    from flowwarden_django.streams.tokens import tokens_equal

    events = setup["events"]
    for index, consumer in enumerate(consumers):
        name = consumer.spec.name
        if consumer.events_handled != events or calls[index] != events:
            sys.exit(
                f"{mode}: stream {name} handled {consumer.events_handled} events "
                f"({calls[index]} handler calls), expected {events}"
            )
        if consumer.restarts or consumer.last_error is not None:
            sys.exit(f"{mode}: stream {name} restarted: {consumer.last_error!r}")
        saved = store.find(name)
        last = saved.last_processed_token if saved is not None else None
        if not tokens_equal(last, setup["last"][index]):
            sys.exit(f"{mode}: stream {name} ended at {last!r}, expected {setup['last'][index]!r}")


def receivers_connected() -> list[str]:
    """The per-event metric signals with receivers (the Prometheus ones, when installed)."""
    from flowwarden_django.streams import metrics

    signals = (
        ("event_received", metrics.event_received),
        ("event_processed", metrics.event_processed),
    )
    return [name for name, signal_ in signals if signal_.has_listeners(stream_name(0))]


def child(args: argparse.Namespace) -> int:
    """Run every stream in mode ``args.child``; print one ``RESULT`` JSON line."""
    assert args.setup is not None
    setup = json.loads(Path(args.setup).read_text())
    setup_django(setup["store"])
    store = make_store(setup["store"])
    calls = [0] * setup["streams"]
    profile_path = os.environ.get("FLOWWARDEN_BENCH_PROFILE")  # e.g. /tmp/profile-%s
    profiler = cProfile.Profile() if profile_path else None
    if profiler is not None:
        profiler.enable()
    if args.child == "threads":
        phase, consumers = run_threads(setup, store, calls)
    else:
        phase, consumers = run_asyncio(setup, store, calls, sync_handlers=setup["sync_handlers"])
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile_path.replace("%s", args.child))
    verify(args.child, consumers, calls, store, setup)
    total = setup["streams"] * setup["events"]
    result = {
        "mode": args.child,
        "events": total,
        "seconds": phase.seconds,
        "rate": total / phase.seconds,
        "cpu": phase.cpu,
        "cpu_us": phase.cpu * 1e6 / total,
        "baseline_rss": phase.baseline_rss,
        "peak_rss": phase.peak_rss,
        "delta_rss": phase.peak_rss - phase.baseline_rss,
        "server_us": None if phase.server_cpu is None else phase.server_cpu * 1e6 / total,
        # asyncio: the loop's thread (the threads' main thread only joins them).
        "loop_wait": phase.waited / phase.seconds
        if args.child == "asyncio" and phase.waited is not None
        else None,
        "receivers": receivers_connected(),
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0


# -- the parent: rounds, medians, ratios -------------------------------------------------- #

#: (key, label, format) of the figures in the table, in order.
FIGURES = (
    ("rate", "events/s", "{:.0f}"),
    ("peak_rss", "peak RSS MiB", "{:.1f}"),
    ("baseline_rss", "baseline RSS MiB", "{:.1f}"),
    ("delta_rss", "peak-baseline MiB", "{:.1f}"),
    ("cpu", "CPU s", "{:.2f}"),
    ("cpu_us", "CPU us/event", "{:.1f}"),
)


def run_child(mode: str, setup_path: str) -> dict[str, Any]:
    """One fresh process running *mode*; its RESULT."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", mode]
    command += ["--setup", setup_path]
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        sys.exit(f"the {mode} child failed (exit {done.returncode}): {done.stdout[-2000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as load:
            return " ".join(load.read().split()[:3])
    except OSError:
        return "unknown"


def round_line(label: str, results: dict[str, dict[str, Any]]) -> str:
    parts = []
    for mode in MODES:
        r = results[mode]
        parts.append(
            f"{mode} {r['rate']:.0f}/s, {r['cpu_us']:.1f} us CPU/event, "
            f"peak {r['peak_rss']:.1f} MiB (+{r['delta_rss']:.1f})"
        )
    return f"{label}: " + "; ".join(parts)


def median(results: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in results]
    if any(value is None for value in values):
        return None
    return statistics.median(values)


def summary(runs: dict[str, list[dict[str, Any]]], handler_note: str) -> list[str]:
    """The table of medians, the ratios and the server's share."""
    medians = {mode: {key: median(runs[mode], key) for key, _, _ in FIGURES} for mode in MODES}
    width = max(len(label) for _, label, _ in FIGURES)
    lines = [f"medians of {len(runs['threads'])} runs per mode ({handler_note}):"]
    lines.append(f"  {'':{width}}  {'threads':>10}  {'asyncio':>10}  {'asyncio/threads':>15}")
    for key, label, fmt in FIGURES:
        threads, asyncio_ = medians["threads"][key], medians["asyncio"][key]
        ratio = f"{asyncio_ / threads:.2f}" if threads else "-"
        lines.append(
            f"  {label:{width}}  {fmt.format(threads):>10}  {fmt.format(asyncio_):>10}  {ratio:>15}"
        )
    for mode in MODES:
        server = median(runs[mode], "server_us")
        rate = medians[mode]["rate"]
        if server is None or not rate:
            lines.append(f"scripted server ({mode}): its CPU time is not readable here")
            continue
        wall_us = 1e6 / rate
        share = server / wall_us
        verdict = (
            "the server sets the pace (read CPU/event and memory)"
            if share >= 0.5
            else "not the bottleneck"
        )
        lines.append(
            f"scripted server ({mode}): {server:.1f} us CPU/event, {share:.0%} of the "
            f"{wall_us:.1f} us wall time per event: {verdict}"
        )
    loop_wait = median(runs["asyncio"], "loop_wait")
    if loop_wait is not None:
        lines.append(
            f"asyncio: the loop's thread waited for a core {loop_wait:.0%} of the wall time "
            "(run-queue delay; a busy machine slows the one loop more than 50 threads)"
        )
    return lines


def prepare_orm() -> None:
    """Create the benchmark database and the app's tables (``--store orm``)."""
    target = pg_target()
    ensure_database(target)
    configure_django(target)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def delete_orm_rows(streams: int) -> None:
    from flowwarden_django.streams.backends.orm import OrmCheckpointStore

    store = OrmCheckpointStore(using=ALIAS)
    for index in range(streams):
        store.delete(stream_name(index))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, internally, the server or a child) and print its results."""
    args = parse_args(argv)
    if args.serve:
        return serve(args)
    if args.child:
        return child(args)
    if args.store == "orm":
        prepare_orm()
    handler_note = (
        "plain def handlers in both modes (asyncio: through sync_to_async)"
        if args.sync_handlers
        else "threads: plain def handler, asyncio: async def handler"
    )
    print(
        f"{args.streams} streams x {args.events} events, {args.rounds} round(s) per mode after "
        f"{args.warmup} warm-up pair(s); store {args.store}, save_every_n={SAVE_EVERY_N}, "
        f"max_await_time_ms={MAX_AWAIT_MS}, server idle wait {args.idle_wait * 1000:.0f} ms; "
        f"{handler_note}; load average {loadavg()}",
        flush=True,
    )
    proc, uri, tokens = start_server(args)
    print(f"scripted replica set at {uri} (subprocess {proc.pid})", flush=True)
    setup = {
        "uri": uri,
        "server_pid": proc.pid,
        "streams": args.streams,
        "events": args.events,
        "store": args.store,
        "sync_handlers": args.sync_handlers,
        **tokens,
    }
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        setup_path = os.path.join(tmp, "setup.json")
        Path(setup_path).write_text(json.dumps(setup))
        try:
            for number in range(1, args.warmup + args.rounds + 1):
                # Alternate which mode goes first, so neither always follows the other.
                order = MODES if number % 2 else MODES[::-1]
                results = {mode: run_child(mode, setup_path) for mode in order}
                if number == 1:
                    observed = results["threads"]["receivers"]
                    print(
                        "per-event metric receivers (Prometheus) of "
                        + (" and ".join(observed) + " connected" if observed else "no signal"),
                        flush=True,
                    )
                warm = number <= args.warmup
                label = f"warm-up {number}" if warm else f"round {number - args.warmup}"
                print(round_line(label, results), flush=True)
                if not warm:
                    for mode in MODES:
                        runs[mode].append(results[mode])
        finally:
            stop_server(proc)
            if args.store == "orm":
                delete_orm_rows(args.streams)
    for line in summary(runs, handler_note):
        print(line)
    print(f"load average at the end: {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
