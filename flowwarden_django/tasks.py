"""Celery's autodiscovery entry point: ``app.autodiscover_tasks()`` imports
``<app>.tasks`` of every installed app.

The tasks live in ``flowwarden_django.integrations.celery.tasks``; importing this
module registers them and connects the ``CELERY_RUN_STREAMS`` hook (see
``flowwarden_django.integrations.celery``).
"""

from .integrations.celery import install_from_settings  # noqa: F401  (connects the hook)
from .integrations.celery.tasks import (
    expire_approvals,
    purge_dead_letters,
    recover_workflows,
    replay_dead_letters,
    replay_stream,
    run_workflow_step,
)

__all__ = [
    "expire_approvals",
    "purge_dead_letters",
    "recover_workflows",
    "replay_dead_letters",
    "replay_stream",
    "run_workflow_step",
]
