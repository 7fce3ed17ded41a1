"""Settings of the sample's story on PostgreSQL, Celery and Redis.

Used by ``tests/sample/test_story_celery.py``: the sample project's settings, with
what production would change:

* the ``default`` database is PostgreSQL: the database ``FLOWWARDEN_STORY_DB_NAME``
  (the test creates it and drops it) on ``FLOWWARDEN_TEST_POSTGRES`` (host:port,
  ``127.0.0.1:5432``) as ``FLOWWARDEN_TEST_POSTGRES_USER`` (``postgres``);
* workflow steps run on Celery (``WORKFLOW_EXECUTION = "celery"``), one task each;
* MongoDB is ``FLOWWARDEN_MONGO_URL`` (the test's scripted replica set);
* the broker is Redis db :data:`BROKER_DB` on ``FLOWWARDEN_TEST_REDIS``, on the
  queue ``FLOWWARDEN_STORY_QUEUE`` of this test run alone.

Every process of the story (``manage.py`` commands, ``runserver``, ``celery worker``)
runs with these settings.
"""

import os

from sampleproject.settings import *  # noqa: F403
from sampleproject.settings import FLOWWARDEN

#: The Redis database of the story's broker (the other tests use 0, 14 and 15).
BROKER_DB = 13


def _host_port(env: str, default_port: int) -> tuple[str, str]:
    host, _, port = os.environ.get(env, f"127.0.0.1:{default_port}").rpartition(":")
    return host or "127.0.0.1", port or str(default_port)


def transport_options(queue: str) -> dict[str, str]:
    """The Redis transport options of *queue*: its unacked-message keys are named after
    it, so that the test can delete everything the run left in Redis."""
    return {
        "unacked_key": f"{queue}-unacked",
        "unacked_index_key": f"{queue}-unacked-index",
        "unacked_mutex_key": f"{queue}-unacked-mutex",
    }


_pg_host, _pg_port = _host_port("FLOWWARDEN_TEST_POSTGRES", 5432)
_redis_host, _redis_port = _host_port("FLOWWARDEN_TEST_REDIS", 6379)

DEBUG = False
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("FLOWWARDEN_STORY_DB_NAME", "fw_story"),
        "HOST": _pg_host,
        "PORT": _pg_port,
        "USER": os.environ.get("FLOWWARDEN_TEST_POSTGRES_USER", "postgres"),
        "PASSWORD": os.environ.get("FLOWWARDEN_TEST_POSTGRES_PASSWORD", ""),
    }
}
# Fast logins for the approver the test makes.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

FLOWWARDEN = {
    **FLOWWARDEN,
    "WORKFLOW_EXECUTION": "celery",
    "MONGO_CLIENTS": {
        "default": {
            "URL": os.environ.get("FLOWWARDEN_MONGO_URL", "mongodb://127.0.0.1:1/"),
            "OPTIONS": {"serverSelectionTimeoutMS": 5000},
        }
    },
}

CELERY_BROKER_URL = f"redis://{_redis_host}:{_redis_port}/{BROKER_DB}"
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("FLOWWARDEN_STORY_QUEUE", "fw-story")
CELERY_BROKER_TRANSPORT_OPTIONS = transport_options(CELERY_TASK_DEFAULT_QUEUE)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# No remote control: nothing of the worker is left in Redis after it stops.
CELERY_WORKER_ENABLE_REMOTE_CONTROL = False

# As a project's ``proj/__init__.py`` does (``from .celery import app``): every Django
# process loads the Celery app, so the stream runner and the web server publish the
# workflow steps with it (``celery.current_app``), not with Celery's default app.
from tests.story_celery_app import app as celery_app  # noqa: E402, F401
