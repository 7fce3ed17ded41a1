"""The stream consumer of the stream partition tests, a process of its own:
``python -m tests.faults.partitioned_stream threads|asyncio|parallel STREAM``.

It runs one transactional stream, ``STREAM`` on ``app.orders`` of the MongoDB that
``FW_FAULT_MONGO_URL`` names (the development MongoDB, through a forwarder), with the
ORM checkpoint store on the PostgreSQL database of ``FW_WF_DB_*`` (as
``tests.support.workflow_procs``; ``FW_WF_DB_OPTIONS``: the libpq parameters, JSON),
under a ``StreamManager`` that publishes its status there, as
``flowwarden_streams run`` does: ``threads`` (a thread of its own), ``asyncio``
(a task on the event loop of ``AsyncStreamManager``) or ``parallel`` (threads,
``parallelism=PARALLELISM``, keyed by ``seq % KEYS``). ``FW_FAULT_FLOWWARDEN`` (JSON)
is merged into ``FLOWWARDEN``.

Each insert ``{_id: n, seq: n}`` writes one ``Effect`` row (``order_id=n``,
``stream=STREAM``) in the transaction of the event's anchor (or settled mark).

It prints JSON lines (``t``: ``time.time()``): ``handled`` (``seq``) once an event's
transaction committed; ``state`` (``state``, ``error``: the last error's class) each
time the consumer's state or last error changes, as ``manager.status()`` says it;
``log`` for each warning the package logs; ``stopped`` after SIGTERM stopped it.
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

RUNNERS = ("threads", "asyncio", "parallel")
PARALLELISM = 4
KEYS = 8


_PRINTING = threading.Lock()


def _emit(event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, "t": time.time(), **fields}, default=str)
    with _PRINTING:  # one write a line: handler threads print at once
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class _EmitWarnings(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        _emit("log", logger=record.name, message=record.getMessage()[:300])


def _configure() -> None:
    from tests.support.line_processes import configure_process

    configure_process(
        {
            "INSTANCE_ID": f"fault-{os.getpid()}",
            "CHECKPOINT_STORES": {
                "default": {"BACKEND": "flowwarden_django.streams.backends.orm.OrmCheckpointStore"}
            },
            "MONGO_CLIENTS": {"default": {"URL": os.environ["FW_FAULT_MONGO_URL"]}},
            "STREAM_MAX_AWAIT_MS": 200,
            "STATUS_INTERVAL": "500ms",
            **json.loads(os.environ.get("FW_FAULT_FLOWWARDEN", "{}")),
        }
    )
    logging.getLogger("flowwarden_django").addHandler(_EmitWarnings(logging.WARNING))


def declare(name: str, runner: str) -> None:
    """Declare the stream *name* for *runner*."""
    from django.db import transaction

    from flowwarden_django.streams.registry import change_stream, checkpoint
    from tests.testapp.models import Effect

    parallel = runner == "parallel"

    @change_stream(
        name=name,
        database="app",
        collection="orders",
        transactional=True,
        parallelism=PARALLELISM if parallel else 1,
        key=(lambda event: event["fullDocument"]["seq"] % KEYS) if parallel else None,
    )
    @checkpoint(save_every_n=10 if parallel else 1, save_interval_seconds=0)
    class PartitionedOrders:
        """One ``Effect`` row per insert, committed with its anchor."""

        def on_insert(self, doc: dict[str, Any]) -> None:
            seq = doc["seq"]
            Effect.objects.create(order_id=seq, stream=name)
            transaction.on_commit(lambda: _emit("handled", seq=seq))


def main(argv: list[str]) -> int:
    runner, name = argv[0], argv[1]
    if runner not in RUNNERS:
        raise SystemExit(f"runner must be one of {RUNNERS}")
    _configure()
    declare(name, runner)
    from flowwarden_django.streams.runtime.async_manager import new_stream_manager

    manager = new_stream_manager("asyncio" if runner == "asyncio" else "threads")
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    manager.start(name)
    _emit("started", pid=os.getpid())
    last: tuple[str, str] | None = None
    while not stop.wait(0.1):
        row = next(r for r in manager.status() if r["name"] == name)
        consumer = manager.consumer(name)
        error = consumer.last_error if consumer is not None else None
        now = (row["state"], type(error).__name__ if error is not None else "")
        if now != last:
            _emit("state", state=now[0], error=now[1], message=str(error or "")[:200])
            last = now
    manager.stop_all(timeout=8)
    _emit("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
