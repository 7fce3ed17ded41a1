"""PostgreSQL plumbing shared by the benchmarks: the ``fw_bench`` database, Django
configured on it, and a raw psycopg connection with Django's own connection settings."""

from __future__ import annotations

import os
import sys
from typing import Any

import psycopg
from psycopg import sql as pgsql

ALIAS = "default"
START_HINT = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"


def pg_target() -> dict[str, str]:
    """Return host, port, user and database name of the benchmark server."""
    return {
        "host": os.environ.get("FLOWWARDEN_BENCH_PG_HOST", "127.0.0.1"),
        "port": os.environ.get("FLOWWARDEN_BENCH_PG_PORT", "5432"),
        "user": os.environ.get("FLOWWARDEN_BENCH_PG_USER", "postgres"),
        "dbname": os.environ.get("FLOWWARDEN_BENCH_PG_DB", "fw_bench"),
    }


def ensure_database(target: dict[str, str]) -> None:
    """Create the benchmark database unless it exists; exit 2 if PostgreSQL is unreachable."""
    try:
        conn = psycopg.connect(
            host=target["host"],
            port=target["port"],
            user=target["user"],
            dbname="postgres",
            autocommit=True,
            connect_timeout=5,
        )
    except psycopg.OperationalError as exc:
        reason = (str(exc).strip().splitlines() or ["connection failed"])[0]
        print(
            f"PostgreSQL is not reachable at {target['host']}:{target['port']} ({reason}); "
            f"start it with: {START_HINT}",
            file=sys.stderr,
        )
        sys.exit(2)
    with conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [target["dbname"]]
        ).fetchone()
        if exists is None:
            conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(target["dbname"])))


#: ``FLOWWARDEN_BENCH_PG_PREPARE=1``: the connection ``OPTIONS`` of a project that uses
#: prepared statements (no transaction-mode pooler in front of PostgreSQL): psycopg's
#: server-side binding, each statement prepared from its fifth execution (psycopg's
#: default). Unset: Django's defaults (client-side binding, nothing prepared).
PREPARED_OPTIONS = {"server_side_binding": True, "prepare_threshold": 5}


def prepared_statements() -> bool:
    """Whether the benchmark runs with :data:`PREPARED_OPTIONS`."""
    return os.environ.get("FLOWWARDEN_BENCH_PG_PREPARE") == "1"


def connection_options() -> dict[str, Any]:
    """The ``OPTIONS`` of the benchmark database (see :data:`PREPARED_OPTIONS`)."""
    return dict(PREPARED_OPTIONS) if prepared_statements() else {}


def configure_django(
    target: dict[str, str], extra_apps: tuple[str, ...] = (), **extra_settings: Any
) -> None:
    """Configure and set up Django with the benchmark database as ``default`` (plus
    *extra_apps* and *extra_settings*)."""
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=[
            "django.contrib.contenttypes",
            "django.contrib.auth",
            *extra_apps,
            "flowwarden_django",
        ],
        DATABASES={
            ALIAS: {
                "ENGINE": "django.db.backends.postgresql",
                "HOST": target["host"],
                "PORT": target["port"],
                "USER": target["user"],
                "NAME": target["dbname"],
                "OPTIONS": connection_options(),
            }
        },
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        **extra_settings,
    )
    django.setup()


def open_raw_connection() -> psycopg.Connection[Any]:
    """Open a psycopg connection configured exactly as Django configures its own.

    The keyword arguments come from Django's ``get_connection_params()``; the cursor
    factory is replaced by the psycopg base class of Django's choice (Django's
    ``Cursor`` is ``psycopg.ClientCursor`` plus a ``callproc`` helper). Autocommit
    and the session time zone are set as ``init_connection_state`` sets them.
    """
    from django.db import connections

    django_conn = connections[ALIAS]
    params = django_conn.get_connection_params()
    factory = params.pop("cursor_factory")
    if issubclass(factory, psycopg.ClientCursor):
        params["cursor_factory"] = psycopg.ClientCursor
    elif issubclass(factory, psycopg.Cursor):  # server_side_binding = True
        params["cursor_factory"] = psycopg.Cursor
    else:  # pragma: no cover - an unexpected Django
        raise RuntimeError(f"unexpected Django cursor factory {factory!r}")
    conn = psycopg.connect(**params)
    conn.autocommit = True
    timezone_name = django_conn.timezone_name
    if conn.info.parameter_status("TimeZone") != timezone_name:
        conn.execute(django_conn.ops.set_time_zone_sql(), [timezone_name])
    return conn


def server_info() -> tuple[str, str]:
    """Return PostgreSQL's version and its ``synchronous_commit`` setting."""
    from django.db import connections

    with connections[ALIAS].cursor() as cursor:
        cursor.execute("SHOW server_version")
        version = cursor.fetchone()[0]
        cursor.execute("SHOW synchronous_commit")
        synchronous_commit = cursor.fetchone()[0]
    return version, synchronous_commit


def vacuum_workflow_tables() -> None:
    """``VACUUM ANALYZE`` the snapshot and run tables: a server without autovacuum (this
    machine's has it off) keeps every row an earlier benchmark deleted or updated, and
    both the raw loop and the engine would pay for that bloat."""
    from django.db import connections

    from flowwarden_django.models import SnapshotRecord, WorkflowRun

    connection = connections[ALIAS]
    connection.ensure_connection()
    with connection.cursor() as cursor:  # autocommit: VACUUM cannot run in a transaction
        for model in (SnapshotRecord, WorkflowRun):
            cursor.execute(f'VACUUM ANALYZE "{model._meta.db_table}"')


def checkpoint() -> None:
    """``CHECKPOINT``: write out every page dirtied so far, so that what is measured
    next does not pay for the writes of what ran before it (as it would when the
    checkpointer or a full-page image after a checkpoint lands in its time). A user
    without the right (superuser or ``pg_checkpoint``) is told once, and measures
    without it."""
    from django.db import DatabaseError, connections

    global _checkpoint_refused
    if _checkpoint_refused:
        return
    try:
        with connections[ALIAS].cursor() as cursor:
            cursor.execute("CHECKPOINT")
    except DatabaseError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != "42501":  # not a refused right
            raise
        _checkpoint_refused = True
        print(f"note: no CHECKPOINT between lanes ({exc}".strip() + ")", flush=True)


_checkpoint_refused = False
