"""Celery integration: streams in a real ``celery worker``, replay and purge as tasks.

The worker is a real subprocess, ``celery -A tests.support.celery_app worker``, with
``DJANGO_SETTINGS_MODULE=tests.support.celery_settings``: its default database is the
PostgreSQL test database of this run and its broker (and result backend) is Redis
db 14, on a queue of its own. Its stream (``tests/support/celery_streams.py``) reads a
``ScriptedReplicaSet`` started in this process and writes one ``Effect`` row per
insert. Everything is checked from the data.

The stream's checkpoint policy (``save_every_n=1000, save_interval_seconds=0``)
writes no processed anchor for the few events fed here, so when the anchor equals
the last event's token after SIGTERM, the worker's warm shutdown flushed it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("celery", reason="the Celery tests need celery")
pytest.importorskip("pymongo", reason="the Celery stream test needs pymongo")
pytest.importorskip("mockupdb", reason="the scripted MongoDB server needs mockupdb==1.8.1")

from celery import Celery
from django.db import connections
from django.test import override_settings
from django.utils import timezone

from flowwarden_django.integrations.celery import StreamsBootstep, install, install_from_settings
from flowwarden_django.integrations.celery import tasks as fw_tasks
from flowwarden_django.streams.backends.orm import OrmCheckpointStore, OrmDlqStore
from flowwarden_django.streams.dlq import (
    DISCARDED,
    PENDING,
    REPLAYED,
    DeadLetter,
    DlqPolicy,
    ErrorInfo,
)
from flowwarden_django.testkit.scripted_mongo import ScriptedReplicaSet
from tests.support.celery_procs import CeleryWorker as Worker
from tests.support.celery_procs import wait_until as _wait_until
from tests.support.lanes import lane_marks
from tests.support.services import SERVICES
from tests.testapp.models import Effect

ROOT = Path(__file__).resolve().parents[2]
STREAM = "celery-orders"  # tests/support/celery_streams.py
EVENTS = 50
#: Written by StreamsBootstep.start: how the log tells whether streams ran.
STARTED_LINE = "flowwarden: streams running in worker"
#: Upper bound of the waits: a hang fails the test instead of blocking CI.
PROGRESS_TIMEOUT = 60.0


def on_servers(test: Callable[..., Any]) -> Callable[..., Any]:
    """The postgres and redis lanes: skipped, or failed in CI, when a server is down."""
    for mark in [*lane_marks("postgres", databases=["postgres"]), pytest.mark.lane("redis")]:
        test = mark(test)
    return test


@pytest.fixture
def broker_url() -> str:
    redis = SERVICES["redis"]
    return f"redis://{redis.host}:{redis.port}/14"


@pytest.fixture
def queue(broker_url: str) -> Iterator[str]:
    """A queue of this test alone, so no other run's tasks reach its worker; deleted
    afterwards (with its bindings)."""
    name = f"fw-tests-{uuid.uuid4().hex[:12]}"
    yield name
    from kombu import Connection, Exchange, Queue

    with Connection(broker_url) as connection:
        bound = Queue(name, Exchange(name), routing_key=name)(connection.default_channel)
        bound.declare()  # a channel deletes only the bindings it knows of
        bound.delete()


@pytest.fixture
def mongo() -> Iterator[ScriptedReplicaSet]:
    with ScriptedReplicaSet(port=0) as server:
        yield server
        assert server.internal_errors == []


@pytest.fixture
def start_worker(tmp_path: Path, broker_url: str, queue: str) -> Iterator[Callable[..., Worker]]:
    """``start_worker(pool=[...], mongo_url=..., **env)``: a worker of this test's queue;
    every worker started is killed at teardown."""
    workers: list[Worker] = []

    def start(pool: list[str], mongo_url: str = "mongodb://127.0.0.1:1/", **extra: str) -> Worker:
        db = connections["postgres"].settings_dict
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "tests.support.celery_settings",
            "FLOWWARDEN_CELERY_DB_NAME": db["NAME"],
            "FLOWWARDEN_CELERY_DB_HOST": str(db["HOST"]),
            "FLOWWARDEN_CELERY_DB_PORT": str(db["PORT"]),
            "FLOWWARDEN_CELERY_DB_USER": str(db["USER"]),
            "FLOWWARDEN_CELERY_DB_PASSWORD": str(db["PASSWORD"]),
            "FLOWWARDEN_CELERY_MONGO_URL": mongo_url,
            "FLOWWARDEN_CELERY_BROKER_URL": broker_url,
            "FLOWWARDEN_CELERY_QUEUE": queue,
            **extra,
        }
        for name in ("FLOWWARDEN_TEST_CELERY_INSTALL", "FLOWWARDEN_CELERY_RUN_STREAMS"):
            if name not in extra:
                env.pop(name, None)
        worker = Worker(env, pool, tmp_path / f"worker-{len(workers) + 1}.log")
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.kill()


# -- streams in the worker ---------------------------------------------------------------- #


def _effects() -> list[int]:
    rows = Effect.objects.using("postgres").filter(stream=STREAM).order_by("order_id")
    return list(rows.values_list("order_id", flat=True))


@on_servers
@pytest.mark.parametrize(
    ("enabled_by", "pool"),
    [
        # prefork with two children: the streams run once, in the main process.
        ("install", ["--pool=prefork", "--concurrency=2"]),
        ("setting", ["--pool=solo"]),
    ],
)
def test_worker_runs_streams_and_warm_shutdown_flushes(enabled_by, pool, mongo, start_worker):
    """Events are handled in the worker; SIGTERM stops it and flushes the processed anchor.

    ``install``: the app calls ``install(app)``. ``setting``: the app does not, and
    ``FLOWWARDEN["CELERY_RUN_STREAMS"] = True`` is what adds the step.
    """
    store = OrmCheckpointStore(using="postgres")
    assert store.find(STREAM) is None
    enable = (
        {"FLOWWARDEN_TEST_CELERY_INSTALL": "1"}
        if enabled_by == "install"
        else {"FLOWWARDEN_CELERY_RUN_STREAMS": "1"}
    )
    worker = start_worker(pool, mongo_url=mongo.uri, **enable)

    # The stream's first run persists its start position before any event exists...
    _wait_until(
        lambda: store.find(STREAM) is not None,
        PROGRESS_TIMEOUT,
        "the stream to persist its start position",
        worker,
    )
    # ... then the orders arrive.
    tokens = mongo.insert_many(
        "app", "orders", ({"_id": n, "seq": n} for n in range(1, EVENTS + 1))
    )
    _wait_until(
        lambda: len(_effects()) >= EVENTS, PROGRESS_TIMEOUT, f"{EVENTS} Effect rows", worker
    )
    # Fewer than save_every_n events and no age trigger: nothing has written the anchor.
    assert store.find(STREAM).last_processed_token is None

    assert worker.terminate() == 0, worker.log_tail()

    assert store.find(STREAM).last_processed_token == tokens[-1]
    # Every event exactly once: one consumer ran, not one per pool process.
    assert _effects() == list(range(1, EVENTS + 1))
    log = worker.log()
    # Started once, by the main process (the pid celery was started as).
    assert log.count(STARTED_LINE) == 1, worker.log_tail()
    assert f"(pid {worker.proc.pid})" in log
    assert "flowwarden: streams stopped" in log


# -- replay and purge as tasks ------------------------------------------------------------- #


@pytest.fixture
def producer(broker_url: str, queue: str) -> Iterator[Celery]:
    """A client app sending to this test's queue; not made the current app."""
    app = Celery(
        "fw-tests-producer",
        broker=broker_url,
        backend=broker_url,
        fixups=[],
        set_as_current=False,
    )
    app.conf.task_default_queue = queue
    yield app
    app.close()


