"""Messages to runs: send-to-next-step latency and messages delivered per second, against
a raw INSERT + NOTIFY/LISTEN round trip (and an INSERT + poll) and raw INSERTs.

Run from the repository root::

    .venv/bin/python bench/messages.py [--runs N] [--rounds N] [--warmup N]

What is measured
----------------
A two-step workflow on PostgreSQL (ORM snapshot store, in-process execution, one
process): ``wait`` returns ``wait_for(state, "go")``, ``took`` notes
``time.perf_counter()`` as it starts and completes the run. Before each timed loop
(untimed), *runs* coordinations are started, each one waiting for its message.

1. **Latency, send to next step.** For each waiting run: ``t0``; inside
   ``transaction.atomic()``, ``Workflow.for_coordination(cid).send("go", payload)``;
   the commit; the wake after it (``on_commit``: one conditional ``UPDATE``), and the
   in-process provider continues the run in this thread: it claims the run, binds the
   message to the waiting snapshot and starts ``took``, which notes ``t1``. The
   latency is ``t1 - t0``: median and p99 over every run of every round.
   **Raw**: the same message row inserted into the same table with one ``INSERT``
   and a ``NOTIFY`` in one transaction, on a psycopg connection (Django's own
   connection settings, ``bench/_postgres.py``); a second connection has ``LISTEN``ed
   and takes the notification: ``t1`` when it has it. And **INSERT + poll**: the row
   inserted (autocommitted), then the second connection reads it back by id with a
   ``SELECT`` until found (once: it is committed). The raw round trips carry the
   message across two sessions and wake nothing: the least a durable message that
   starts something costs.
2. **Messages per second.** *runs* waiting runs; one send each (each in its own
   transaction); in-process, each send returns once the run's next step ran and the
   run completed, so the rate is runs / elapsed, checked by the runs all being
   completed. Also all the sends in **one** transaction: the wakes run after its one
   commit. **Raw**: the same message rows, one autocommitted ``INSERT`` each: rows/s.

The ratios: raw NOTIFY round trip median / engine median latency (how much of the raw
round trip's speed the engine keeps), and engine messages/s / raw INSERTs/s. Each
round runs every path, alternating the order; latencies are over every sample, rates
are the rounds' medians, and each round's own ratios are printed with their median
(a round compares paths run minutes apart at most, so a machine whose speed drifts
moves both sides of it alike). Also printed: the statements one delivery sends
(Django's query log, by kind), the work a message costs beyond the raw row.

Not measured here: a send from another process. The in-process provider runs the
woken run in the sender's process; a process that does not define the workflow
leaves it to the recovery sweep (``WORKFLOW_SWEEP_INTERVAL``, 2 s), and Celery queues
its next step (``bench/workflow_providers.py`` measures a step's queueing).

PostgreSQL: see ``bench/_postgres.py`` (FLOWWARDEN_BENCH_PG_* variables). The
benchmark's rows are deleted at the start and at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _args import positive_int  # noqa: E402  (after the path set-up)
from _postgres import (  # noqa: E402  (after the path set-up; bench/ is the script's dir)
    configure_django,
    ensure_database,
    open_raw_connection,
    pg_target,
    server_info,
    vacuum_workflow_tables,
)

WORKFLOW = "bench.messages"
TOPIC = "go"
#: Every coordination id of the benchmark starts with this (cleanup deletes them).
PREFIX = "bench-msg-"
RAW_PREFIX = PREFIX + "raw-"
CHANNEL = "bench_messages"
#: When each run's ``took`` step started (``perf_counter``), by coordination id.
STARTED: dict[str, float] = {}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=positive_int, default=300, help="runs per round and path")
    parser.add_argument("--rounds", type=positive_int, default=5, help="rounds")
    parser.add_argument("--warmup", type=positive_int, default=30, help="untimed runs per path")
    return parser.parse_args(argv)


def define_workflow() -> None:
    """``wait`` for a message on ``go``, then ``took``: note the time, complete."""
    from flowwarden_django.workflows import Workflow, done, step, wait_for
    from flowwarden_django.workflows.backends.orm import OrmSnapshotStore

    @step("wait")
    def wait(state: dict[str, Any]) -> Any:
        return wait_for(state, TOPIC)

    @step("took")
    def took(state: dict[str, Any], ctx: Any) -> Any:
        STARTED[ctx.coordination_id] = time.perf_counter()
        return done({**state, "amount": ctx.message.payload["amount"]})

    Workflow.define(WORKFLOW, [wait, took], OrmSnapshotStore())


def payload(n: int) -> dict[str, Any]:
    """A message's payload: a small JSON object, as a webhook's."""
    return {"amount": n, "currency": "EUR", "reference": f"inv-{n:06d}"}


def waiting_runs(count: int) -> list[str]:
    """Start *count* runs; each waits for its message (untimed)."""
    from flowwarden_django.workflows import Workflow, WorkflowDefinition, workflow_registry

    definition: WorkflowDefinition = workflow_registry.get(WORKFLOW)  # type: ignore[assignment]
    cids = []
    for _ in range(count):
        cid = f"{PREFIX}{uuid.uuid4().hex}"
        definition.start({"order": cid}, coordination_id=cid)
        cids.append(cid)
    if Workflow.for_coordination(cids[-1]).status() != "waiting_message":
        sys.exit("a benchmark run does not wait for its message")
    return cids


def send(cid: str, n: int, *, atomic: bool = True) -> None:
    """Send run *cid* its message, in a transaction of its own (*atomic*) or in the
    caller's."""
    from django.db import transaction

    from flowwarden_django.workflows import Workflow

    if not atomic:
        Workflow.for_coordination(cid).send(TOPIC, payload(n), sender="bench")
        return
    with transaction.atomic():
        Workflow.for_coordination(cid).send(TOPIC, payload(n), sender="bench")


