"""The Celery app of the Celery tests (``tests/integrations/test_celery_worker.py``).

Shaped like a project's ``proj/celery.py``: configured from the Django settings
(``tests.support.celery_settings`` in the worker subprocess) and autodiscovering task
modules. The test decides through the environment whether it calls
``install(app)``: with ``FLOWWARDEN_TEST_CELERY_INSTALL=1`` it does; otherwise this
module does not import ``flowwarden_django.integrations.celery`` itself, and the
streams run only if ``FLOWWARDEN["CELERY_RUN_STREAMS"]`` says so (autodiscovery
imports ``flowwarden_django.tasks``, which connects that hook).
"""

import os

from celery import Celery

app = Celery("fw-tests")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

if os.environ.get("FLOWWARDEN_TEST_CELERY_INSTALL") == "1":
    from flowwarden_django.integrations.celery import install

    install(app)
