"""Settings of the worker subprocesses of ``bench/workflow_providers.py``: the Celery
worker (``celery -A bench.providers_celery worker``) and the Temporal worker
(``manage.py flowwarden_temporal_worker``). The benchmark passes everything through the
environment:

* ``FLOWWARDEN_BENCH_PG_HOST`` / ``_PORT`` / ``_USER`` / ``_DB``: the benchmark's
  PostgreSQL database (``bench/_postgres.py``, the same variables and defaults);
* ``FLOWWARDEN_BENCH_EXECUTION``: ``"celery"`` or ``"temporal"``, the worker's provider;
* ``FLOWWARDEN_BENCH_CELERY_BROKER`` and ``FLOWWARDEN_BENCH_CELERY_QUEUE``: the Redis
  broker and the queue of this benchmark run (the benchmark's producer uses the same
  ``CELERY_*`` settings, read from this module);
* ``FLOWWARDEN_BENCH_TEMPORAL_TARGET`` and ``FLOWWARDEN_BENCH_TEMPORAL_QUEUE``: the
  Temporal dev server the benchmark started and its task queue;
* ``FLOWWARDEN_BENCH_SLEEP_MS``: the wait of ``bench/parallel_streams.py``'s handler
  (set only by that benchmark, whose worker then imports ``bench.providers_app.stream_events``).

``bench.providers_app`` defines the benchmark workflow from its ``workflows.py``
(flowwarden's autodiscovery; the Celery worker also imports it through
``CELERY_IMPORTS``).
"""

import os

SECRET_KEY = "flowwarden-bench-not-secret"
DEBUG = False
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "bench.providers_app",
    "flowwarden_django",
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": os.environ.get("FLOWWARDEN_BENCH_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("FLOWWARDEN_BENCH_PG_PORT", "5432"),
        "USER": os.environ.get("FLOWWARDEN_BENCH_PG_USER", "postgres"),
        "NAME": os.environ.get("FLOWWARDEN_BENCH_PG_DB", "fw_bench"),
        # Persistent connections, as the benchmark process keeps its own: the Temporal
        # activity's close_old_connections() closes a connection after every step when
        # CONN_MAX_AGE is 0 (see also CELERY_DB_REUSE_MAX). The figures compare the
        # providers, not the cost of connecting to PostgreSQL.
        "CONN_MAX_AGE": 600,
        # FLOWWARDEN_BENCH_PG_PREPARE=1: prepared statements (bench/_postgres.py).
        "OPTIONS": (
            {"server_side_binding": True, "prepare_threshold": 5}
            if os.environ.get("FLOWWARDEN_BENCH_PG_PREPARE") == "1"
            else {}
        ),
    }
}

FLOWWARDEN = {
    "WORKFLOW_EXECUTION": os.environ.get("FLOWWARDEN_BENCH_EXECUTION", "celery"),
    "TEMPORAL": {
        "TARGET": os.environ.get("FLOWWARDEN_BENCH_TEMPORAL_TARGET", "127.0.0.1:7233"),
        "TASK_QUEUE": os.environ.get("FLOWWARDEN_BENCH_TEMPORAL_QUEUE", "fw-bench"),
    },
}

CELERY_BROKER_URL = os.environ.get("FLOWWARDEN_BENCH_CELERY_BROKER", "redis://127.0.0.1:6379/12")
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("FLOWWARDEN_BENCH_CELERY_QUEUE", "fw-bench")
CELERY_IMPORTS = [
    "bench.providers_app.workflows",
    "bench.providers_app.raw_chain",
]
if "FLOWWARDEN_BENCH_SLEEP_MS" in os.environ:
    # bench/parallel_streams.py's Celery lane declares its stream in its worker only
    # (not a ``streams`` module: the workflow benchmark's workers would then check a
    # stream they have no MongoDB client for).
    CELERY_IMPORTS.append("bench.providers_app.stream_events")
# The answers of bench/parallel_streams.py's Celery lane (its stream's events); the
# workflow benchmark's tasks store no result.
CELERY_RESULT_BACKEND = CELERY_BROKER_URL
# The transport's unacked-message keys are named after the queue, so the benchmark can
# delete them with it.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "unacked_key": f"fw-unacked-{CELERY_TASK_DEFAULT_QUEUE}",
    "unacked_index_key": f"fw-unacked-index-{CELERY_TASK_DEFAULT_QUEUE}",
    "unacked_mutex_key": f"fw-unacked-mutex-{CELERY_TASK_DEFAULT_QUEUE}",
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# No remote control: nothing of the worker is left in Redis after it stops.
CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
# Celery's Django fixup closes every database connection before and after each task
# (whatever CONN_MAX_AGE says) unless this is set: then only every 2 x 1000 tasks.
CELERY_DB_REUSE_MAX = 1000
