"""flowwarden-django: durable change-stream consumers and durable workflows for Django.

Layout (docs/architecture.md): the app plumbing at the root (apps, models, checks,
conf, urls, views, signals, exceptions, tasks); ``common`` below the two halves
``streams`` and ``workflows``; ``integrations`` (Celery, Prometheus) above them; the
``admin``, ``api`` and ``management`` faces on top. Imports point down only and form
no cycle; ``lint-imports`` checks both (the contracts are in setup.cfg).

Models: ``streams``, ``workflows`` and ``integrations.celery`` may be imported before
Django's app registry is ready (a project's ``streams.py``, its models, its Celery app
module), so they never import ``flowwarden_django.models`` at module level; they use
``from ..common.app_models import models`` and write ``models.WorkflowRun``. Modules
that load only once the registry is ready (admin, api, views, management commands, the
ORM backends) import models at the top.
"""

__version__ = "0.1.0"
