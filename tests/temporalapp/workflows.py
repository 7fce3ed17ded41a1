"""Found by flowwarden's autodiscovery in the Temporal worker: defines the test
workflows on the worker's database (``FLOWWARDEN_TEST_WORKFLOW_DB``)."""

from django.conf import settings

from tests.temporal_workflows import define_workflows

define_workflows(settings.FLOWWARDEN_TEST_WORKFLOW_DB)
