"""Throughput of ``OrmCheckpointStore`` partial writes against the same SQL sent raw.

Run from the repository root::

    .venv/bin/python bench/checkpoint_writes.py [--writes N] [--rounds N] [--warmup N]

What is measured
----------------
1. ``OrmCheckpointStore(using="default").save_processed(stream, token, at)`` on
   PostgreSQL, the call the processed-anchor policy makes after each handled event:
   a fixed stream name, a fresh ``{"_data": "<hex counter>"}`` token and a fresh
   aware timestamp on every write. Each call is one autocommitted upsert.
2. The byte-identical statement (``_upsert_sql`` with the column tuples that
   ``save_processed`` passes) executed directly on a psycopg connection, with the
   same parameter values: the stream name, the BSON bytes of the token
   (``bson.encode``), the aware datetime and ``Jsonb({})`` for the metadata.

Both loops build the token and the timestamp the same way, so the difference
between them is the store's own Python overhead (argument checks, router and
connection lookup, field adaptation, Django's cursor wrapper) on top of the
unavoidable work: BSON encoding, psycopg's client-side binding and the round trip
with its commit.

Why the baseline is fair
------------------------
The raw connection is opened with the keyword arguments Django itself would use,
``connections["default"].get_connection_params()`` (same host, port, user, dbname,
client encoding, Django's adapters map and ``prepare_threshold=None``, i.e. no
prepared statements), with autocommit on and the session time zone set the way
Django sets it. Django 5.2 uses a ``psycopg.ClientCursor`` subclass unless
``OPTIONS["server_side_binding"]`` is true; the baseline uses the psycopg base
class of whatever Django picked (``ClientCursor`` here), so parameters are bound
client-side in both paths. The baseline opens a cursor per write, as
``conn.execute()`` and most hand-written code do; the store keeps one cursor per
connection, an optimisation that is part of what this benchmark measures.
Before measuring, the script checks that the store sends exactly the baseline's
SQL text, and that the statement psycopg finally sends (parameters interpolated)
is identical too. Both paths write the same row, and each round runs both paths,
alternating which goes first, after a warm-up of each, so server-side state such as WAL flushing,
HOT pruning and caches affects both equally; the median over rounds is reported.

PostgreSQL defaults to 127.0.0.1:5432, user ``postgres``, database ``fw_bench``
(created if missing); override with FLOWWARDEN_BENCH_PG_HOST, FLOWWARDEN_BENCH_PG_PORT,
FLOWWARDEN_BENCH_PG_USER and FLOWWARDEN_BENCH_PG_DB. The benchmark's row is deleted
at the end.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bson
import psycopg
from psycopg.types.json import Jsonb

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _args import positive_int  # noqa: E402  (after the path set-up)
from _postgres import (  # noqa: E402  (after the path set-up; bench/ is the script's dir)
    ALIAS,
    configure_django,
    ensure_database,
    open_raw_connection,
    pg_target,
    server_info,
)

STREAM = "bench.checkpoint_writes"
#: The column tuples ``OrmCheckpointStore.save_processed`` passes to ``_upsert_sql``
#: when no heartbeat is given (see ``_save_anchor``); the guard is off.
INSERT_COLUMNS = ("last_processed_token", "last_processed_at", "metadata")
UPDATE_COLUMNS = ("last_processed_token", "last_processed_at")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=positive_int, default=2000, help="writes per round")
    parser.add_argument("--rounds", type=positive_int, default=7, help="rounds per path")
    parser.add_argument(
        "--warmup", type=positive_int, default=300, help="warm-up writes per path (not timed)"
    )
    return parser.parse_args(argv)


def new_token(counter: Iterator[int]) -> dict[str, str]:
    """Return a fresh resume-token-like document."""
    return {"_data": f"{next(counter):032X}"}


def raw_params(token: dict[str, str], at: datetime) -> tuple[Any, ...]:
    """Return the parameters of the raw statement, in placeholder order."""
    return (STREAM, bson.encode(token), at, Jsonb({}))


def check_same_statement(
    store: Any, conn: psycopg.Connection[Any], raw_sql: str, counter: Iterator[int]
) -> None:
    """Exit 1 unless the store sends ``raw_sql`` and the same final statement as psycopg."""
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    django_conn = connections[ALIAS]
    sent: list[str] = []

    def record(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        return execute(sql, params, many, context)

    token, at = new_token(counter), datetime.now(UTC)
    with CaptureQueriesContext(django_conn) as captured, django_conn.execute_wrapper(record):
        store.save_processed(STREAM, token, at)
    if sent != [raw_sql]:
        sys.exit(f"the store sent {sent!r}, not the raw statement {raw_sql!r}")
    with conn.cursor() as cursor:
        final = cursor.mogrify(raw_sql, raw_params(token, at))
    if [query["sql"] for query in captured.captured_queries] != [final]:
        sys.exit(
            f"final statements differ:\n  orm: {captured.captured_queries!r}\n  raw: {final!r}"
        )


def orm_round(store: Any, writes: int, counter: Iterator[int]) -> float:
    """Make *writes* ``save_processed`` calls; return the rate in writes per second."""
    save = store.save_processed
    start = time.perf_counter()
    for _ in range(writes):
        save(STREAM, new_token(counter), datetime.now(UTC))
    return writes / (time.perf_counter() - start)


def raw_round(
    conn: psycopg.Connection[Any], raw_sql: str, writes: int, counter: Iterator[int]
) -> float:
    """Execute the raw statement *writes* times; return the rate in writes per second."""
    start = time.perf_counter()
    for _ in range(writes):
        params = raw_params(new_token(counter), datetime.now(UTC))
        with conn.cursor() as cursor:
            cursor.execute(raw_sql, params)
    return writes / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its results."""
    args = parse_args(argv)
    target = pg_target()
    ensure_database(target)
    configure_django(target)

    from django.core.management import call_command
    from django.db import connections

    from flowwarden_django.streams.backends.orm import OrmCheckpointStore, _upsert_sql

    call_command("migrate", verbosity=0)
    version, synchronous_commit = server_info()
    print(
        f"PostgreSQL {version} at {target['host']}:{target['port']}/{target['dbname']}, "
        f"synchronous_commit={synchronous_commit}; {args.rounds} rounds x {args.writes} "
        f"writes per path, {args.warmup} warm-up writes each",
        flush=True,
    )

    raw_sql = _upsert_sql("postgresql", INSERT_COLUMNS, UPDATE_COLUMNS, False)
    store = OrmCheckpointStore(using=ALIAS)
    conn = open_raw_connection()
    counter = itertools.count(1)
    try:
        store.delete(STREAM)
        check_same_statement(store, conn, raw_sql, counter)
        orm_round(store, args.warmup, counter)
        raw_round(conn, raw_sql, args.warmup, counter)
        orm_rates: list[float] = []
        raw_rates: list[float] = []
        for number in range(1, args.rounds + 1):
            # Alternate which path goes first, so neither always follows the other.
            if number % 2:
                orm_rates.append(orm_round(store, args.writes, counter))
                raw_rates.append(raw_round(conn, raw_sql, args.writes, counter))
            else:
                raw_rates.append(raw_round(conn, raw_sql, args.writes, counter))
                orm_rates.append(orm_round(store, args.writes, counter))
            print(
                f"round {number}/{args.rounds}: orm {orm_rates[-1]:.0f}/s "
                f"raw {raw_rates[-1]:.0f}/s",
                flush=True,
            )
    finally:
        store.delete(STREAM)
        conn.close()
        connections.close_all()

    orm = statistics.median(orm_rates)
    raw = statistics.median(raw_rates)
    print(f"orm store (save_processed): {orm:.0f} writes/s")
    print(f"raw psycopg statement:      {raw:.0f} writes/s")
    print(f"ratio (orm / raw):          {orm / raw:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
