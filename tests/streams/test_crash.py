"""Crash test: a stream consumer in its own process, killed with SIGKILL and restarted.

The scripted MongoDB server (``tests/crash/server.py``) runs in one subprocess, the
consumer (``manage.py flowwarden_streams run --<runner> --stream crash-orders`` with
``DJANGO_SETTINGS_MODULE=tests.crash.settings``) in another. Its handler writes one
``Effect`` row per delivered insert into the PostgreSQL test database, where the ORM
checkpoint store keeps the stream's anchors too. Everything is checked from that data.

**Feeding.** The server starts with an empty log; the consumer's first run really
bootstraps (the cascade's first level persists the position before any event), and
only then does the test send SIGUSR1 so the server logs the 20,000 inserts
``{_id: n, seq: n}``. That is a deployed stream receiving new orders. (The stock CLI
``flowwarden_django.testkit.scripted_mongo --events N`` logs its events before the
consumer can bootstrap, so a first start would begin after all of them.)

**Kills.** Ten times: wait until the consumer has handled a random 200-1800 events past
the previous kill's high-water mark (so each kill lands while events are flowing, in
a new stretch of the log), sleep a random 0-20 ms so the kill falls at a random phase
of the handler / anchor-write cycle, SIGKILL, then restart. After the tenth restart the
consumer runs until order 20,000 has a row and is stopped with SIGTERM (graceful: it
must exit 0 and its last anchor must be event 20,000).

**Counting re-deliveries.** Right after each kill, once PostgreSQL shows none of the dead
consumer's sessions (an in-flight COMMIT is then settled one way or the other), the
test snapshots ``H`` = the highest order id with a row, ``A`` = the order id of the
persisted processed anchor (its token decoded to a log position, mapped to the event
there; 0 before the first anchor write) and the highest ``Effect.id`` so far. Row ids
come from a sequence and one consumer writes at a time, in log order, so these ids cut
the rows into generations, one per consumer run. The test then requires each
generation's order ids to be exactly ``A(previous kill) + 1 ... H(its kill)``, in
order: nothing skipped, nothing delivered twice within a run, and the restart resumed
exactly after the persisted anchor. So the re-deliveries a kill caused are the rows of
the next generation with order id <= ``H``, which is ``H - A``; both are computed and
must agree, and their sum must equal the duplicate rows in the table.

``parallel`` (``parallelism=8``, the orders keyed by ``seq % 16``, ``save_every_n=50``,
the default window of 32): each run's rows are checked per key instead: the key's
orders right after the anchor, in order, each once; nothing behind the anchor
unhandled at a kill; and each kill's re-deliveries (the orders past the anchor that
had a row) at most window + ``save_every_n`` = 82, and delivered again exactly once.

Modes: ``count`` (``save_every_n=50``, ``save_interval_seconds=0``, non-transactional:
at most 50 re-deliveries per kill, 50 when a kill lands between the 50th row's commit
and the anchor write) and ``transactional`` (row and anchor in one transaction: ``A == H`` after
every kill and no order id has two rows; the event in hand at a kill is delivered again
too, but its first attempt rolled back, so the data counts no re-delivery).

**Runners.** ``count`` and ``parallel`` run on both runners, with the same checks: ``threads``
(``--threads``: the stream on a thread of its own, the sync pymongo driver) and
``asyncio`` (``--asyncio``: the stream a task on the event loop of
:class:`~flowwarden_django.streams.runtime.async_manager.AsyncStreamManager`, reading through
pymongo's ``AsyncMongoClient``, its own anchor policy; the sync handler runs on the
stream's own thread). ``transactional`` runs on threads: on asyncio a transactional
attempt is the threaded runtime's own code on the stream's thread, and the
initial-sync crash test and the chaos tests exercise it there. Test ids:
``[count-threads]``, ``[count-asyncio]``, ``[transactional-threads]``.

``FLOWWARDEN_CRASH_SEED`` replays the kill points (not the timing). The counts are
printed even without ``-s`` and recorded as JUnit properties.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pymongo", reason="the crash test needs pymongo")
pytest.importorskip("mockupdb", reason="the scripted MongoDB server needs mockupdb==1.8.1")

from django.db import connections
from django.db.models import Count, Max

from flowwarden_django.models import StreamSettledEvent
from flowwarden_django.streams.backends.orm import OrmCheckpointStore
from flowwarden_django.testkit._scripted_events import parse_token
from tests.crash import parallel_mode
from tests.support.lanes import on_lane
from tests.support.story_procs import die_with_parent
from tests.testapp.models import Effect

ROOT = Path(__file__).resolve().parents[2]
STREAM = "crash-orders"
EVENTS = 12_000
#: The consumer's runners: ``flowwarden_streams run --threads`` / ``--asyncio``.
RUNNERS = ("threads", "asyncio")
KILLS = 10
SAVE_EVERY_N = 50
#: Events a consumer run handles past the previous high-water mark before its kill.
KILL_GAP = (200, 1000)
#: ``parallel`` mode: the window of the stream (the default, 4 per handler slot).
PARALLEL_WINDOW = parallel_mode.WINDOW
#: Random delay between reaching the kill point and the SIGKILL.
KILL_JITTER_SECONDS = 0.02
APPLICATION_NAME = "fw-crash-consumer"  # tests/crash/settings.py sets it on the connection
#: Upper bounds of the waits: a hang fails the test instead of blocking CI.
START_TIMEOUT = 60.0
PROGRESS_TIMEOUT = 90.0
CATCH_UP_TIMEOUT = 180.0
STOP_TIMEOUT = 30.0

Position = tuple[int, int]


@dataclass(frozen=True)
class Kill:
    """What the data said right after one SIGKILL."""

    number: int
    high_water: int  # H: the highest order id with an Effect row
    anchor: int  # A: the order id of the persisted processed anchor (0: none yet)
    last_row_id: int  # the highest Effect.id: the end of this consumer run's rows
    at_seconds: float  # since the events were fed

    @property
    def redeliveries(self) -> int:
        """Events handled but past the anchor: the next run delivers them again."""
        return self.high_water - self.anchor


# -- processes ------------------------------------------------------------------------ #


def _read_line(proc: subprocess.Popen[str], timeout: float, what: str) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            raise AssertionError(f"no {what} from the scripted server within {timeout:.0f} s")
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"the scripted server exited (code {proc.wait()}) before {what}")
    return line.strip()


def _stop(proc: subprocess.Popen[Any] | None) -> None:
    """SIGKILL *proc* if it is still running, and reap it."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):  # else a zombie the kernel reaps
        proc.wait(timeout=10)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


