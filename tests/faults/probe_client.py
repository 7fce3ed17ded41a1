"""A client of PostgreSQL or Redis that the fault tests run inside a namespace:
``python -m tests.faults.probe_client postgres|redis HOST PORT [DBNAME]``.

It connects as the package would (PostgreSQL with ``postgres_options()``, the libpq
parameters ``check --deploy`` asks for; Redis through ``RedisConnection(url=...)``, with
the timeouts of ``DEAD_CONNECTION_TIMEOUT``), then sends a trivial request every
0.2 s on that one connection, printing one JSON line per change: ``ok`` when requests
are answered, ``error`` (with ``t``, ``time.time()``, and the error) when one fails.
After an error it connects again, as a worker does, until SIGTERM.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


def _postgres(host: str, port: str, dbname: str) -> Callable[[], Callable[[], Any]]:
    import psycopg

    from flowwarden_django.common.network import postgres_options

    def connect() -> Callable[[], Any]:
        conn = psycopg.connect(
            host=host,
            port=port,
            dbname=dbname,
            user="postgres",
            autocommit=True,
            **postgres_options(),
        )
        return lambda: conn.execute("SELECT 1").fetchone()

    return connect


def _redis(host: str, port: str) -> Callable[[], Callable[[], Any]]:
    from flowwarden_django.streams.backends._redis_common import RedisConnection

    def connect() -> Callable[[], Any]:
        client = RedisConnection(url=f"redis://{host}:{port}/0").client
        return client.ping

    return connect


def main(argv: list[str]) -> None:
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=[],
        FLOWWARDEN=json.loads(os.environ.get("FW_FAULT_FLOWWARDEN", "{}")),
    )
    django.setup()
    kind, host, port = argv[0], argv[1], argv[2]
    connect = _postgres(host, port, argv[3]) if kind == "postgres" else _redis(host, port)
    request: Callable[[], Any] | None = None
    last = ""
    while True:
        started = time.time()
        try:
            if request is None:
                request = connect()
            request()
            if last != "ok":
                _emit("ok")
                last = "ok"
        except Exception as exc:
            request = None
            _emit("error", started=started, error=type(exc).__name__, message=str(exc)[:200])
            last = "error"
        time.sleep(0.2)


if __name__ == "__main__":
    main(sys.argv[1:])