def check_completed(cids: list[str]) -> None:
    from flowwarden_django.models import WorkflowRun

    done = WorkflowRun.objects.filter(pk__in=cids, status="completed").count()
    if done != len(cids) or any(cid not in STARTED for cid in cids):
        sys.exit(f"{len(cids) - done} of {len(cids)} runs did not take their message")


# -- the engine's paths ----------------------------------------------------------------


def engine_latencies(runs: int) -> list[float]:
    """Send-to-next-step seconds of *runs* waiting runs."""
    cids = waiting_runs(runs)
    latencies = []
    for n, cid in enumerate(cids):
        started = time.perf_counter()
        send(cid, n)
        latencies.append(STARTED[cid] - started)
    check_completed(cids)
    return latencies


def engine_rate(runs: int, *, one_transaction: bool = False) -> float:
    """Messages delivered per second to *runs* waiting runs (each send's next step ran
    when the loop returns; *one_transaction*: all sends in one, the wakes after it)."""
    from django.db import transaction

    cids = waiting_runs(runs)
    started = time.perf_counter()
    if one_transaction:
        with transaction.atomic():
            for n, cid in enumerate(cids):
                send(cid, n, atomic=False)
    else:
        for n, cid in enumerate(cids):
            send(cid, n)
    elapsed = time.perf_counter() - started
    check_completed(cids)
    return runs / elapsed


