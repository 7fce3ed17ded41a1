"""Instance ids and error texts on the admin pages, only for whom
``FLOWWARDEN["HEALTH_DETAILS"]`` names (:func:`~flowwarden_django.views.may_see_details`),
as on the health report and the Streams console.

An instance id (``<hostname>:<pid>``) names a host; an error text may quote event data
or a connection string with its password. Users without the details see an instance
as its key (:func:`~flowwarden_django.streams.operations.status.instance_key`, the
health report's and the metrics' name for it) and no error text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.http import HttpRequest
from django.utils.translation import gettext

from ..models import StreamWorker
from ..streams.operations.status import instance_key, status_error
from ..views import may_see_details
from ..workflows.runs.records import HANDOFF_PREFIX
from .base import fields_in_place, fieldsets_in_place


def redacted_runner(runner: str) -> str:
    """A run's runner token (``<instance>:<thread>:<random>``) with its instance as its
    key; a hand-off token (``handoff:…``, no instance in it) as it is."""
    if not runner or runner.startswith(HANDOFF_PREFIX):
        return runner
    instance, *rest = runner.rsplit(":", 2)
    return ":".join([instance_key(instance), *rest])


class HealthDetailsMixin:
    """A model admin that shows some fields or columns only with the details.

    ``detail_fields`` maps each such field or column (of ``list_display``, the
    ``fieldsets`` or ``fields``) to the one shown in its place without them. Both
    must be in ``readonly_fields`` when they are methods of the model admin.
    """

    detail_fields: Mapping[str, str] = {}

    def redacting(self, request: HttpRequest) -> bool:
        """Whether *request*'s user is shown no instance id and no error text."""
        return bool(self.detail_fields) and not may_see_details(request)

    def _shown_instead(self, request: HttpRequest) -> Mapping[str, str]:
        return self.detail_fields if self.redacting(request) else {}

    def get_list_display(self, request: HttpRequest) -> Sequence[Any]:
        names = super().get_list_display(request)  # type: ignore[misc]
        return fields_in_place(names, self._shown_instead(request))

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Sequence[Any]:
        names = super().get_fields(request, obj)  # type: ignore[misc]
        return fields_in_place(names, self._shown_instead(request))

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        fieldsets = super().get_fieldsets(request, obj)  # type: ignore[misc]
        return fieldsets_in_place(fieldsets, self._shown_instead(request))


def redact_worker(worker: StreamWorker) -> StreamWorker:
    """*worker* (a ``StreamWorker`` row just read, never saved) as a user without the
    details may see it, as the console shows it: its instance as its key, no last
    error, its parked keys counted but not named."""
    worker.instance_id = instance_key(worker.instance_id)
    worker.last_error = ""
    worker.parked_keys = [""] * len(worker.parked_keys or ())
    return worker


def describe_error(exc: Exception, *, details: bool) -> str:
    """A store's or database's error as a page tells a user: with *details*
    ``"Type: message"`` (the Streams console's
    :func:`~flowwarden_django.streams.operations.status.status_error`), else the
    exception's class only (a driver's message may name a host, a user or a
    password). The server log has it whole."""
    if details:
        return status_error(exc)
    return gettext("%(error)s (the server log has the details)") % {"error": type(exc).__name__}


def error_text(request: HttpRequest, exc: Exception) -> str:
    """:func:`describe_error` for *request*'s user (``HEALTH_DETAILS``)."""
    return describe_error(exc, details=may_see_details(request))
