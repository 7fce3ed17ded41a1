"""Settings of the message crash test's consumer and sweeper subprocesses.

Run as ``DJANGO_SETTINGS_MODULE=tests.crash.sends.settings python manage.py
flowwarden_streams run --stream crash-sends`` (the consumer) or ``... flowwarden_workflows
recover --every 250ms`` (the sweeper). Everything comes from ``tests.crash.settings``
(the ``FLOWWARDEN_CRASH_*`` environment: the PostgreSQL test database, the scripted
server's URI, ``application_name=fw-crash-consumer``), except:

* the installed apps: this package replaces ``tests.crash``, so the processes declare
  only ``crash-sends`` and ``crash-paid``;
* ``FLOWWARDEN_CRASH_APPLICATION`` names the sweeper's sessions apart from the
  consumer's (the test waits for a killed consumer's sessions to end);
* short workflow leases and a quick sweep: a run the consumer was killed in the middle
  of is continued by the sweeper within seconds (``WORKFLOW_RUN_LEASE`` 2 s,
  ``WORKFLOW_RECOVER_AFTER`` 1 s).
"""

import os

from tests.crash.settings import *  # noqa: F403
from tests.crash.settings import DATABASES, FLOWWARDEN

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "flowwarden_django",
    "tests.testapp",
    "tests.crash.sends",  # its streams.py declares crash-sends, workflows.py crash-paid
]

APPLICATION_NAME = os.environ.get("FLOWWARDEN_CRASH_APPLICATION", "fw-crash-consumer")
DATABASES["default"]["OPTIONS"] = {"application_name": APPLICATION_NAME}

FLOWWARDEN = {
    **FLOWWARDEN,
    "WORKFLOW_RUN_LEASE": "2s",
    "WORKFLOW_RECOVER_AFTER": "1s",
    "WORKFLOW_SWEEP_INTERVAL": "250ms",
}
