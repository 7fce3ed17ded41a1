"""Found by flowwarden's autodiscovery in the Temporal worker: defines the test
workflows on the worker's database (``FLOWWARDEN_TEST_WORKFLOW_DB``), and the versions
of the versioned ones that ``FLOWWARDEN_TEST_WORKFLOW_VERSIONS`` names (default: all);
and ``queued``, the workflow of the queue tests (``tests/support/queue_workflows.py``)."""

import os

from django.conf import settings

from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from tests.support import queue_workflows
from tests.support.reminder_workflow import REMINDING, define_reminders
from tests.support.temporal_workflows import define_versions, define_workflows

define_workflows(settings.FLOWWARDEN_TEST_WORKFLOW_DB)
define_versions(
    settings.FLOWWARDEN_TEST_WORKFLOW_DB,
    tuple(int(v) for v in os.environ.get("FLOWWARDEN_TEST_WORKFLOW_VERSIONS", "1,2").split(",")),
)
queue_workflows.define(
    OrmSnapshotStore(using=settings.FLOWWARDEN_TEST_WORKFLOW_DB),
    using=settings.FLOWWARDEN_TEST_WORKFLOW_DB,
)

# The approval that reminds and escalates (tests/integrations/test_temporal_reminders.py).
define_reminders(
    REMINDING,
    OrmSnapshotStore(using=settings.FLOWWARDEN_TEST_WORKFLOW_DB),
    using=settings.FLOWWARDEN_TEST_WORKFLOW_DB,
)
