"""The workflow of ``bench/queues.py`` and its raw Celery anchor, defined in every process
that runs them (the benchmark, and the Celery worker through ``CELERY_IMPORTS`` of
``bench.queues_settings``).

``bench.queues`` has :data:`STEPS` steps; each waits ``state["ms"]`` milliseconds (the
call to a carrier's or a payment provider's API that a queue exists to throttle; 0:
a trivial step), increments the state's counter and records the id of the process
that ran it. A run is put on the queue by its start (``start(..., queue=QUEUE)``), so
the queued and the unqueued runs are runs of one definition.

``bench.raw_queued_step`` is the raw Celery step: the same wait, then one
autocommitted ``INSERT`` of a snapshot-shaped row (``bench/providers_app/raw_chain.py``
without the wait).

With ``FLOWWARDEN_BENCH_COUNT_FILE`` set, the worker counts the statements of each
flowwarden step task of a run whose id starts with :data:`COUNT_PREFIX` (Django's
execute wrappers, by kind) and appends one JSON line per task to that file.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from typing import Any

from celery import chain, shared_task

from bench.providers_app.raw_chain import connection
from bench.raw_rows import insert_sql, row
from flowwarden_django.workflows import Workflow, WorkflowStep, advance, step
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore

NAME = "bench.queues"
STEPS = 5
USING = "default"
#: The queue of the queued runs (``FLOWWARDEN["WORKFLOW_QUEUES"]``).
QUEUE = "bench-queue"
#: The runs whose step tasks the worker counts the statements of.
COUNT_PREFIX = "bench-q-count-"
RAW_STEP = "bench.raw_queued_step"


def _make(number: int) -> WorkflowStep:
    @step(f"s{number}")
    def call(state: dict[str, Any]) -> Any:
        if state["ms"]:
            time.sleep(state["ms"] / 1000)
        return advance({**state, "n": state["n"] + 1, "pid": os.getpid()})

    return call


BENCH = Workflow.define(
    NAME,
    [_make(number) for number in range(1, STEPS + 1)],
    OrmSnapshotStore(using=USING),
    using=USING,
)


@shared_task(name=RAW_STEP, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def raw_step(carried: dict[str, Any]) -> dict[str, Any]:
    """Wait as a step does, insert the next row of the chain; what the next task needs."""
    state = carried["state"]
    if state["ms"]:
        time.sleep(state["ms"] / 1000)
    seq = carried["seq"] + 1
    state = {**state, "n": state["n"] + 1, "pid": os.getpid()}
    values = row(carried["cid"], seq, carried["parent"], state, f"s{seq - 1}")
    with connection().cursor() as cursor:
        cursor.execute(insert_sql(), values)
    return {"cid": carried["cid"], "seq": seq, "parent": values[0], "state": state}


def start_raw_chain(cid: str, state: dict[str, Any]) -> None:
    """Insert the seed row of *cid* and publish its chain of :data:`STEPS` tasks."""
    seed = row(cid, 1, None, state, "")
    with connection().cursor() as cursor:
        cursor.execute(insert_sql(), seed)
    first = {"cid": cid, "seq": 1, "parent": seed[0], "state": state}
    chain(raw_step.s(first), *(raw_step.s() for _ in range(STEPS - 1))).apply_async()


def statement_kind(sql: str, params: Any = None) -> str:
    """A statement's kind: ``queue`` for the queue's own (its slot rows, or the runs
    waiting for a slot), else its first word (``SELECT``, ``INSERT``, ...)."""
    text = sql.lstrip()
    if "workflowqueueslot" in text.lower() or "waiting_slot" in f"{text} {params!r}":
        return "queue " + (text.split(None, 1)[0].upper() if text else "?")
    return text.split(None, 1)[0].upper() if text else "?"


_COUNT_FILE = os.environ.get("FLOWWARDEN_BENCH_COUNT_FILE")
if _COUNT_FILE:
    from celery.signals import task_postrun, task_prerun

    _counting = threading.local()
    _write = threading.Lock()

    def _count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        _counting.kinds[statement_kind(sql, params)] += 1
        return execute(sql, params, many, context)

    @task_prerun.connect
    def _begin(task: Any = None, kwargs: Any = None, **_: Any) -> None:
        from django.db import connections

        cid = (kwargs or {}).get("coordination_id") or ""
        if not cid.startswith(COUNT_PREFIX):
            return
        _counting.cid = cid
        _counting.kinds = Counter()
        connections[USING].execute_wrappers.append(_count)

    @task_postrun.connect
    def _end(**_: Any) -> None:
        from django.db import connections

        cid = getattr(_counting, "cid", None)
        if cid is None:
            return
        _counting.cid = None
        wrappers = connections[USING].execute_wrappers
        if _count in wrappers:
            wrappers.remove(_count)
        line = json.dumps({"cid": cid, "kinds": dict(_counting.kinds)})
        with _write, open(_COUNT_FILE, "a", encoding="utf-8") as out:
            out.write(line + "\n")