def statements_per_delivery() -> Counter[str]:
    """The statements one send and the delivery it wakes send (untimed), by kind."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    [cid] = waiting_runs(1)
    with CaptureQueriesContext(connection) as captured:
        send(cid, 0)
    check_completed([cid])
    return Counter(query["sql"].split(None, 1)[0].upper() for query in captured.captured_queries)


# -- the raw paths ---------------------------------------------------------------------


class Raw:
    """Two psycopg connections: *writer* inserts message rows into the same table,
    *reader* has ``LISTEN``ed on :data:`CHANNEL`."""

    def __init__(self) -> None:
        from flowwarden_django.models import WorkflowMessage

        self.writer = open_raw_connection()
        self.reader = open_raw_connection()
        self.reader.execute(f"LISTEN {CHANNEL}")
        table = WorkflowMessage._meta.db_table
        self.insert = (
            f'INSERT INTO "{table}" (coordination_id, topic, payload, sender, sent_at, '
            "idempotency_key) VALUES (%s, %s, %s, %s, %s, NULL) RETURNING id"
        )
        self.select = f'SELECT id, payload FROM "{table}" WHERE id = %s'

    def close(self) -> None:
        self.writer.close()
        self.reader.close()

    def _row(self, n: int) -> tuple[Any, ...]:
        cid = f"{RAW_PREFIX}{uuid.uuid4().hex}"
        return (cid, TOPIC, Jsonb(payload(n)), "bench", datetime.now(UTC))

    def notify_latencies(self, runs: int) -> list[float]:
        """INSERT + NOTIFY in one transaction, until the listener has it."""
        latencies = []
        for n in range(runs):
            started = time.perf_counter()
            with self.writer.transaction():
                row_id = self.writer.execute(self.insert, self._row(n)).fetchone()[0]
                self.writer.execute("SELECT pg_notify(%s, %s)", [CHANNEL, str(row_id)])
            got = next(iter(self.reader.notifies(timeout=10.0, stop_after=1)), None)
            if got is None or got.payload != str(row_id):
                sys.exit(f"the raw notification for row {row_id} did not come: {got!r}")
            latencies.append(time.perf_counter() - started)
        return latencies

    def poll_latencies(self, runs: int) -> list[float]:
        """INSERT (autocommitted), then the other connection reads it until found."""
        latencies = []
        for n in range(runs):
            started = time.perf_counter()
            row_id = self.writer.execute(self.insert, self._row(n)).fetchone()[0]
            while self.reader.execute(self.select, [row_id]).fetchone() is None:
                pass
            latencies.append(time.perf_counter() - started)
        return latencies

    def insert_rate(self, runs: int) -> float:
        """Message rows per second, one autocommitted ``INSERT`` each."""
        rows = [self._row(n) for n in range(runs)]
        started = time.perf_counter()
        for row in rows:
            self.writer.execute(self.insert, row)
        return runs / (time.perf_counter() - started)


# -- reporting -------------------------------------------------------------------------


def p99(samples: list[float]) -> float:
    """The 99th percentile (inclusive method)."""
    return statistics.quantiles(samples, n=100, method="inclusive")[98]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def cleanup() -> None:
    """Delete the benchmark's runs, snapshots and messages (and the raw rows)."""
    from flowwarden_django.models import SnapshotRecord, WorkflowMessage, WorkflowRun

    WorkflowMessage.objects.filter(coordination_id__startswith=PREFIX).delete()
    SnapshotRecord.objects.filter(coordination_id__startswith=PREFIX).delete()
    WorkflowRun.objects.filter(coordination_id__startswith=PREFIX).delete()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its results."""
    args = parse_args(argv)
    target = pg_target()
    ensure_database(target)
    configure_django(target)

    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    define_workflow()
    cleanup()
    vacuum_workflow_tables()
    version, synchronous_commit = server_info()
    print(
        f"PostgreSQL {version}, synchronous_commit={synchronous_commit}; "
        f"{args.rounds} rounds x {args.runs} runs per path, in-process execution",
        flush=True,
    )
    raw = Raw()
    engine: list[float] = []
    notify: list[float] = []
    poll: list[float] = []
    rates: dict[str, list[float]] = {"engine": [], "batch": [], "raw": []}
    #: Each round's own ratios (latency: raw NOTIFY median / engine median; rate).
    round_ratios: dict[str, list[float]] = {"latency": [], "rate": []}
    try:
        engine_latencies(args.warmup)  # warm-up
        raw.notify_latencies(args.warmup)
        raw.poll_latencies(args.warmup)
        engine_rate(args.warmup)
        raw.insert_rate(args.warmup)
        kinds = statements_per_delivery()
        for index in range(args.rounds):
            paths = [
                lambda: engine.extend(engine_latencies(args.runs)),
                lambda: notify.extend(raw.notify_latencies(args.runs)),
                lambda: poll.extend(raw.poll_latencies(args.runs)),
                lambda: rates["engine"].append(engine_rate(args.runs)),
                lambda: rates["batch"].append(engine_rate(args.runs, one_transaction=True)),
                lambda: rates["raw"].append(raw.insert_rate(args.runs)),
            ]
            for path in paths if index % 2 == 0 else reversed(paths):
                path()
            latest = statistics.median(engine[-args.runs :])
            latest_raw = statistics.median(notify[-args.runs :])
            round_ratios["latency"].append(latest_raw / latest)
            round_ratios["rate"].append(rates["engine"][-1] / rates["raw"][-1])
            print(
                f"  round {index + 1}: send to next step {ms(latest)}, raw INSERT+NOTIFY "
                f"{ms(latest_raw)} (ratio {round_ratios['latency'][-1]:.3f}); "
                f"{rates['engine'][-1]:.0f} messages/s "
                f"({rates['batch'][-1]:.0f}/s in one transaction), "
                f"raw {rates['raw'][-1]:.0f} INSERTs/s (ratio {round_ratios['rate'][-1]:.3f})",
                flush=True,
            )
            cleanup()
    finally:
        raw.close()
        cleanup()

    statements = sum(kinds.values())
    print(
        f"statements per delivered message (send, wake, continue, step): {statements} ("
        + ", ".join(f"{kind} {count}" for kind, count in kinds.most_common())
        + ")"
    )
    for label, samples in (
        ("send to next step (engine):   ", engine),
        ("raw INSERT + NOTIFY round trip:", notify),
        ("raw INSERT + poll round trip:  ", poll),
    ):
        print(f"{label} median {ms(statistics.median(samples))}, p99 {ms(p99(samples))}")
    print(
        f"latency ratio (raw NOTIFY / engine, median): "
        f"{statistics.median(notify) / statistics.median(engine):.3f}; "
        f"p99: {p99(notify) / p99(engine):.3f}; median of the rounds' ratios: "
        f"{statistics.median(round_ratios['latency']):.3f}"
    )
    engine_rate_ = statistics.median(rates["engine"])
    batch_rate = statistics.median(rates["batch"])
    raw_rate = statistics.median(rates["raw"])
    print(
        f"messages delivered per second, one process: {engine_rate_:.0f}/s "
        f"(all sends in one transaction: {batch_rate:.0f}/s)"
    )
    print(f"raw message-row INSERTs per second:          {raw_rate:.0f}/s")
    print(
        f"throughput ratio (engine / raw INSERTs):     {engine_rate_ / raw_rate:.3f} "
        f"(one transaction: {batch_rate / raw_rate:.3f}); median of the rounds' ratios: "
        f"{statistics.median(round_ratios['rate']):.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
