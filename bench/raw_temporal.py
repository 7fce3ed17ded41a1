"""The raw temporalio anchor of ``bench/workflow_providers.py``: a Temporal workflow
that runs N steps, each one activity (or one *local* activity) that commits one
``INSERT`` of a snapshot-shaped row, with none of flowwarden's machinery.

Run as the benchmark's worker subprocess::

    python bench/raw_temporal.py TARGET TASK_QUEUE CONCURRENCY

It prints :data:`READY_LINE` once it polls. The worker has the slots of
``flowwarden_temporal_worker --concurrency N``: N activity threads, N activities and
N local activities at once. Each activity thread keeps its own autocommitted psycopg
connection to the benchmark database (``bench/_postgres.py``'s variables), connected
as Django connects (prepared statements only with ``FLOWWARDEN_BENCH_PG_PREPARE=1``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import threading
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow

from bench.raw_rows import insert_sql, row

WORKFLOW_TYPE = "bench.RawSteps"
ACTIVITY = "bench.raw_insert"
READY_LINE = "flowwarden bench: raw temporal worker ready"


@dataclasses.dataclass
class RawRun:
    """The workflow's argument: the run's id, its steps, its seed row, and whether
    the steps are local activities."""

    coordination_id: str
    steps: int
    seed_id: str
    state: dict[str, Any]
    local: bool


@dataclasses.dataclass
class Carried:
    """What one step hands the next: the parent row, its seq and the state."""

    coordination_id: str
    seq: int
    parent: str
    state: dict[str, Any]


@workflow.defn(name=WORKFLOW_TYPE)
class RawSteps:
    """N steps, one (local) activity each, one after the other."""

    @workflow.run
    async def run(self, run: RawRun) -> int:
        carried = Carried(run.coordination_id, 1, run.seed_id, run.state)
        timeout = timedelta(seconds=60)
        for _ in range(run.steps):
            if run.local:
                carried = await workflow.execute_local_activity(
                    ACTIVITY, carried, result_type=Carried, start_to_close_timeout=timeout
                )
            else:
                carried = await workflow.execute_activity(
                    ACTIVITY, carried, result_type=Carried, start_to_close_timeout=timeout
                )
        return carried.seq


_local = threading.local()


def _connection() -> Any:
    import psycopg

    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        # As Django connects (bench/_postgres.py): prepared statements only with
        # FLOWWARDEN_BENCH_PG_PREPARE=1, else client-side binding, nothing prepared.
        prepared = os.environ.get("FLOWWARDEN_BENCH_PG_PREPARE") == "1"
        conn = psycopg.connect(
            prepare_threshold=5 if prepared else None,
            cursor_factory=psycopg.Cursor if prepared else psycopg.ClientCursor,
            host=os.environ.get("FLOWWARDEN_BENCH_PG_HOST", "127.0.0.1"),
            port=os.environ.get("FLOWWARDEN_BENCH_PG_PORT", "5432"),
            user=os.environ.get("FLOWWARDEN_BENCH_PG_USER", "postgres"),
            dbname=os.environ.get("FLOWWARDEN_BENCH_PG_DB", "fw_bench"),
            autocommit=True,
        )
        _local.conn = conn
    return conn


@activity.defn(name=ACTIVITY)
def raw_insert(carried: Carried) -> Carried:
    """Insert the next row; what the next step needs."""
    seq = carried.seq + 1
    state = {**carried.state, "n": carried.state["n"] + 1, "pid": os.getpid()}
    values = row(carried.coordination_id, seq, carried.parent, state, f"s{seq - 1:02d}")
    with _connection().cursor() as cursor:
        cursor.execute(insert_sql(), values)
    return Carried(carried.coordination_id, seq, values[0], state)


def insert_seed(conn: Any, cid: str, state: dict[str, Any]) -> str:
    """Insert the seed row of run *cid* (as a run's start writes its seed); its id."""
    values = row(cid, 1, None, state, "")
    with conn.cursor() as cursor:
        cursor.execute(insert_sql(), values)
    return values[0]


async def serve(target: str, task_queue: str, concurrency: int) -> None:
    """Run the worker until SIGTERM."""
    import signal
    from concurrent.futures import ThreadPoolExecutor

    from temporalio.client import Client
    from temporalio.worker import Worker

    client = await Client.connect(target)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[RawSteps],
        activities=[raw_insert],
        activity_executor=ThreadPoolExecutor(concurrency, thread_name_prefix="raw-step"),
        max_concurrent_activities=concurrency,
        max_concurrent_local_activities=concurrency,
    )
    async with worker:
        print(READY_LINE, flush=True)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], sys.argv[2], int(sys.argv[3])))
