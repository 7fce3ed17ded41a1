"""The app's models for modules that a project may import before Django is set up.

``flowwarden_django.streams``, ``flowwarden_django.workflows`` (and everything they
import at module level) and ``flowwarden_django.integrations.celery`` are imported by
a project's ``streams.py``/``workflows.py``, its models or its Celery app module,
possibly while the app registry is still loading. They must not import
``flowwarden_django.models`` at module level, and instead write::

    from .app_models import models

    models.Approval.objects.filter(...)

``models`` imports ``flowwarden_django.models`` on first use of an attribute and keeps
each class it returns, so later uses cost one attribute lookup. Type checkers see the
real module. Modules that are only loaded once the registry is ready (the admin, the
API, views, management commands, the ORM backends) import models at the top as usual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["models"]


class _LazyModels:
    """Attribute access to ``flowwarden_django.models``, imported on first use."""

    def __getattr__(self, name: str) -> Any:
        from .. import models as module

        value = getattr(module, name)
        setattr(self, name, value)
        return value


if TYPE_CHECKING:
    from .. import models as models
else:
    models = _LazyModels()
