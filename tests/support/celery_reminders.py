"""Imported by the Celery worker of ``tests/integrations/test_celery_reminders.py``
(``CELERY_IMPORTS``): defines the reminding workflow on the worker's database."""

from django.conf import settings

from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from tests.support.reminder_workflow import REMINDING, define_reminders

define_reminders(
    REMINDING,
    OrmSnapshotStore(using=settings.FLOWWARDEN_TEST_WORKFLOW_DB),
    using=settings.FLOWWARDEN_TEST_WORKFLOW_DB,
)
