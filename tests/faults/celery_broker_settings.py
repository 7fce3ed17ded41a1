"""Settings of the Celery worker that ``tests/faults/test_celery_broker_partitions.py``
runs inside a namespace: those of ``tests.support.celery_workflow_settings`` (the
broker, the database and the queue from the environment), the ``FLOWWARDEN`` keys of
``FW_FAULT_FLOWWARDEN`` (JSON) on top, and the echo task of ``tests.faults.celery_echo``."""

import json
import os

from tests.support.celery_workflow_settings import *  # noqa: F403
from tests.support.celery_workflow_settings import FLOWWARDEN

CELERY_IMPORTS = ["tests.faults.celery_echo"]
FLOWWARDEN = {**FLOWWARDEN, **json.loads(os.environ.get("FW_FAULT_FLOWWARDEN") or "{}")}
