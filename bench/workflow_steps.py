"""Steps per second of a 20-step workflow on the ORM snapshot store, against raw
single-row INSERTs of the same snapshot rows.

Run from the repository root::

    .venv/bin/python bench/workflow_steps.py [--runs N] [--rounds N] [--warmup N]

What is measured
----------------
1. **Engine**: ``Workflow(name, cid, steps, OrmSnapshotStore(using="default")).run(state)``
   with the in-process execution provider, on PostgreSQL, for a fresh coordination
   each time. The workflow has 20 trivial steps (each returns ``advance`` of the state
   with one counter incremented), so the time is the engine's own: opening the run
   (claiming, here creating, the ``WorkflowRun`` and writing the seed, as the
   coordination has no snapshot yet: one statement), then per step the snapshot
   save, each committed before the next step starts, and the run-record writes: a
   plain step (every one but the last) is one ``INSERT`` (the run record catches up
   with its head when the lease is renewed, the status changes or the run is let
   go), the last step saves its snapshot and completes and releases the run in one
   statement.
   Steps per second = 20 x runs / elapsed; the per-run work (opening, completion) is
   counted in, spread over the 20 steps.
2. **Raw**: the same snapshot rows (id, parent_id, coordination_id, seq, agent_name,
   state text, state_type, metadata text, created_at: the columns and values the
   store writes, 21 rows per run: the seed and one per step) inserted into the same
   table with one autocommitted ``INSERT`` each, on a psycopg connection.
   Inserts per second.

The ratio (engine steps / raw inserts) is the share of the database's plain
single-row write rate that the engine turns into durable workflow steps.

Why the baseline is fair
------------------------
The raw connection is opened with the keyword arguments Django itself uses
(``get_connection_params()``: client-side binding with Django's cursor base class,
no prepared statements), with autocommit on and the session time zone set as
Django sets it (see ``bench/_postgres.py``). The raw loop builds each row the way
the engine must: a fresh UUID hex id, the previous row as parent, the state and
the metadata serialized to JSON text, a fresh aware timestamp; one cursor per
``INSERT``, as ``conn.execute()`` does. Before measuring, the script checks that
a row the raw loop writes has the same column values as the row the engine wrote
at the same position (apart from ids, timestamps and the step timings the engine
adds to its metadata: ``workflow.step.durationMs`` and ``.attempts``, whose cost the
ratio includes), and that every step's
snapshot is committed (visible to the raw connection) before the next step
starts. Each round runs both paths back to back, alternating which goes first,
after a warm-up of each. The ratio reported is the median of the rounds' own ratios:
each compares two blocks run one right after the other, so a drift of the machine's
speed over the minute the benchmark takes (several tens of percent here) moves both
sides of a round alike, where the ratio of the two paths' medians, printed too, can
pair one path's fast round with the other's slow one. The engine sends as many
statements per run as the raw loop (printed), every one committed synchronously, but
two of them also write the run's row (its opening and its completion): that is what
it costs, not an unfairness of the baseline, which is the least any durable step
needs.

With ``--tracing-rounds N`` (5 by default), the engine alone again, N rounds each
without OpenTelemetry, with its API and no SDK, and with an SDK and a span exporter
that drops every span (``bench/_tracing.py``): the ratios to the first and the cost
per step.

Also printed, from untimed runs: the statements of a whole run and of each plain
step, by kind (Django's query log, so BEGIN, COMMIT and SAVEPOINT count too; none
means each statement committed on its own), and CPU time per step: all of this
thread's (``time.thread_time``), and "Python", which leaves out the CPU time spent
inside each statement's execute (Django's cursor wrapper and psycopg, measured with
an execute wrapper); per step of a whole run, and the median from the start of one
plain step to the start of the next. The raw loop's CPU and Python per insert are
measured the same way (outside ``cursor.execute``). Then where a run's wall time
goes, from untimed runs of the two paths interleaved (medians): the time inside each
statement's execute, by position (the engine's opening, its plain steps' INSERTs, its
completion; the raw loop's INSERTs), and the rest ("Python": the engine's work between
statements, or the raw loop's row building and loop), with what the engine spends
beyond the raw loop in each.

PostgreSQL defaults to 127.0.0.1:5432, user ``postgres``, database ``fw_bench``
(created if missing); override with FLOWWARDEN_BENCH_PG_HOST, FLOWWARDEN_BENCH_PG_PORT,
FLOWWARDEN_BENCH_PG_USER and FLOWWARDEN_BENCH_PG_DB. The benchmark's rows are deleted
at the start and at the end.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

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
    prepared_statements,
    server_info,
    vacuum_workflow_tables,
)
from _tracing import tracing_lines  # noqa: E402

WORKFLOW = "bench.workflow_steps"
STEPS = 20
#: Every coordination id of the benchmark starts with this (cleanup deletes them).
PREFIX = "bench-wfs-"
COLUMNS = (
    "id",
    "parent_id",
    "coordination_id",
    "seq",
    "agent_name",
    "state",
    "state_type",
    "metadata",
    "created_at",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs",
        type=positive_int,
        default=25,
        help=f"workflow runs ({STEPS} steps each) per round",
    )
    parser.add_argument("--rounds", type=positive_int, default=7, help="rounds per path")
    parser.add_argument("--warmup", type=positive_int, default=3, help="untimed runs per path")
    parser.add_argument(
        "--tracing-rounds",
        type=int,
        default=5,
        help="rounds of the engine without OpenTelemetry, with its API and no SDK, and "
        "with an SDK and a no-op exporter (bench/_tracing.py; 0: none)",
    )
    return parser.parse_args(argv)


def initial_state() -> dict[str, Any]:
    """The state every run starts from."""
    return {"order": 42, "n": 0}


def make_steps() -> list[Any]:
    """Twenty trivial steps: each increments the state's counter."""
    from flowwarden_django.workflows import advance, step

    def make(number: int) -> Any:
        @step(f"s{number:02d}")
        def bump(state: dict[str, Any]) -> Any:
            return advance({**state, "n": state["n"] + 1})

        return bump

    return [make(number) for number in range(1, STEPS + 1)]


