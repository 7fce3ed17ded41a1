"""The cost of a step at step 10 and at step 10,000 of one looping run, on the ORM
snapshot store (PostgreSQL), beside raw single-row INSERTs into chains of the same
rows.

Run from the repository root::

    .venv/bin/python bench/workflow_loop.py [--steps N] [--window N] [--rounds N]

What is measured
----------------
One workflow of one step, ``tick``, that returns ``advance(state, to="tick")`` (a
jump back to itself), and ``hibernate(state, to="tick")`` once it has run
``--steps`` times (10,000 by default), and once more. Each round:

1. **The looping run**: ``Workflow(...).run(state)`` with the in-process provider
   runs it from its seed to its 10,001st step in one call, each step's snapshot
   committed before the next starts; its chain then holds 10,002 snapshots. Each
   step's body first inserts the next row of a raw chain (below). The cost of step
   *k* is the time from its start to the start of step *k* + 1, less that raw
   ``INSERT``; printed: the medians of the window of ``--window`` steps (100) from
   step 10 and of the window that ends at step 10,000, and of the raw ``INSERT``s
   made beside them. The machine's speed may change between the two windows (a
   loaded machine's does, by tens of percent within seconds), so:
2. **Interleaved**: the looping run, now at step 10,000, continues (its hibernate
   jumped back to ``tick``) beside a new run of the same workflow that has made 9
   steps, in alternating blocks, so both are measured under the same load: a block
   of 11 steps of one (``run_local(max_steps=11)``: the claim and the read of the
   run's head, 11 steps, the release; its 10 step-to-step intervals are plain steps,
   each one ``INSERT``), then a block of the other, then 11 raw ``INSERT``s at the end
   of the looping run's raw chain and 11 at the end of the new run's, the order
   turned round every block. After 10 blocks (a window of 100 steps) the new run is
   replaced by another from its step 10, so it stays in steps 10 to 109, while the
   looping run goes on from step 10,001; ``--samples`` steps (500) of each are
   measured. Then the same with one step per call (``run_local(max_steps=1)`` on a
   fresh ``Workflow``, as a Celery task or a Temporal activity without a hand-off
   runs a step: claim and head read, the step, its snapshot with the release),
   alternating call by call.

The raw chains hold the rows the engine writes (the same columns and metadata, step
timings aside: seed, then one row per step, each the child of the one before, at the
next ``seq``), inserted one by one, autocommitted, on a psycopg connection opened as
Django opens its own. The engine's statements per step are counted (Django's execute
wrapper): the same number at step 10,000 as at step 10 means nothing reads the chain
behind its head. The figures at the end are medians over the rounds; "late / early"
is the cost at step 10,000 over the cost at step 10, of the engine's step, of the raw
``INSERT`` and of the engine's cost as a multiple of the raw ``INSERT``'s beside it
(which takes out the machine's change of speed between the windows of the one pass).

PostgreSQL defaults to 127.0.0.1:5432, user ``postgres``, database ``fw_bench``
(created if missing); override with FLOWWARDEN_BENCH_PG_HOST, FLOWWARDEN_BENCH_PG_PORT,
FLOWWARDEN_BENCH_PG_USER and FLOWWARDEN_BENCH_PG_DB. The benchmark's rows are deleted
at the start, after each round and at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
import uuid
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

WORKFLOW = "bench.workflow_loop"
#: Every coordination id of the benchmark starts with this (cleanup deletes them).
PREFIX = "bench-wfl-"
#: Where the early window starts (1-based step number).
EARLY = 10
#: Steps per interleaved block (its first interval, after the claim, is left out).
BLOCK = 11
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
US = 1e6


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int, default=10_000, help="steps of the run")
    parser.add_argument("--window", type=positive_int, default=100, help="steps per window")
    parser.add_argument("--rounds", type=positive_int, default=3, help="rounds")
    parser.add_argument(
        "--samples",
        type=positive_int,
        default=500,
        help="steps of each side measured interleaved (a new run every --window steps)",
    )
    args = parser.parse_args(argv)
    if args.steps < EARLY + 2 * args.window:
        parser.error(f"--steps must be at least {EARLY} + 2 x --window")
    if args.window % (BLOCK - 1) or args.samples % args.window:
        parser.error(f"--window must be a multiple of {BLOCK - 1}, --samples of --window")
    return args


def new_cid() -> str:
    """A fresh coordination id of the benchmark."""
    return f"{PREFIX}{uuid.uuid4().hex}"


def initial_state() -> dict[str, Any]:
    return {"order": 42, "n": 0}


# -- the raw chains ----------------------------------------------------------------------


def insert_sql(table: str) -> str:
    """The single-row ``INSERT`` of a snapshot row."""
    names = ", ".join(f'"{column}"' for column in COLUMNS)
    return f'INSERT INTO "{table}" ({names}) VALUES ({", ".join(["%s"] * len(COLUMNS))})'


def metadata_text(n: int) -> str:
    """The metadata of the snapshot of the *n*-th tick (``0``: the seed), as the
    engine writes it (step timings aside), serialized as the store serializes it."""
    metadata = {
        "workflow.name": WORKFLOW,
        "workflow.lastStep": "tick" if n else "",
        "workflow.done": "false",
    }
    if n:
        metadata.update({"workflow.furthestStep": "tick", "workflow.nextStep": "tick"})
    return json.dumps(metadata, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


class RawChain:
    """A raw chain of snapshot rows, inserted one row per call, each timed."""

    def __init__(self, conn: psycopg.Connection[Any], sql: str) -> None:
        self.conn, self.sql = conn, sql
        self.cid, self.parent, self.n = new_cid(), None, 0
        self.state = initial_state()
        self.insert()  # the seed

    def insert(self) -> float:
        """Insert the next row (the seed, then one per step); its time."""
        started = time.perf_counter()
        if self.n:
            self.state = {**self.state, "n": self.n}
        row_id = uuid.uuid4().hex
        row = (
            row_id,
            self.parent,
            self.cid,
            self.n + 1,
            WORKFLOW,
            json.dumps(self.state, ensure_ascii=False, separators=(",", ":")),
            "dict",
            metadata_text(self.n),
            datetime.now(UTC),
        )
        with self.conn.cursor() as cursor:
            cursor.execute(self.sql, row)
        elapsed = time.perf_counter() - started
        self.parent, self.n = row_id, self.n + 1
        return elapsed


# -- the engine ----------------------------------------------------------------------------


class Marks:
    """When each step started, and how many statements the engine had sent by then."""

    def __init__(self) -> None:
        self.statements = 0
        self.starts: list[tuple[float, int]] = []

    def wrapper(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        """A Django execute wrapper that counts statements."""
        self.statements += 1
        return execute(sql, params, many, context)

    def mark(self) -> None:
        self.starts.append((time.perf_counter(), self.statements))

    def intervals(self) -> tuple[list[float], list[int]]:
        """The time and the statements from each mark to the next; cleared."""
        pairs = list(zip(self.starts, self.starts[1:], strict=False))
        self.starts = []
        return [b[0] - a[0] for a, b in pairs], [b[1] - a[1] for a, b in pairs]


def make_steps(pause_at: int, body: Callable[[], None]) -> list[Any]:
    """``tick``: calls *body*, then jumps back to itself, hibernating (to itself) when
    it has run *pause_at* times."""
    from flowwarden_django.workflows import advance, hibernate, step

    @step("tick", goes_to=["tick"])
    def tick(state: dict[str, Any]) -> Any:
        body()
        state = {**state, "n": state["n"] + 1}
        if state["n"] == pause_at:
            return hibernate(state, to="tick")
        return advance(state, to="tick")

    return [tick]


@dataclasses.dataclass
class Window:
    """The median cost (seconds) of a window of engine steps, the engine's statements
    per step in it, and the median of the raw INSERTs measured beside it."""

    engine: float
    statements: float
    raw: float

    @classmethod
    def of(cls, engine: list[float], statements: list[int], raw: list[float]) -> Window:
        return cls(statistics.median(engine), statistics.mean(statements), statistics.median(raw))


@dataclasses.dataclass
class Round:
    """One round's windows: early and late of each measurement."""

    run: tuple[Window, Window]
    blocks: tuple[Window, Window]
    calls: tuple[Window, Window]


