"""A PostgreSQL client cut off inside its transaction, for the fault tests, run inside
a namespace: ``python -m tests.faults.cut_transaction HOST PORT DBNAME KEY GO``.

It connects as the package would (``postgres_options()`` of ``DEAD_CONNECTION_TIMEOUT``
from ``FW_FAULT_FLOWWARDEN``), opens a transaction that takes the advisory lock *KEY*
(a row lock's stand-in: the server releases it with the transaction) and prints
``locked``; once the file *GO* exists (the test cut the link meanwhile) it commits,
and prints ``committed`` or ``error``, as a stream's anchor write whose ``COMMIT`` a
partition swallowed. It prints JSON lines (``t``: ``time.time()``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


def main(argv: list[str]) -> None:
    import django
    import psycopg
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=[], FLOWWARDEN=json.loads(os.environ.get("FW_FAULT_FLOWWARDEN", "{}"))
    )
    django.setup()
    from flowwarden_django.common.network import postgres_options

    host, port, dbname, key, go = argv[0], argv[1], argv[2], int(argv[3]), Path(argv[4])
    conn = psycopg.connect(
        host=host, port=port, dbname=dbname, user="postgres", **postgres_options()
    )
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
    _emit("locked")
    while not go.exists():
        time.sleep(0.05)
    try:
        conn.commit()
    except Exception as exc:
        _emit("error", error=type(exc).__name__)
    else:
        _emit("committed")
    while True:  # until the test stops it
        time.sleep(1)


if __name__ == "__main__":
    main(sys.argv[1:])
