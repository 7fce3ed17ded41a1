"""The single-leader stream of the lease partition tests and its processes.

``python -m tests.faults.leader_stream consume INSTANCE RUNNER`` runs
``flowwarden_streams run --RUNNER --stream fw-leader-orders`` as instance *INSTANCE*:
the stream is ``SINGLE_LEADER`` on ``app.orders`` of the MongoDB at
``FW_LS_MONGO_URL``, its lease on the Redis lock service at ``FW_LS_REDIS_URL``, its
checkpoints and status rows in the PostgreSQL database the environment names (as
``tests.faults.partitioned_workflow``: ``FW_WF_DB_*``); ``FW_LS_FLOWWARDEN`` (JSON)
is merged into ``FLOWWARDEN``.

It prints JSON lines (``t``: ``time.time()``, ``m``: ``time.monotonic()``, one clock
for every process of the host): ``handled`` for each event (``seq``, ``instance``,
``m0`` and ``m1``: the handler's start and end), and ``log`` for each line the package
logs at INFO or above (how the test sees the lease lost, retried and taken).

``python -m tests.faults.leader_stream serve`` is the MongoDB: a scripted replica set
that prints ``READY <uri>`` and, on each SIGUSR1, logs the next ``BATCH`` inserts
``{_id: n, seq: n}`` and prints ``FED <last seq>``; it serves until SIGTERM.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

STREAM = "fw-leader-orders"
BATCH = 300
#: Seconds each event's handler takes: a batch keeps the leader busy for 3 s.
HANDLER_SECONDS = 0.01


def _emit(event: str, **fields: Any) -> None:
    line = json.dumps(
        {"event": event, "t": time.time(), "m": time.monotonic(), **fields}, default=str
    )
    print(line, flush=True)


class _EmitLogs(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        _emit("log", logger=record.name, level=record.levelname, message=record.getMessage())


def _configure(instance: str) -> None:
    from tests.support.line_processes import configure_process

    configure_process(
        {
            "INSTANCE_ID": instance,
            "CHECKPOINT_STORES": {
                "default": {"BACKEND": "flowwarden_django.streams.backends.orm.OrmCheckpointStore"}
            },
            "LOCK_SERVICES": {
                "default": {
                    "BACKEND": "flowwarden_django.streams.backends.redis.RedisLockService",
                    "OPTIONS": {"url": os.environ["FW_LS_REDIS_URL"]},
                }
            },
            "MONGO_CLIENTS": {
                "default": {
                    "URL": os.environ["FW_LS_MONGO_URL"],
                    "OPTIONS": {"serverSelectionTimeoutMS": 10_000},
                }
            },
            "STREAM_MAX_AWAIT_MS": 50,
            "STATUS_INTERVAL": "250ms",
            **json.loads(os.environ.get("FW_LS_FLOWWARDEN", "{}")),
        }
    )
    handler = _EmitLogs(logging.INFO)
    package = logging.getLogger("flowwarden_django")
    package.addHandler(handler)
    package.setLevel(logging.INFO)


def consume(instance: str, runner: str) -> int:
    _configure(instance)
    from django.core.management import call_command

    from flowwarden_django.streams import register_stream
    from flowwarden_django.streams.spec import CheckpointSpec

    def on_insert(doc: dict[str, Any], ctx: Any) -> None:
        started = time.monotonic()
        time.sleep(HANDLER_SECONDS)
        _emit("handled", seq=doc["seq"], instance=instance, m0=started, m1=time.monotonic())

    register_stream(
        STREAM,
        "orders",
        database="app",
        on_insert=on_insert,
        deployment_mode="SINGLE_LEADER",
        # No anchor write (a fenced call to the lock service) within a batch: only the
        # lease's own clock stops the cut-off leader, not a write stuck in the partition.
        checkpoint=CheckpointSpec(save_every_n=10 * BATCH, save_interval_seconds=0),
    )
    _emit("started", pid=os.getpid())
    call_command("flowwarden_streams", "run", f"--{runner}", "--stream", STREAM)
    _emit("exited")
    return 0


def serve() -> int:
    from flowwarden_django.testkit.scripted_mongo import ScriptedReplicaSet

    stopping, feeds = threading.Event(), threading.Semaphore(0)
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGUSR1, lambda *_: feeds.release())
    with ScriptedReplicaSet(port=0) as server:
        print(f"READY {server.uri}", flush=True)
        last = 0
        while not stopping.wait(0.02):
            while feeds.acquire(blocking=False):
                docs = [{"_id": n, "seq": n} for n in range(last + 1, last + BATCH + 1)]
                server.insert_many("app", "orders", docs)
                last += BATCH
                print(f"FED {last}", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        sys.exit(serve())
    sys.exit(consume(sys.argv[2], sys.argv[3]))