class Consumer:
    """The consumer subprocesses, one at a time, all logging to one file.

    Each is ``manage.py flowwarden_streams run --<runner> --stream <stream>``: *runner*
    is ``"threads"`` (a thread per stream) or ``"asyncio"`` (every stream a task on one
    event loop, through pymongo's async driver).
    """

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path,
        *,
        runner: str = "threads",
        stream: str = STREAM,
    ) -> None:
        assert runner in RUNNERS, runner
        self.env = env
        self.log_path = log_path
        self.runner = runner
        self.stream = stream
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def command(self) -> list[str]:
        """The consumer's command line."""
        return [
            sys.executable,
            "manage.py",
            "flowwarden_streams",
            "run",
            f"--{self.runner}",
            "--stream",
            self.stream,
        ]

    def start(self) -> None:
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"\n===== consumer start {self.starts} =====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command(),
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C of pytest must not reach it first
                preexec_fn=die_with_parent,
            )

    def assert_alive(self) -> None:
        assert self.proc is not None
        code = self.proc.poll()
        if code is not None:
            raise AssertionError(
                f"the consumer exited on its own (code {code}):\n{self.log_tail()}"
            )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def terminate(self) -> int:
        """SIGTERM (graceful stop) and the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the consumer did not stop within {STOP_TIMEOUT:.0f} s of SIGTERM:\n"
                + self.log_tail()
            ) from None

    def close(self) -> None:
        _stop(self.proc)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no consumer log)"
        return "\n".join(text.splitlines()[-lines:])


def _wait_until(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    consumer: Consumer,
    server: subprocess.Popen[str],
) -> None:
    """Poll *condition* every few ms; fail if a subprocess dies or *timeout* passes."""
    deadline = time.monotonic() + timeout
    while not condition():
        consumer.assert_alive()
        if server.poll() is not None:
            raise AssertionError(f"the scripted server exited (code {server.returncode})")
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for {what}:\n{consumer.log_tail()}"
            )
        time.sleep(0.005)


# -- the data ------------------------------------------------------------------------- #


def _high_water() -> int:
    return Effect.objects.using("postgres").aggregate(h=Max("order_id"))["h"] or 0


def _all_handled() -> bool:
    """Whether every fed order has a row."""
    handled = Effect.objects.using("postgres").values("order_id").distinct().count()
    return handled >= EVENTS


def _last_row_id() -> int:
    return Effect.objects.using("postgres").aggregate(m=Max("id"))["m"] or 0


def _consumer_sessions(db_name: str) -> int:
    with connections["postgres"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
            [db_name, APPLICATION_NAME],
        )
        return cursor.fetchone()[0]


def _wait_sessions_gone(db_name: str) -> None:
    """Wait until PostgreSQL has ended every session of the killed consumer."""
    deadline = time.monotonic() + 20
    while _consumer_sessions(db_name):
        if time.monotonic() > deadline:
            raise AssertionError("the killed consumer's PostgreSQL sessions did not go away")
        time.sleep(0.005)


class EventPositions:
    """Maps the fed events' log positions to order ids.

    The server logs the inserts in one go, so event *n* sits at position
    ``(seconds, first_inc + n - 1)``; ``FED`` gave the tokens of events 1 and *EVENTS*.
    """

    def __init__(self, first_token: str, last_token: str) -> None:
        self.first = parse_token({"_data": first_token})[0]
        last = parse_token({"_data": last_token})[0]
        assert last == (self.first[0], self.first[1] + EVENTS - 1), (
            f"the fed events do not have consecutive positions: {self.first} .. {last}"
        )

    def order_id(self, token: dict[str, Any] | None) -> int:
        """The order id of the event whose token is *token*; 0 for ``None``."""
        if token is None:
            return 0
        position, invalidate = parse_token(token)
        order = position[1] - self.first[1] + 1
        assert not invalidate and position[0] == self.first[0] and 1 <= order <= EVENTS, (
            f"the processed anchor {token} is not the position of a fed event"
        )
        return order


def _anchor(store: OrmCheckpointStore, positions: EventPositions) -> int:
    saved = store.find(STREAM)
    return positions.order_id(saved.last_processed_token if saved else None)


# -- the test ------------------------------------------------------------------------- #


@pytest.mark.slow
# "default" too: Django makes every other alias's test database depend on it, and
# pytest-django refuses to set up "postgres" alone ("Circular dependency in
# TEST[DEPENDENCIES]") when no selected test uses "default".
@on_lane("postgres", databases=["default", "postgres"])
@pytest.mark.parametrize(
    ("mode", "runner"),
    # asyncio in count mode: its own anchor policy under SIGKILL (a transactional
    # attempt runs the threaded runtime's code on the stream's thread; that mode is
    # killed on asyncio by the initial-sync crash test and the chaos tests).
    [
        ("count", "threads"),
        ("count", "asyncio"),
        ("transactional", "threads"),
        ("parallel", "threads"),
        ("parallel", "asyncio"),
        ("parallel-transactional", "threads"),
        ("parallel-transactional", "asyncio"),
    ],
)
def test_consumer_survives_sigkill(mode, runner, tmp_path, capsys, record_property):
    """Ten SIGKILLs: every event handled, <= N re-deliveries per kill, or exactly once."""
    seed = int(os.environ.get("FLOWWARDEN_CRASH_SEED") or random.randrange(2**32))
    rng = random.Random(seed)  # kill points; the timing itself is never reproducible
    record_property("seed", seed)
    record_property("runner", runner)
    db = connections["postgres"].settings_dict
    store = OrmCheckpointStore(using="postgres")
    assert not Effect.objects.using("postgres").exists()
    assert store.find(STREAM) is None

    server: subprocess.Popen[str] | None = None
    consumer: Consumer | None = None
    started = time.monotonic()
    server_log = (tmp_path / "server.log").open("w")
    try:
        server = subprocess.Popen(
            [sys.executable, "-m", "tests.crash.server", "--events", str(EVENTS)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=server_log,
            text=True,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        ready = _read_line(server, START_TIMEOUT, "READY line")
        assert ready.startswith("READY mongodb://"), ready
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "tests.crash.settings",
            "FLOWWARDEN_CRASH_MONGO_URL": ready.split()[1],
            "FLOWWARDEN_CRASH_DB_NAME": db["NAME"],
            "FLOWWARDEN_CRASH_DB_HOST": str(db["HOST"]),
            "FLOWWARDEN_CRASH_DB_PORT": str(db["PORT"]),
            "FLOWWARDEN_CRASH_DB_USER": str(db["USER"]),
            "FLOWWARDEN_CRASH_DB_PASSWORD": str(db["PASSWORD"]),
            "FLOWWARDEN_CRASH_MODE": mode,
            "FLOWWARDEN_CRASH_SAVE_EVERY_N": str(SAVE_EVERY_N),
        }
        consumer = Consumer(env, tmp_path / f"consumer-{mode}-{runner}.log", runner=runner)

        # The first run bootstraps on the empty log and persists its position...
        consumer.start()
        _wait_until(
            lambda: store.find(STREAM) is not None,
            START_TIMEOUT,
            "the first run to persist its bootstrap position",
            consumer,
            server,
        )
        saved = store.find(STREAM)
        assert saved.last_seen_token is not None and saved.last_processed_token is None
        # ... then the orders arrive.
        server.send_signal(signal.SIGUSR1)
        fed = _read_line(server, START_TIMEOUT, "FED line").split()
        assert fed[0] == "FED", fed
        positions = EventPositions(fed[1], fed[2])
        fed_at = time.monotonic()

        kills: list[Kill] = []
        #: parallel-transactional: settled marks found after each kill (what the
        #: restart skips, with the marks the anchor had passed but not yet deleted).
        marks: list[int] = []
        high_water = 0
        for number in range(1, KILLS + 1):
            target = high_water + rng.randint(*KILL_GAP)
            _wait_until(
                lambda target=target: _high_water() >= target,
                PROGRESS_TIMEOUT,
                f"order {target} before kill {number}",
                consumer,
                server,
            )
            # Proves the filter of _wait_sessions_gone sees this consumer's session.
            assert _consumer_sessions(db["NAME"]) >= 1, "the consumer has no visible session"
            time.sleep(rng.uniform(0, KILL_JITTER_SECONDS))
            consumer.kill()
            _wait_sessions_gone(db["NAME"])
            kill = Kill(
                number=number,
                high_water=_high_water(),
                anchor=_anchor(store, positions),
                last_row_id=_last_row_id(),
                at_seconds=time.monotonic() - fed_at,
            )
            kills.append(kill)
            if mode == "parallel-transactional":
                marks.append(
                    StreamSettledEvent.objects.using("postgres").filter(stream_name=STREAM).count()
                )
            assert high_water < kill.high_water < EVENTS, (
                f"kill {number} did not land while events were flowing: {kill}"
            )
            assert kill.anchor <= kill.high_water, (
                f"kill {number}: the anchor is ahead of the handled events (they would be "
                f"lost): {kill}"
            )
            high_water = kill.high_water
            consumer.start()

        # In parallel modes the last order may be handled before earlier ones of other
        # keys: wait for every order, not for the last one.
        caught_up = _all_handled if mode.startswith("parallel") else lambda: _high_water() >= EVENTS
        _wait_until(
            caught_up,
            CATCH_UP_TIMEOUT,
            f"order {EVENTS} after the last restart",
            consumer,
            server,
        )
        assert consumer.terminate() == 0, consumer.log_tail()
        final_anchor = _anchor(store, positions)
        duration = time.monotonic() - started
    finally:
        if consumer is not None:
            consumer.close()
        if server is not None:
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    server.wait(timeout=10)
            _stop(server)
        server_log.close()

    server_errors = (tmp_path / "server.log").read_text(errors="replace")
    assert "INTERNAL ERROR" not in server_errors, server_errors

    # -- checks, from the data ----------------------------------------------------------
    rows = list(
        Effect.objects.using("postgres").order_by("id").values_list("id", "order_id", "stream")
    )
    handled = {order for _, order, _ in rows}
    missing = sorted(set(range(1, EVENTS + 1)) - handled)
    assert not missing, f"{len(missing)} events never handled, e.g. {missing[:10]}"
    assert handled == set(range(1, EVENTS + 1)), "rows for orders that were never fed"
    assert final_anchor == EVENTS, f"graceful stop left the anchor at order {final_anchor}"

    if mode == "parallel":
        per_kill = _parallel_redeliveries(rows, kills)
    elif mode == "parallel-transactional":
        per_kill = _parallel_exactly_once(rows, kills)
        assert sum(marks) > 0, "no kill left a settled mark: the restart's skip went untested"
        assert not StreamSettledEvent.objects.using("postgres").filter(stream_name=STREAM), (
            "settled marks left after the graceful stop"
        )
    else:
        per_kill = _serial_redeliveries(rows, kills)

    duplicates = len(rows) - len(handled)
    total = sum(per_kill)
    assert duplicates == total, f"{duplicates} duplicate rows, {total} re-deliveries after kills"
    worst = max(per_kill)
    if mode == "count":
        assert worst <= SAVE_EVERY_N, (
            f"a kill caused {worst} re-deliveries, more than save_every_n={SAVE_EVERY_N}: "
            f"{per_kill}"
        )
    elif mode == "parallel":
        bound = PARALLEL_WINDOW + SAVE_EVERY_N
        assert worst <= bound, (
            f"a kill caused {worst} re-deliveries, more than the window ({PARALLEL_WINDOW}) "
            f"+ save_every_n ({SAVE_EVERY_N}): {per_kill}"
        )
    else:  # transactional: no effect twice
        doubled = (
            Effect.objects.using("postgres")
            .values("order_id")
            .annotate(n=Count("id"))
            .filter(n__gt=1)
            .count()
        )
        assert duplicates == doubled == 0, f"{doubled} events have their effect more than once"

    counts = {
        "mode": mode,
        "runner": runner,
        "events": EVENTS,
        "kills": len(kills),
        "consumer_starts": consumer.starts,
        "rows": len(rows),
        "redeliveries": total,
        "max_redeliveries_per_kill": worst,
        "save_every_n": SAVE_EVERY_N if mode.startswith(("count", "parallel")) else 1,
        "duplicates": duplicates,
        "seconds": round(duration, 1),
    }
    for key, value in counts.items():
        record_property(key, value)
    with capsys.disabled():
        print(
            f"\ncrash test [{mode}-{runner}]: events={EVENTS} kills={len(kills)} "
            f"redeliveries={total} max_per_kill={worst}"
            + (f" (N={SAVE_EVERY_N})" if mode == "count" else "")
            + (f" (window={PARALLEL_WINDOW} + N={SAVE_EVERY_N})" if mode == "parallel" else "")
            + f" duplicates={duplicates} rows={len(rows)} time={duration:.1f}s seed={seed}"
            + (f" marks_at_kills={marks}" if marks else "")
        )
        print(
            "  per kill (order high-water H / anchor A / re-deliveries, at s): "
            + ", ".join(
                f"{k.high_water}/{k.anchor}/{n}@{k.at_seconds:.1f}"
                for k, n in zip(kills, per_kill, strict=True)
            )
        )


def _parallel_exactly_once(rows: list[tuple[int, int, str]], kills: list[Kill]) -> list[int]:
    """Transactional and in parallel: every order has exactly one row, and each key's
    rows, in the order they were written across every run, are its orders in stream
    order (a restart skipped what had committed past the anchor, and went on in key
    order); nothing behind an anchor was unhandled at its kill. No re-delivery left a
    row: 0 per kill."""
    by_key: dict[str, list[int]] = {}
    for _, order, key in rows:
        by_key.setdefault(key, []).append(order)
    for key, orders in by_key.items():
        residue = int(key.removeprefix("key-"))
        first = residue or parallel_mode.KEYS
        expected = list(range(first, EVENTS + 1, parallel_mode.KEYS))
        assert orders == expected, (
            f"{key}: rows for orders {orders[:12]}..., expected {expected[:12]}...: "
            "an effect was applied twice, lost, or out of key order"
        )
    for number, kill in enumerate(kills, 1):
        before = {order for row_id, order, _ in rows if row_id <= kill.last_row_id}
        lost = set(range(1, kill.anchor + 1)) - before
        assert not lost, f"kill {number}: orders {sorted(lost)[:10]} behind the anchor, unhandled"
    return [0 for _ in kills]


def _serial_redeliveries(rows: list[tuple[int, int, str]], kills: list[Kill]) -> list[int]:
    """One event at a time: each consumer run's rows are exactly the orders right after
    the previous anchor, up to its kill; the re-deliveries per kill (``H - A``)."""
    ends = [kill.last_row_id for kill in kills] + [rows[-1][0]]
    starts_after = [0] + [kill.anchor for kill in kills]
    highs = [kill.high_water for kill in kills] + [EVENTS]
    counted = []
    for run, (end, after, high) in enumerate(zip(ends, starts_after, highs, strict=True)):
        begin = ends[run - 1] if run else 0
        orders = [order for row_id, order, _ in rows if begin < row_id <= end]
        expected = list(range(after + 1, high + 1))
        assert orders == expected, (
            f"consumer run {run + 1} (after kill {run}) handled orders "
            f"{_ranges(orders)}, expected {after + 1}..{high}: it did not resume right after "
            "the persisted anchor, or skipped or repeated events"
        )
        if run:
            counted.append(sum(1 for order in orders if order <= highs[run - 1]))
    per_kill = [kill.redeliveries for kill in kills]
    assert counted == per_kill, (counted, per_kill)
    return per_kill


def _parallel_redeliveries(rows: list[tuple[int, int, str]], kills: list[Kill]) -> list[int]:
    """Events handled in parallel, in order per key: for each kill, everything up to the
    anchor was handled (nothing lost), and the next run handled, per key, exactly the
    key's orders after the anchor, in order, each once (so every order handled past the
    anchor before the kill was delivered again exactly once). The re-deliveries per
    kill: the orders past the anchor that had a row when it was killed."""
    ends = [kill.last_row_id for kill in kills] + [rows[-1][0]]
    per_kill = []
    for run, end in enumerate(ends):
        begin = ends[run - 1] if run else 0
        after = kills[run - 1].anchor if run else 0
        by_key: dict[str, list[int]] = {}
        for row_id, order, key in rows:
            if begin < row_id <= end:
                by_key.setdefault(key, []).append(order)
        for key, orders in by_key.items():
            residue = int(key.removeprefix("key-"))
            first = after + 1 + (residue - (after + 1)) % parallel_mode.KEYS
            expected = list(range(first, orders[-1] + 1, parallel_mode.KEYS))
            assert orders == expected, (
                f"consumer run {run + 1} (after kill {run}) handled {key}'s orders "
                f"{orders[:12]}..., expected {first}, {first + parallel_mode.KEYS}, ... up to "
                f"{orders[-1]}: out of key order, skipped, or not resumed at the anchor"
            )
        if run:
            kill = kills[run - 1]
            before = {order for row_id, order, _ in rows if row_id <= kill.last_row_id}
            lost = set(range(1, kill.anchor + 1)) - before
            assert not lost, (
                f"kill {run}: orders {sorted(lost)[:10]} are behind the anchor, unhandled"
            )
            redelivered = {order for order in before if order > kill.anchor}
            again = {order for row_id, order, _ in rows if begin < row_id <= end}
            assert redelivered <= again, (
                f"kill {run}: orders {sorted(redelivered - again)[:10]} were not delivered again"
            )
            per_kill.append(len(redelivered))
    return per_kill


def _ranges(orders: list[int]) -> str:
    """``1..50, 40..90``: a run of orders as its increasing stretches."""
    if not orders:
        return "nothing"
    parts, start = [], orders[0]
    for previous, current in itertools.pairwise(orders):
        if current != previous + 1:
            parts.append(f"{start}..{previous}")
            start = current
    parts.append(f"{start}..{orders[-1]}")
    return ", ".join(parts[:8]) + (" ..." if len(parts) > 8 else "")
