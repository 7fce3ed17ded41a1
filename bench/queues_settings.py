"""Settings of the Celery worker of ``bench/queues.py``: ``bench.providers_settings``
(the benchmark's PostgreSQL database, persistent connections, the queue of this
benchmark run from ``FLOWWARDEN_BENCH_CELERY_QUEUE``) on the RabbitMQ broker
(``FLOWWARDEN_BENCH_CELERY_BROKER``, default ``amqp://guest:guest@127.0.0.1:5672//``),
with the benchmark's workflow queue (``FLOWWARDEN_BENCH_QUEUE_CONCURRENCY``) and its
workflow and raw task (``bench.providers_app.queued``). The benchmark process uses the
same ``CELERY_*`` and ``FLOWWARDEN`` settings, read from this module.
"""

import os

from bench.providers_settings import *  # noqa: F403  (the worker's settings, amended below)
from bench.providers_settings import CELERY_IMPORTS, FLOWWARDEN

CELERY_BROKER_URL = os.environ.get(
    "FLOWWARDEN_BENCH_CELERY_BROKER", "amqp://guest:guest@127.0.0.1:5672//"
)
# No result backend (the tasks store none) and no Redis transport options.
CELERY_RESULT_BACKEND = None
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, str] = {}
CELERY_IMPORTS = [*CELERY_IMPORTS, "bench.providers_app.queued"]
FLOWWARDEN = {
    **FLOWWARDEN,
    "WORKFLOW_QUEUES": {
        "bench-queue": {
            "concurrency": int(os.environ.get("FLOWWARDEN_BENCH_QUEUE_CONCURRENCY", "1000"))
        }
    },
}