def new_cid() -> str:
    """A fresh coordination id of the benchmark."""
    return f"{PREFIX}{uuid.uuid4().hex}"


# -- the engine path -------------------------------------------------------------------


def engine_run(steps: list[Any], store: Any) -> str:
    """Run one fresh coordination to completion; return its id."""
    from flowwarden_django.workflows import Completed, Workflow

    cid = new_cid()
    result = Workflow(WORKFLOW, cid, steps, store).run(initial_state())
    if not isinstance(result, Completed) or result.final_state["n"] != STEPS:
        sys.exit(f"the benchmark workflow did not complete: {result!r}")
    return cid


def engine_round(steps: list[Any], store: Any, runs: int) -> float:
    """Run *runs* workflows; return the rate in steps per second."""
    start = time.perf_counter()
    for _ in range(runs):
        engine_run(steps, store)
    return runs * STEPS / (time.perf_counter() - start)


# -- the raw path ----------------------------------------------------------------------


def insert_sql(table: str) -> str:
    """The single-row ``INSERT`` of a snapshot row."""
    names = ", ".join(f'"{column}"' for column in COLUMNS)
    return f'INSERT INTO "{table}" ({names}) VALUES ({", ".join(["%s"] * len(COLUMNS))})'


def metadata_text(last_step: str, is_done: bool = False) -> str:
    """The metadata text of a step's snapshot, serialized as the store serializes it."""
    metadata = {
        "workflow.done": "true" if is_done else "false",
        "workflow.lastStep": last_step,
        "workflow.name": WORKFLOW,
    }
    return json.dumps(metadata, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def without_step_timings(text: str) -> str:
    """*text*, an engine snapshot's metadata, without the step's duration and attempts:
    the engine records them, the raw rows do not (their cost counts in the ratio)."""
    metadata = json.loads(text)
    kept = {k: v for k, v in metadata.items() if not k.startswith("workflow.step.")}
    return json.dumps(kept, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def raw_rows(cid: str) -> list[tuple[Any, ...]]:
    """The 21 rows of one run as the raw loop builds them (seed, then each step)."""
    rows = []
    state, parent = initial_state(), None
    for seq in range(1, STEPS + 2):
        if seq > 1:
            state = {**state, "n": state["n"] + 1}
        row_id = uuid.uuid4().hex
        rows.append(
            (
                row_id,
                parent,
                cid,
                seq,
                WORKFLOW,
                json.dumps(state, ensure_ascii=False, separators=(",", ":")),
                "dict",
                metadata_text("" if seq == 1 else f"s{seq - 1:02d}"),
                datetime.now(UTC),
            )
        )
        parent = row_id
    return rows


def raw_round(conn: psycopg.Connection[Any], sql: str, runs: int) -> float:
    """Insert the rows of *runs* runs one by one; return the rate in inserts per second."""
    inserts = 0
    start = time.perf_counter()
    for _ in range(runs):
        for row in raw_rows(new_cid()):
            with conn.cursor() as cursor:
                cursor.execute(sql, row)
            inserts += 1
    return inserts / (time.perf_counter() - start)


# -- checks before measuring ------------------------------------------------------------


def check_same_rows(steps: list[Any], store: Any, conn: psycopg.Connection[Any], sql: str) -> None:
    """Exit 1 unless the raw loop writes the rows the engine writes (ids and times aside)."""
    from flowwarden_django.models import SnapshotRecord

    cid = engine_run(steps, store)
    engine = list(
        SnapshotRecord.objects.using(ALIAS)
        .filter(coordination_id=cid)
        .order_by("seq")
        .values_list("seq", "agent_name", "state", "state_type", "metadata")
    )
    raw_cid = new_cid()
    for row in raw_rows(raw_cid):
        with conn.cursor() as cursor:
            cursor.execute(sql, row)
    raw = list(
        SnapshotRecord.objects.using(ALIAS)
        .filter(coordination_id=raw_cid)
        .order_by("seq")
        .values_list("seq", "agent_name", "state", "state_type", "metadata")
    )
    engine = [(*row[:4], without_step_timings(row[4])) for row in engine]
    if engine != raw:
        sys.exit(f"the raw rows differ from the engine's:\n  engine: {engine!r}\n  raw: {raw!r}")
    chained = SnapshotRecord.objects.using(ALIAS).filter(coordination_id__in=[cid, raw_cid])
    links: dict[str, dict[int, tuple[str, str | None]]] = {cid: {}, raw_cid: {}}
    for record in chained:
        links[record.coordination_id][record.seq] = (record.id, record.parent_id)
    for rows in links.values():
        for seq in range(2, STEPS + 2):
            if rows[seq][1] != rows[seq - 1][0]:
                sys.exit(f"seq {seq} is not chained to seq {seq - 1}: {rows!r}")


def check_committed_per_step(store: Any, conn: psycopg.Connection[Any]) -> None:
    """Exit 1 unless each step sees, from another connection, the previous step's
    snapshot committed: the engine does not batch steps into one transaction."""
    from flowwarden_django.models import SnapshotRecord
    from flowwarden_django.workflows import Completed, Workflow, advance, step

    table = SnapshotRecord._meta.db_table
    seen: list[int] = []
    cid = new_cid()

    def make(number: int) -> Any:
        @step(f"s{number:02d}")
        def look(state: dict[str, Any]) -> Any:
            count = conn.execute(
                f'SELECT count(*) FROM "{table}" WHERE coordination_id = %s', [cid]
            ).fetchone()
            seen.append(count[0])
            return advance({**state, "n": state["n"] + 1})

        return look

    steps = [make(number) for number in range(1, STEPS + 1)]
    result = Workflow(WORKFLOW, cid, steps, store).run(initial_state())
    if not isinstance(result, Completed) or seen != list(range(1, STEPS + 1)):
        sys.exit(f"steps did not see each earlier snapshot committed: {seen!r} ({result!r})")


#: Statements that open, close or nest a transaction.
TRANSACTION_KINDS = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")


def _kind(sql: str) -> str:
    """The kind of a logged statement: its first word, or ``advisory lock``."""
    sql = sql.lstrip().upper()
    if "PG_ADVISORY_XACT_LOCK" in sql:
        return "advisory lock"
    return sql.split(None, 1)[0] if sql else "?"


def traced_steps(mark: Callable[[], object]) -> list[Any]:
    """The benchmark's steps, each calling *mark()* when it starts."""
    from flowwarden_django.workflows import advance, step

    def make(number: int) -> Any:
        @step(f"s{number:02d}")
        def bump(state: dict[str, Any]) -> Any:
            mark()
            return advance({**state, "n": state["n"] + 1})

        return bump

    return [make(number) for number in range(1, STEPS + 1)]


class Profile:
    """What a run costs besides elapsed time: its statements (all of them, and those
    of each plain step: every step but the last, which finishes the run) and the
    CPU time of this thread outside the database driver ("Python")."""

    def __init__(self, store: Any, runs: int) -> None:
        #: Statements of one whole run, by kind (BEGIN, COMMIT, SAVEPOINT included).
        self.per_run: Counter[str] = Counter()
        #: Statements of the plain steps, by kind, and how many plain steps.
        self.plain: Counter[str] = Counter()
        self.plain_steps = 0
        self._count(store)
        self._time(store, runs)

    def _count(self, store: Any) -> None:
        from django.db import connections
        from django.test.utils import CaptureQueriesContext

        connection = connections[ALIAS]
        starts: list[int] = []
        with CaptureQueriesContext(connection) as captured:
            engine_run(traced_steps(lambda: starts.append(len(captured))), store)
        queries = captured.captured_queries
        self.per_run.update(_kind(query["sql"]) for query in queries)
        # From the start of step k to the start of step k + 1: step k's snapshot
        # (and whatever else the engine does for it).
        for before, after in itertools.pairwise(starts):
            self.plain_steps += 1
            self.plain.update(_kind(query["sql"]) for query in queries[before:after])

    def _time(self, store: Any, runs: int) -> None:
        from django.db import connections

        # The driver's share: CPU time inside each statement's execute (Django's
        # cursor wrapper and psycopg). Query logging is off here.
        in_driver = [0.0]

        def timed(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            begun = time.thread_time()
            try:
                return execute(sql, params, many, context)
            finally:
                in_driver[0] += time.thread_time() - begun

        starts: list[tuple[float, float]] = []
        steps = traced_steps(lambda: starts.append((time.thread_time(), in_driver[0])))
        plain: list[float] = []
        with connections[ALIAS].execute_wrapper(timed):
            begun = time.thread_time()
            for _ in range(runs):
                starts.clear()
                engine_run(steps, store)
                plain.extend(
                    (cpu_b - cpu_a) - (driver_b - driver_a)
                    for (cpu_a, driver_a), (cpu_b, driver_b) in itertools.pairwise(starts)
                )
            total = time.thread_time() - begun
        count = runs * STEPS
        #: µs of CPU per step (the run's own work spread over its steps, as in steps/s).
        self.cpu_us = total / count * 1e6
        #: µs of it outside the driver.
        self.python_us = (total - in_driver[0]) / count * 1e6
        #: µs outside the driver from a plain step's start to the next step's (median).
        self.plain_python_us = statistics.median(plain) * 1e6

    def lines(self) -> list[str]:
        """What the benchmark prints of the profile."""
        run = ", ".join(f"{kind} {count}" for kind, count in sorted(self.per_run.items()))
        per_step = sum(self.per_run.values()) / STEPS
        plain = ", ".join(
            f"{kind} {count / self.plain_steps:g}" for kind, count in sorted(self.plain.items())
        )
        per_plain = sum(self.plain.values()) / self.plain_steps
        explicit = sum(self.plain[kind] for kind in TRANSACTION_KINDS)
        commits = (
            "no BEGIN or SAVEPOINT: autocommitted"
            if not explicit
            else f"{explicit / self.plain_steps:g} transaction statements"
        )
        return [
            f"engine statements per run: {run} ({per_step:.2f} per step); raw: 1 INSERT per row",
            f"engine statements per plain step: {per_plain:g} ({plain}; {commits})",
            f"engine CPU per step: {self.cpu_us:.0f} us, Python (outside the driver) "
            f"{self.python_us:.0f} us; Python per plain step: {self.plain_python_us:.0f} us",
        ]


def raw_python_us(conn: psycopg.Connection[Any], sql: str, runs: int) -> tuple[float, float]:
    """µs of CPU per raw insert, and of it outside ``cursor.execute``."""
    in_driver = 0.0
    inserts = 0
    begun = time.thread_time()
    for _ in range(runs):
        for row in raw_rows(new_cid()):
            with conn.cursor() as cursor:
                started = time.thread_time()
                cursor.execute(sql, row)
                in_driver += time.thread_time() - started
            inserts += 1
    total = time.thread_time() - begun
    return total / inserts * 1e6, (total - in_driver) / inserts * 1e6


class WallSplit:
    """Where one run's wall time goes, for both paths, from untimed runs (medians, the
    two paths' runs interleaved): inside each statement's execute (the driver and the
    server's reply) and between statements (Python: the engine's, or the raw loop's
    row building and its loop).

    The engine's statements are timed by a Django execute wrapper, so Django's cursor
    wrapper around it counts as Python; the raw loop's around ``cursor.execute``."""

    def __init__(self, steps: list[Any], store: Any, conn: Any, sql: str, runs: int) -> None:
        from django.db import connections

        span: list[float] = []

        def timed(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            started = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                span.append(time.perf_counter() - started)

        raw: list[tuple[float, list[float]]] = []
        engine: list[tuple[float, list[float]]] = []
        with connections[ALIAS].execute_wrapper(timed):
            for _ in range(runs):
                raw.append(self._raw_run(conn, sql))
                span.clear()
                begun = time.perf_counter()
                engine_run(steps, store)
                engine.append((time.perf_counter() - begun, list(span)))
        self.raw_total, self.raw_statements = self._medians(raw)
        self.engine_total, self.engine_statements = self._medians(engine)

    @staticmethod
    def _raw_run(conn: psycopg.Connection[Any], sql: str) -> tuple[float, list[float]]:
        span: list[float] = []
        begun = time.perf_counter()
        for row in raw_rows(new_cid()):
            with conn.cursor() as cursor:
                started = time.perf_counter()
                cursor.execute(sql, row)
                span.append(time.perf_counter() - started)
        return time.perf_counter() - begun, span

    @staticmethod
    def _medians(runs: list[tuple[float, list[float]]]) -> tuple[float, list[float]]:
        """The median run time, and each statement's median time (by position)."""
        spans = [span for _, span in runs]
        return statistics.median(total for total, _ in runs), [
            statistics.median(times) for times in zip(*spans, strict=True)
        ]

    def lines(self) -> list[str]:
        """What the benchmark prints of the split (µs per run)."""
        raw_in, engine_in = sum(self.raw_statements), sum(self.engine_statements)
        plain = self.engine_statements[1:-1]
        opening, completion = self.engine_statements[0], self.engine_statements[-1]
        raw_each = statistics.median(self.raw_statements)
        raw_python = self.raw_total - raw_in
        engine_python = self.engine_total - engine_in
        us = 1e6
        return [
            f"wall per run (medians of untimed runs): raw {self.raw_total * us:.0f} us = "
            f"{len(self.raw_statements)} INSERTs {raw_in * us:.0f} us ({raw_each * us:.0f} each) "
            f"+ Python {raw_python * us:.0f} us",
            f"  engine {self.engine_total * us:.0f} us = opening {opening * us:.0f} us + "
            f"{len(plain)} plain INSERTs {sum(plain) * us:.0f} us "
            f"({statistics.median(plain) * us:.0f} each) + completion {completion * us:.0f} us "
            f"+ Python {engine_python * us:.0f} us",
            f"  the engine's extra: statements +{(engine_in - raw_in) * us:.0f} us (opening "
            f"and completion +{(opening + completion - 2 * raw_each) * us:.0f} us over two "
            f"plain INSERTs: the run's row), Python +{(engine_python - raw_python) * us:.0f} us",
        ]


def cleanup(conn: psycopg.Connection[Any]) -> None:
    """Delete the benchmark's snapshot rows and runs."""
    from flowwarden_django.models import SnapshotRecord, WorkflowRun

    for model in (SnapshotRecord, WorkflowRun):
        conn.execute(
            f'DELETE FROM "{model._meta.db_table}" WHERE coordination_id LIKE %s',
            [f"{PREFIX}%"],
        )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its results."""
    args = parse_args(argv)
    target = pg_target()
    ensure_database(target)
    configure_django(target)

    from django.core.management import call_command
    from django.db import connections

    from flowwarden_django.models import SnapshotRecord
    from flowwarden_django.workflows import InProcessProvider, resolve_provider
    from flowwarden_django.workflows.backends.orm import OrmSnapshotStore

    call_command("migrate", verbosity=0)
    if not isinstance(resolve_provider(), InProcessProvider):
        sys.exit("the benchmark needs the in-process execution provider")
    version, synchronous_commit = server_info()
    print(
        f"PostgreSQL {version} at {target['host']}:{target['port']}/{target['dbname']}, "
        f"synchronous_commit={synchronous_commit}, prepared statements "
        f"{'on' if prepared_statements() else 'off (Django default)'}; "
        f"{args.rounds} rounds x {args.runs} runs "
        f"of {STEPS} steps per path ({args.runs * (STEPS + 1)} raw inserts), "
        f"{args.warmup} warm-up runs each",
        flush=True,
    )

    store = OrmSnapshotStore(using=ALIAS)
    steps = make_steps()
    conn = open_raw_connection()
    sql = insert_sql(SnapshotRecord._meta.db_table)
    try:
        cleanup(conn)
        vacuum_workflow_tables()
        check_same_rows(steps, store, conn, sql)
        check_committed_per_step(store, conn)
        engine_round(steps, store, args.warmup)
        raw_round(conn, sql, args.warmup)
        profile = Profile(store, args.runs)
        raw_cpu_us, raw_python = raw_python_us(conn, sql, args.runs)
        split = WallSplit(steps, store, conn, sql, args.runs)
        for line in profile.lines()[:2]:
            print(line, flush=True)
        engine_rates: list[float] = []
        raw_rates: list[float] = []
        for number in range(1, args.rounds + 1):
            # Alternate which path goes first, so neither always follows the other.
            if number % 2:
                engine_rates.append(engine_round(steps, store, args.runs))
                raw_rates.append(raw_round(conn, sql, args.runs))
            else:
                raw_rates.append(raw_round(conn, sql, args.runs))
                engine_rates.append(engine_round(steps, store, args.runs))
            print(
                f"round {number}/{args.rounds}: engine {engine_rates[-1]:.0f} steps/s "
                f"raw {raw_rates[-1]:.0f} inserts/s "
                f"ratio {engine_rates[-1] / raw_rates[-1]:.2f}",
                flush=True,
            )
        tracing = []
        if args.tracing_rounds:
            tracing = tracing_lines(
                lambda: engine_round(steps, store, args.runs), args.tracing_rounds
            )
    finally:
        cleanup(conn)
        conn.close()
        connections.close_all()

    engine = statistics.median(engine_rates)
    raw = statistics.median(raw_rates)
    print(profile.lines()[2])
    print(
        f"raw CPU per insert: {raw_cpu_us:.0f} us, Python (outside the driver) {raw_python:.0f} us"
    )
    for line in split.lines():
        print(line)
    paired = statistics.median(e / r for e, r in zip(engine_rates, raw_rates, strict=True))
    print(f"engine (in-process, ORM store): {engine:.0f} steps/s (median of the rounds)")
    print(f"raw psycopg single-row INSERT:  {raw:.0f} inserts/s (median of the rounds)")
    print(f"ratio of those medians: {engine / raw:.2f}")
    print(f"ratio (engine steps / raw inserts, median of the rounds' ratios): {paired:.2f}")
    for line in tracing:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
