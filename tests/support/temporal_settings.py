"""Settings of the ``flowwarden_temporal_worker`` subprocesses of
``tests/integrations/test_temporal.py``. The test passes everything through the
environment:

* ``FLOWWARDEN_TEMPORAL_DB_NAME`` / ``_HOST`` / ``_PORT`` / ``_USER``: the PostgreSQL
  test database pytest-django created (the test process's ``postgres`` alias);
* ``FLOWWARDEN_TEMPORAL_TARGET``: the dev server the test started, and
  ``FLOWWARDEN_TEMPORAL_QUEUE`` the task queue of this test run;
* ``FLOWWARDEN_TEMPORAL_RUN_LEASE``: ``FLOWWARDEN["WORKFLOW_RUN_LEASE"]``;
* ``FLOWWARDEN_TEMPORAL_DEFAULTS=1``: flowwarden's defaults but for the server and
  the task queue;
* ``FLOWWARDEN_TEMPORAL_WORKFLOW_QUEUES``: ``FLOWWARDEN["WORKFLOW_QUEUES"]`` as JSON
  (``tests/integrations/test_temporal_queues.py``).
* ``FLOWWARDEN_TEMPORAL_DB_OPTIONS``: the database's ``OPTIONS`` as JSON (the libpq
  keepalives of ``tests/faults/``).

``tests.temporalapp`` defines the test workflows (``tests/support/temporal_workflows.py``) from
its ``workflows.py``, found by the app's autodiscovery as a project's would be.
"""

import json
import os

from tests.settings import DEFAULT_AUTO_FIELD, SECRET_KEY, TIME_ZONE, USE_TZ  # noqa: F401

DEBUG = False
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "flowwarden_django",
    "tests.testapp",
    "tests.temporalapp",
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("FLOWWARDEN_TEMPORAL_DB_NAME", "test_fw_tests"),
        "HOST": os.environ.get("FLOWWARDEN_TEMPORAL_DB_HOST", "127.0.0.1"),
        "PORT": os.environ.get("FLOWWARDEN_TEMPORAL_DB_PORT", "5432"),
        "USER": os.environ.get("FLOWWARDEN_TEMPORAL_DB_USER", "postgres"),
        "OPTIONS": json.loads(os.environ.get("FLOWWARDEN_TEMPORAL_DB_OPTIONS") or "{}"),
    }
}

#: The database the worker defines the test workflows on.
FLOWWARDEN_TEST_WORKFLOW_DB = "default"

FLOWWARDEN = {
    "WORKFLOW_EXECUTION": "temporal",
    "TEMPORAL": {
        "TARGET": os.environ.get("FLOWWARDEN_TEMPORAL_TARGET", "127.0.0.1:7233"),
        "TASK_QUEUE": os.environ.get("FLOWWARDEN_TEMPORAL_QUEUE", "flowwarden-tests"),
        "HEARTBEAT_TIMEOUT": "2s",
    },
    "WORKFLOW_RUN_LEASE": os.environ.get("FLOWWARDEN_TEMPORAL_RUN_LEASE", "10m"),
    "WORKFLOW_RECOVER_AFTER": "5s",
}
if os.environ.get("FLOWWARDEN_TEMPORAL_DEFAULTS") == "1":  # flowwarden's defaults only
    FLOWWARDEN = {
        "WORKFLOW_EXECUTION": "temporal",
        "TEMPORAL": {key: FLOWWARDEN["TEMPORAL"][key] for key in ("TARGET", "TASK_QUEUE")},
    }
if os.environ.get("FLOWWARDEN_TEMPORAL_WORKFLOW_QUEUES"):
    FLOWWARDEN["WORKFLOW_QUEUES"] = json.loads(os.environ["FLOWWARDEN_TEMPORAL_WORKFLOW_QUEUES"])
if os.environ.get("FLOWWARDEN_TEST_SMTP_PORT"):  # tests/integrations/test_temporal_reminders.py
    EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    EMAIL_HOST = "127.0.0.1"
    EMAIL_PORT = int(os.environ["FLOWWARDEN_TEST_SMTP_PORT"])
    ROOT_URLCONF = "tests.support.inbox_urls"
    FLOWWARDEN["APPROVAL_EMAILS"] = {
        "FROM_EMAIL": "flow@example.com",
        "BASE_URL": "https://ops.example.com",
    }

# tests/integrations/test_temporal_tracing.py: spans to a file (FLOWWARDEN_TEST_OTEL_FILE).
from tests.support.otel import configure_from_env  # noqa: E402

configure_from_env()
