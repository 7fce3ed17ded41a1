"""Settings of the Celery workers of ``tests/integrations/test_celery_queues.py``.

Those of ``tests.support.celery_workflow_settings`` (the PostgreSQL test database, the
lease, ``WORKFLOW_EXECUTION`` from the same environment variables), plus:

* ``FLOWWARDEN_TEST_WORKFLOW_QUEUES``: ``FLOWWARDEN["WORKFLOW_QUEUES"]``, as JSON;
* the broker is RabbitMQ (``FLOWWARDEN_CELERY_BROKER_URL``): no Redis transport
  options, no result backend;
* the worker imports ``tests.support.celery_queue_worker`` only, which defines the
  ``queued`` workflow (``tests.support.queue_workflows``) on its ``default`` database:
  so the only version queue it declares is ``<queue>.queued.v1``, which the test
  deletes afterwards.
"""

import json
import os

from tests.support.celery_workflow_settings import *  # noqa: F403
from tests.support.celery_workflow_settings import FLOWWARDEN

FLOWWARDEN = {
    **FLOWWARDEN,
    "WORKFLOW_QUEUES": json.loads(os.environ.get("FLOWWARDEN_TEST_WORKFLOW_QUEUES", "{}")),
}
CELERY_IMPORTS = ["tests.support.celery_queue_worker"]
CELERY_BROKER_TRANSPORT_OPTIONS: dict = {}
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
