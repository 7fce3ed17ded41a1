"""Settings of the Celery worker subprocess of ``tests/chaos/test_workflow_outages.py``.

Run as ``DJANGO_SETTINGS_MODULE=tests.chaos.celery_chaos_settings celery -A
tests.support.celery_app worker``. The test passes the private servers through the
environment:

* ``FW_CHAOS_DB_NAME`` / ``FW_CHAOS_DB_PORT``: the private PostgreSQL's database
  (127.0.0.1, user ``postgres``, trust), this process's ``default``;
* ``FW_CHAOS_BROKER_URL``: the private broker (Redis or RabbitMQ); no result backend;
* ``FW_CHAOS_QUEUE``: the queue of the test.

The worker imports ``tests.chaos.workflow_app``, which defines the chaos workflows
on ``default``. Its log lines name their logger, so the test can count the
``flowwarden_django`` ones written during an outage.
"""

import os

from tests.support.celery_settings import *  # noqa: F403  (the apps and the worker's basics)

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("FW_CHAOS_DB_NAME", "chaos"),
        "HOST": "127.0.0.1",
        "PORT": os.environ.get("FW_CHAOS_DB_PORT", "5432"),
        "USER": "postgres",
        "PASSWORD": "",
        "CONN_MAX_AGE": 0,
        "OPTIONS": {"connect_timeout": 5},
    }
}

FLOWWARDEN = {
    "MONGO_CLIENTS": {"default": {"URL": "mongodb://127.0.0.1:1/"}},
}
FLOWWARDEN_CHAOS_WORKFLOW_DB = "default"

CELERY_BROKER_URL = os.environ.get("FW_CHAOS_BROKER_URL", "redis://127.0.0.1:1/0")
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("FW_CHAOS_QUEUE", "fw-chaos")
CELERY_IMPORTS = ["tests.chaos.workflow_app"]
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_WORKER_HIJACK_ROOT_LOGGER = True
CELERY_WORKER_LOG_FORMAT = "[%(asctime)s %(levelname)s %(name)s %(processName)s] %(message)s"
CELERY_WORKER_TASK_LOG_FORMAT = CELERY_WORKER_LOG_FORMAT
