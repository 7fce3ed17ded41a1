"""Settings of the Celery worker subprocess of ``tests/integrations/test_celery_worker.py``.

Run as ``DJANGO_SETTINGS_MODULE=tests.support.celery_settings celery -A
tests.support.celery_app worker``.
The test passes everything through the environment:

* ``FLOWWARDEN_CELERY_DB_NAME`` / ``_HOST`` / ``_PORT`` / ``_USER`` / ``_PASSWORD``: the
  PostgreSQL test database pytest-django created (it is this process's ``default``);
* ``FLOWWARDEN_CELERY_MONGO_URL``: the scripted MongoDB server's URI;
* ``FLOWWARDEN_CELERY_BROKER_URL``: the Redis broker (and result backend);
* ``FLOWWARDEN_CELERY_QUEUE``: the queue of this test run, so that no other run's
  tasks reach this worker;
* ``FLOWWARDEN_CELERY_RUN_STREAMS=1``: sets ``FLOWWARDEN["CELERY_RUN_STREAMS"]``.
* ``FLOWWARDEN_CELERY_DB_OPTIONS``: the database's ``OPTIONS`` as JSON (the libpq
  keepalives of ``tests/faults/``).
"""

import json
import os
from importlib.util import find_spec

from tests.settings import DEFAULT_AUTO_FIELD, SECRET_KEY, TIME_ZONE, USE_TZ  # noqa: F401

DEBUG = False
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "flowwarden_django",
    "tests.testapp",
]
if find_spec("celery") and find_spec("django_celery_beat"):  # scheduled starts (the "beat" extra)
    INSTALLED_APPS += ["django_celery_beat"]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("FLOWWARDEN_CELERY_DB_NAME", "test_fw_tests"),
        "HOST": os.environ.get("FLOWWARDEN_CELERY_DB_HOST", "127.0.0.1"),
        "PORT": os.environ.get("FLOWWARDEN_CELERY_DB_PORT", "5432"),
        "USER": os.environ.get("FLOWWARDEN_CELERY_DB_USER", "postgres"),
        "PASSWORD": os.environ.get("FLOWWARDEN_CELERY_DB_PASSWORD", ""),
        "OPTIONS": json.loads(os.environ.get("FLOWWARDEN_CELERY_DB_OPTIONS") or "{}"),
    }
}

FLOWWARDEN = {
    "MONGO_CLIENTS": {
        "default": {
            "URL": os.environ.get("FLOWWARDEN_CELERY_MONGO_URL", "mongodb://127.0.0.1:1/"),
            "OPTIONS": {"serverSelectionTimeoutMS": 10_000},
        }
    },
    # Short polls: the stream notices a stop request at once.
    "STREAM_MAX_AWAIT_MS": 50,
    "CELERY_RUN_STREAMS": os.environ.get("FLOWWARDEN_CELERY_RUN_STREAMS") == "1",
}

CELERY_BROKER_URL = os.environ.get("FLOWWARDEN_CELERY_BROKER_URL", "redis://127.0.0.1:6379/14")
CELERY_RESULT_BACKEND = CELERY_BROKER_URL
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("FLOWWARDEN_CELERY_QUEUE", "fw-tests")
CELERY_IMPORTS = ["tests.support.celery_streams"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# No remote control: nothing of this worker is left in Redis after it stops.
CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
