"""The raw Celery anchor of ``bench/workflow_providers.py``: a chain of plain Celery
tasks, each committing one ``INSERT`` of a snapshot-shaped row, with none of
flowwarden's machinery (no run record, no claim, no engine).

A run is ``chain(raw_step.s(first), raw_step.s(), ...)``: each task receives the
previous one's return value (the state, the parent row's id and its ``seq``), inserts
its row into the snapshot table on its own psycopg connection (one per worker thread,
autocommitted, opened with Django's connection parameters) and returns its own; the
worker publishes the next task when a task succeeds, as Celery chains do. The task
has the delivery options of flowwarden's step task (``acks_late``,
``reject_on_worker_lost``, no result), so both give the same at-least-once guarantee.
"""

from __future__ import annotations

import threading
from typing import Any

from celery import chain, shared_task

from bench.raw_rows import insert_sql, row

#: The task name (the worker finds it through ``CELERY_IMPORTS``).
RAW_STEP = "bench.raw_step"
_local = threading.local()


def connection() -> Any:
    """This thread's autocommitted psycopg connection to the ``default`` database."""
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        import psycopg
        from django.db import connections

        params = connections["default"].get_connection_params()
        conn = psycopg.connect(**params, autocommit=True)
        _local.conn = conn
    return conn


@shared_task(name=RAW_STEP, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def raw_step(carried: dict[str, Any]) -> dict[str, Any]:
    """Insert the next row of the chain; what the next task needs."""
    import os

    seq = carried["seq"] + 1
    state = {**carried["state"], "n": carried["state"]["n"] + 1, "pid": os.getpid()}
    values = row(carried["cid"], seq, carried["parent"], state, f"s{seq - 1:02d}")
    with connection().cursor() as cursor:
        cursor.execute(insert_sql(), values)
    return {"cid": carried["cid"], "seq": seq, "parent": values[0], "state": state}


def start_chain(cid: str, steps: int, state: dict[str, Any]) -> None:
    """Insert the seed row of *cid* (as a run's start writes its seed) and publish
    its chain of *steps* tasks."""
    seed = row(cid, 1, None, state, "")
    with connection().cursor() as cursor:
        cursor.execute(insert_sql(), seed)
    first = {"cid": cid, "seq": 1, "parent": seed[0], "state": state}
    chain(raw_step.s(first), *(raw_step.s() for _ in range(steps - 1))).apply_async()


def close_connection() -> None:
    """Close this thread's connection, if it has one."""
    conn = getattr(_local, "conn", None)
    if conn is not None:
        conn.close()
        _local.conn = None
