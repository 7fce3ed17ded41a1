"""Fixtures of the Celery integration tests: the Redis broker, a queue of each test's
own and its worker subprocesses (``tests.support.celery_workflow_settings``)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from django.db import connections

from tests.support.celery_procs import CeleryWorker as Worker
from tests.support.celery_workflow_settings import transport_options
from tests.support.services import SERVICES

ROOT = Path(__file__).resolve().parents[2]
#: The database alias the workers write to (their ``default``).
DB = "postgres"


@pytest.fixture
def broker_url() -> str:
    server = SERVICES["redis"]
    return f"redis://{server.host}:{server.port}/14"


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    server = SERVICES["redis"]
    client = redis.Redis(host=server.host, port=server.port, db=14)
    yield client
    client.close()


@pytest.fixture
def queue(broker_url: str, redis_client: redis.Redis) -> Iterator[str]:
    """A queue of this test alone; afterwards it is deleted with its bindings and the
    transport's unacked-message keys of its workers."""
    name = f"fw-wf-tests-{uuid.uuid4().hex[:12]}"
    yield name
    from kombu import Connection, Exchange, Queue

    with Connection(broker_url) as connection:
        bound = Queue(name, Exchange(name), routing_key=name)(connection.default_channel)
        bound.declare()  # a channel deletes only the bindings it knows of
        bound.delete()
    options = transport_options(name)
    redis_client.delete(
        options["unacked_key"], options["unacked_index_key"], options["unacked_mutex_key"]
    )


@pytest.fixture
def start_worker(tmp_path: Path, broker_url: str, queue: str) -> Iterator[Callable[..., Worker]]:
    """``start_worker(pool, lease=..., visibility_timeout=...)``: a worker of this test's
    queue; every worker started is SIGKILLed (its process group) at teardown."""
    workers: list[Worker] = []

    def start(
        pool: list[str],
        *,
        lease: str = "10m",
        visibility_timeout: float | None = None,
        execution: str = "",
        env: dict[str, str] | None = None,
    ) -> Worker:
        db = connections[DB].settings_dict
        extra = env or {}
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "tests.support.celery_workflow_settings",
            "FLOWWARDEN_CELERY_DB_NAME": db["NAME"],
            "FLOWWARDEN_CELERY_DB_HOST": str(db["HOST"]),
            "FLOWWARDEN_CELERY_DB_PORT": str(db["PORT"]),
            "FLOWWARDEN_CELERY_DB_USER": str(db["USER"]),
            "FLOWWARDEN_CELERY_DB_PASSWORD": str(db["PASSWORD"]),
            "FLOWWARDEN_CELERY_BROKER_URL": broker_url,
            "FLOWWARDEN_CELERY_QUEUE": queue,
            "FLOWWARDEN_CELERY_RUN_LEASE": lease,
            "FLOWWARDEN_CELERY_WORKFLOW_EXECUTION": execution,
        }
        for name in (
            "FLOWWARDEN_CELERY_VISIBILITY_TIMEOUT",
            "FLOWWARDEN_TEST_CELERY_INSTALL",
            "FLOWWARDEN_CELERY_RUN_STREAMS",
        ):
            env.pop(name, None)
        if visibility_timeout is not None:
            env["FLOWWARDEN_CELERY_VISIBILITY_TIMEOUT"] = str(visibility_timeout)
        env.update(extra)
        worker = Worker(env, pool, tmp_path / f"worker-{len(workers) + 1}.log")
        worker.env = env  # what a beat beside it runs with
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.kill()