def _dead_letter(entry_id: str, seq: int, **changes: Any) -> DeadLetter:
    at = changes.pop("created_at", timezone.now())
    return DeadLetter(
        id=entry_id,
        stream_name=STREAM,
        operation_type="insert",
        error=ErrorInfo("ValueError", "the handler failed"),
        attempts=3,
        created_at=at,
        first_attempt_at=at,
        last_attempt_at=at,
        document_key={"_id": seq},
        full_document={"_id": seq, "seq": seq},
        **changes,
    )


def _result(task_result: Any, worker: Worker) -> Any:
    _wait_until(task_result.ready, PROGRESS_TIMEOUT, f"task {task_result.id}", worker)
    try:
        return task_result.get(timeout=0)
    finally:
        task_result.forget()


@on_servers
def test_replay_and_purge_tasks_run_in_a_worker(start_worker, producer):
    """``.delay()`` of each task: the worker replays through the stream's handler (an
    ``Effect`` row per entry) and purges expired entries. That worker's app calls no
    ``install`` and ``CELERY_RUN_STREAMS`` is off, so it runs no stream."""
    dlq = OrmDlqStore(using="postgres")
    now = timezone.now()
    policy = DlqPolicy()
    dlq.save(_dead_letter("first", 101), policy)
    dlq.save(_dead_letter("older", 102, created_at=now - timedelta(minutes=2)), policy)
    dlq.save(_dead_letter("newer", 103, created_at=now - timedelta(minutes=1)), policy)
    expired = _dead_letter("expired", 104, status=DISCARDED, expires_at=now - timedelta(days=1))
    dlq.save(expired, policy)
    worker = start_worker(["--pool=solo"])
    tasks = producer.tasks

    outcomes = _result(
        tasks["flowwarden_django.replay_dead_letters"].delay(["first", "missing"], by="ops"),
        worker,
    )
    assert outcomes == [
        {"entry_id": "first", "succeeded": True, "status": REPLAYED, "error": ""},
        {"entry_id": "missing", "succeeded": False, "status": "", "error": "no such dead letter"},
    ]
    assert dlq.find_by_id("first").status == REPLAYED
    assert dlq.find_by_id("first").resolved_by == "ops"
    assert _effects() == [101]

    outcomes = _result(tasks["flowwarden_django.replay_stream"].delay(STREAM), worker)
    assert [(o["entry_id"], o["status"]) for o in outcomes] == [
        ("older", REPLAYED),
        ("newer", REPLAYED),
    ]
    assert _effects() == [101, 102, 103]
    assert dlq.find_by_stream(STREAM, status=PENDING) == []

    assert _result(tasks["flowwarden_django.purge_dead_letters"].delay(), worker) == {"default": 1}
    assert dlq.find_by_id("expired") is None
    assert dlq.find_by_id("first") is not None

    assert worker.terminate() == 0, worker.log_tail()
    # StreamsBootstep.start logs before the worker consumes its first task.
    assert STARTED_LINE not in worker.log()


