"""What the Celery workers of ``tests/integrations/test_celery_queues.py`` import
(``tests.support.celery_queue_settings``): the ``queued`` workflow of
``tests.support.queue_workflows``, on the worker's ``default`` database (the test's
PostgreSQL database)."""

from django.conf import settings

from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from tests.support import queue_workflows

if getattr(settings, "FLOWWARDEN_TEST_WORKFLOW_DB", None):  # the worker
    _db = settings.FLOWWARDEN_TEST_WORKFLOW_DB
    queue_workflows.define(OrmSnapshotStore(using=_db), using=_db)