class Bench:
    """The store, the raw connection and the options of one benchmark."""

    def __init__(self, store: Any, conn: psycopg.Connection[Any], sql: str, args: Any) -> None:
        self.store, self.conn, self.sql = store, conn, sql
        self.steps, self.window, self.samples = args.steps, args.window, args.samples
        self.marks = Marks()

    def workflow(self, cid: str, steps: list[Any]) -> Any:
        from flowwarden_django.workflows import Workflow

        return Workflow(WORKFLOW, cid, steps, self.store)

    def looping_run(self, cid: str, raw: RawChain) -> tuple[Window, Window]:
        """Run the looping run to its hibernation at ``--steps``; its early and late
        windows (each step's body inserts a raw row first)."""
        from flowwarden_django.workflows import Hibernated

        raw_times: list[float] = []

        def body() -> None:
            self.marks.mark()
            raw_times.append(raw.insert())

        # One step more than measured: the last step (the hibernation and the run's
        # release) is not a plain one.
        pause_at = self.steps + 1
        result = self.workflow(cid, make_steps(pause_at, body)).run(initial_state())
        self.marks.mark()  # the end of the last step
        if not isinstance(result, Hibernated) or result.saved_state["n"] != pause_at:
            sys.exit(f"the looping run did not hibernate at step {pause_at}: {result!r}")
        times, counts = self.marks.intervals()
        engine = [t - r for t, r in zip(times, raw_times, strict=True)]
        early = slice(EARLY - 1, EARLY - 1 + self.window)
        late = slice(self.steps - self.window, self.steps)
        return (
            Window.of(engine[early], counts[early], raw_times[early]),
            Window.of(engine[late], counts[late], raw_times[late]),
        )

    def fresh_run(self, steps: list[Any]) -> tuple[str, RawChain]:
        """A new run of the workflow that has made 9 steps, and a raw chain as long."""
        fresh = new_cid()
        self.workflow(fresh, steps).run_local(initial_state(), max_steps=EARLY - 1)
        self.marks.intervals()  # forget the marks of those steps
        raw = RawChain(self.conn, self.sql)
        for _ in range(EARLY - 1):
            raw.insert()
        return fresh, raw

    def interleaved(self, deep: str, deep_raw: RawChain, per_call: bool) -> tuple[Window, Window]:
        """The looping run (*deep*, at ``--steps``) beside new runs from their step 10
        (a new one every ``--window`` steps), in alternating blocks (or single calls,
        *per_call*), each beside raw INSERTs at the end of its raw chain, for
        ``--samples`` steps of each; the new runs' window and the looping run's."""
        steps = make_steps(10**9, self.marks.mark)
        fresh, fresh_raw = self.fresh_run(steps)
        measured: dict[str, tuple[list[float], list[int], list[float]]] = {
            "fresh": ([], [], []),
            "deep": ([], [], []),
        }
        size = 1 if per_call else BLOCK
        for number in range(self.samples // (size if per_call else BLOCK - 1)):
            if measured["fresh"][0] and len(measured["fresh"][0]) % self.window == 0:
                fresh, fresh_raw = self.fresh_run(steps)  # back to step 10
            runs = {"fresh": (fresh, fresh_raw), "deep": (deep, deep_raw)}
            order = ("fresh", "deep") if number % 2 else ("deep", "fresh")
            for side in order:
                engine, counts, _ = measured[side]
                started, sent = time.perf_counter(), self.marks.statements
                self.workflow(runs[side][0], steps).run_local(max_steps=size)
                if per_call:
                    engine.append(time.perf_counter() - started)
                    counts.append(self.marks.statements - sent)
                    self.marks.intervals()  # forget the step's mark
                else:
                    times, statements = self.marks.intervals()
                    engine.extend(times)
                    counts.extend(statements)
            for side in order:
                measured[side][2].extend(runs[side][1].insert() for _ in range(size))
        return Window.of(*measured["fresh"]), Window.of(*measured["deep"])

    def round(self) -> Round:
        from django.db import connections

        deep = new_cid()
        deep_raw = RawChain(self.conn, self.sql)
        with connections[ALIAS].execute_wrapper(self.marks.wrapper):
            run = self.looping_run(deep, deep_raw)
            blocks = self.interleaved(deep, deep_raw, per_call=False)
            calls = self.interleaved(deep, deep_raw, per_call=True)
        return Round(run, blocks, calls)


def cleanup(conn: psycopg.Connection[Any]) -> None:
    """Delete the benchmark's snapshot rows and runs."""
    from flowwarden_django.models import SnapshotRecord, WorkflowRun

    for model in (SnapshotRecord, WorkflowRun):
        conn.execute(
            f'DELETE FROM "{model._meta.db_table}" WHERE coordination_id LIKE %s',
            [f"{PREFIX}%"],
        )


def describe(name: str, early: Window, late: Window) -> str:
    """One line of a measurement's two windows."""
    return (
        f"{name}: engine {early.engine * US:.0f} -> {late.engine * US:.0f} us "
        f"({late.engine / early.engine:.2f}), raw {early.raw * US:.0f} -> "
        f"{late.raw * US:.0f} us ({late.raw / early.raw:.2f}), engine / raw "
        f"{early.engine / early.raw:.2f} -> {late.engine / late.raw:.2f} "
        f"({paired(early, late):.2f}), statements per step "
        f"{early.statements:.2f} -> {late.statements:.2f}"
    )


def paired(early: Window, late: Window) -> float:
    """Late / early of the engine's cost as a multiple of the raw INSERT's beside it:
    the machine's own change of speed between the windows taken out."""
    return (late.engine / late.raw) / (early.engine / early.raw)


MEASUREMENTS = (
    ("the looping run, one pass", "run"),
    ("interleaved blocks, plain steps", "blocks"),
    ("interleaved, one step per call", "calls"),
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
        f"{'on' if prepared_statements() else 'off (Django default)'}; {args.rounds} rounds "
        f"of one looping run of {args.steps} steps; windows of {args.window} steps from step "
        f"{EARLY} and around step {args.steps}",
        flush=True,
    )
    conn = open_raw_connection()
    sql = insert_sql(SnapshotRecord._meta.db_table)
    bench = Bench(OrmSnapshotStore(using=ALIAS), conn, sql, args)
    rounds: list[Round] = []
    try:
        cleanup(conn)
        vacuum_workflow_tables()
        for number in range(1, args.rounds + 1):
            found = bench.round()
            rounds.append(found)
            for label, field in MEASUREMENTS:
                print(f"round {number}/{args.rounds} {describe(label, *getattr(found, field))}")
            cleanup(conn)
            vacuum_workflow_tables()
    finally:
        cleanup(conn)
        conn.close()
        connections.close_all()

    print(f"medians of {args.rounds} rounds, step {EARLY} -> step {args.steps}:")
    for label, field in MEASUREMENTS:
        pairs = [getattr(found, field) for found in rounds]

        def median(value: Callable[[Window, Window], float], pairs: list[Any] = pairs) -> float:
            return statistics.median(value(*pair) for pair in pairs)

        early_us = median(lambda early, late: early.engine) * US
        late_us = median(lambda early, late: late.engine) * US
        ratio = median(lambda early, late: late.engine / early.engine)
        raw = (
            median(lambda early, late: early.raw) * US,
            median(lambda early, late: late.raw) * US,
            median(lambda early, late: late.raw / early.raw),
        )
        statements = (
            median(lambda early, late: early.statements),
            median(lambda early, late: late.statements),
        )
        print(
            f"  {label}: engine {early_us:.0f} -> {late_us:.0f} us per step, late / early "
            f"{ratio:.2f}; raw INSERT {raw[0]:.0f} -> {raw[1]:.0f} us ({raw[2]:.2f}); "
            f"engine / raw, late / early {median(paired):.2f}; statements per step "
            f"{statements[0]:.2f} -> {statements[1]:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