# -- without a worker ----------------------------------------------------------------------- #


def test_install_adds_the_step_once_and_registers_the_tasks():
    app = Celery("fw-tests-install", fixups=[], set_as_current=False)
    install(app)
    install(app)
    assert [step for step in app.steps["worker"] if step is StreamsBootstep] == [StreamsBootstep]
    assert {
        "flowwarden_django.replay_dead_letters",
        "flowwarden_django.replay_stream",
        "flowwarden_django.purge_dead_letters",
    } <= set(app.tasks)
    assert StreamsBootstep.requires == ("celery.worker.components:Pool",)


@pytest.mark.parametrize("run_streams", [False, True])
def test_the_setting_adds_the_step_when_a_worker_starts(run_streams):
    app = Celery("fw-tests-setting", fixups=[], set_as_current=False)
    with override_settings(FLOWWARDEN={"CELERY_RUN_STREAMS": run_streams}):
        install_from_settings(sender=SimpleNamespace(app=app))
    assert (StreamsBootstep in app.steps["worker"]) is run_streams


@pytest.mark.django_db
def test_tasks_apply_in_process():
    """``.apply()`` runs the task bodies here, on the default (SQLite) database."""
    assert fw_tasks.purge_dead_letters.apply().get() == {"default": 0}
    assert fw_tasks.replay_dead_letters.apply(args=[["nope"]]).get() == [
        {"entry_id": "nope", "succeeded": False, "status": "", "error": "no such dead letter"}
    ]
    assert fw_tasks.replay_stream.apply(args=["no-such-stream"]).get() == []
