"""Settings of the Celery worker subprocess of ``tests/integrations/test_celery_workflows.py``.

Those of ``tests.support.celery_settings`` (the PostgreSQL test database, the Redis broker
and the queue come from the same environment variables), plus:

* the worker imports ``tests.support.celery_workflows``, which defines the test workflows
  on its ``default`` database (``FLOWWARDEN_TEST_WORKFLOW_DB``);
* ``FLOWWARDEN_CELERY_RUN_LEASE``: ``FLOWWARDEN["WORKFLOW_RUN_LEASE"]``, and
  ``FLOWWARDEN_CELERY_WORKFLOW_EXECUTION``: ``FLOWWARDEN["WORKFLOW_EXECUTION"]``
  (``"celery"`` runs the recovery sweep in the worker);
* ``FLOWWARDEN_CELERY_BROKER_BOUNDS=1``: the Redis transport gets the socket timeouts
  and keepalives of ``DEAD_CONNECTION_TIMEOUT`` (``common.network.redis_options``), as
  ``docs/network_faults.md`` tells a project to set (``tests/faults/``);
* ``FLOWWARDEN_CELERY_FLOWWARDEN``: more ``FLOWWARDEN`` settings, as JSON
  (``WORKFLOW_RECOVER_AFTER`` in ``tests/faults/``);
* ``FLOWWARDEN_CELERY_VISIBILITY_TIMEOUT``: the Redis transport's
  ``visibility_timeout`` (seconds), checked every second;
* the transport's unacked-message keys are named after the test's queue, so the
  test can look at them and delete them.
"""

import json
import os

from tests.support.celery_settings import *  # noqa: F403
from tests.support.celery_settings import CELERY_TASK_DEFAULT_QUEUE, FLOWWARDEN

CELERY_IMPORTS = ["tests.support.celery_workflows", "tests.support.celery_parallel_streams"]
FLOWWARDEN_TEST_WORKFLOW_DB = "default"

FLOWWARDEN = dict(FLOWWARDEN)
# Unset: the defaults (a 10 s lease; steps in-process, so no sweep in the worker).
if os.environ.get("FLOWWARDEN_CELERY_RUN_LEASE"):
    FLOWWARDEN["WORKFLOW_RUN_LEASE"] = os.environ["FLOWWARDEN_CELERY_RUN_LEASE"]
if os.environ.get("FLOWWARDEN_CELERY_WORKFLOW_EXECUTION"):
    FLOWWARDEN["WORKFLOW_EXECUTION"] = os.environ["FLOWWARDEN_CELERY_WORKFLOW_EXECUTION"]
FLOWWARDEN.update(json.loads(os.environ.get("FLOWWARDEN_CELERY_FLOWWARDEN") or "{}"))


def transport_options(queue: str, visibility_timeout: float | None = None) -> dict:
    """The Redis transport options of a test queue (the test's producer uses them too)."""
    options = {
        "unacked_key": f"fw-unacked-{queue}",
        "unacked_index_key": f"fw-unacked-index-{queue}",
        "unacked_mutex_key": f"fw-unacked-mutex-{queue}",
        # A worker killed during a restore scan must not block the next one for long.
        "unacked_mutex_expire": 5,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }
    if visibility_timeout is not None:
        options["visibility_timeout"] = visibility_timeout
    return options


_visibility = os.environ.get("FLOWWARDEN_CELERY_VISIBILITY_TIMEOUT")
CELERY_BROKER_TRANSPORT_OPTIONS = transport_options(
    CELERY_TASK_DEFAULT_QUEUE, float(_visibility) if _visibility else None
)
if os.environ.get("FLOWWARDEN_CELERY_BROKER_BOUNDS") == "1":
    from flowwarden_django.common.durations import parse_duration
    from flowwarden_django.common.network import redis_options

    CELERY_BROKER_TRANSPORT_OPTIONS.update(
        redis_options(parse_duration(FLOWWARDEN.get("DEAD_CONNECTION_TIMEOUT", "30s")))
    )
# One message at a time: a busy worker holds no other step.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1

if os.environ.get("FLOWWARDEN_TEST_SMTP_PORT"):  # tests/integrations/test_celery_reminders.py
    INSTALLED_APPS = [*INSTALLED_APPS, "django.contrib.auth"]  # noqa: F405
    CELERY_IMPORTS = [*CELERY_IMPORTS, "tests.support.celery_reminders"]
    EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    EMAIL_HOST = "127.0.0.1"
    EMAIL_PORT = int(os.environ["FLOWWARDEN_TEST_SMTP_PORT"])
    ROOT_URLCONF = "tests.support.inbox_urls"
    FLOWWARDEN["APPROVAL_EMAILS"] = {
        "FROM_EMAIL": "flow@example.com",
        "BASE_URL": "https://ops.example.com",
    }

# tests/integrations/test_celery_tracing.py: spans to a file (FLOWWARDEN_TEST_OTEL_FILE).
from tests.support.otel import configure_from_env  # noqa: E402

configure_from_env()
