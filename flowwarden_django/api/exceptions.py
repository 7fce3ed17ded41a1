"""How the API renders errors.

Every error is ``{"code": "<stable code>", "detail": "<text>"}``; a validation error
(400) also keeps DRF's usual field messages beside them, ``{"code": "invalid",
"detail": "Invalid input: field, ...", "field": ["message", ...]}``. Refused
decisions keep the approvals core's codes: ``approval_not_found`` (404),
``approval_forbidden`` (403), ``approval_already_decided`` / ``approval_cancelled`` /
``run_busy`` / ``approval_form_unavailable`` (409) and ``approval_expired`` (410); a
payload its approval's form refuses is a 400 with the form's errors under ``payload``
(``{"payload": {"amount": ["..."]}}``); refused messages the messages core's:
``run_finished`` / ``run_cancelled`` (409).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.utils.translation import gettext_lazy as _
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from ..workflows.runs.records import UnknownRunError
from ..workflows.storage.store import UnknownSnapshotError
from ..workflows.waiting.approvals import (
    ApprovalConflictError,
    ApprovalError,
    ApprovalExpiredError,
    ApprovalFormError,
    ApprovalPermissionError,
    UnknownApprovalError,
)
from ..workflows.waiting.messages import RunFinishedError


class Conflict(exceptions.APIException):
    """409: the request conflicts with the resource's state (a decision already made)."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = _("The request conflicts with the current state of the resource.")
    default_code = "conflict"


class Gone(exceptions.APIException):
    """410: the resource can no longer be acted on (an approval that expired)."""

    status_code = status.HTTP_410_GONE
    default_detail = _("The resource is no longer available.")
    default_code = "gone"


class RunFinished(Conflict):
    """409: the run is completed or already cancelled: there is nothing to cancel."""

    default_detail = _("The run is already finished.")
    default_code = "run_finished"


class SnapshotUnreadable(Conflict):
    """409: the store cannot read the snapshot (a wrong key, tampered data)."""

    default_detail = _("The snapshot cannot be read.")
    default_code = "snapshot_unreadable"


#: The status of each refused decision (the first matching class wins).
_APPROVAL_ERRORS: list[tuple[type[ApprovalError], type[exceptions.APIException]]] = [
    (UnknownApprovalError, exceptions.NotFound),
    (ApprovalPermissionError, exceptions.PermissionDenied),
    (ApprovalExpiredError, Gone),
    (ApprovalConflictError, Conflict),
]


class RequestTooLarge(exceptions.APIException):
    """413: the request body is over Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE``."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = _("The request body is too large.")
    default_code = "request_too_large"


def api_error(exc: Exception) -> Exception:
    """The DRF exception an error of the workflow core (or Django's request size
    limit) stands for (else *exc*)."""
    if isinstance(exc, RequestDataTooBig):
        return RequestTooLarge()
    if isinstance(exc, ApprovalFormError):  # the form's field errors, DRF style
        errors = {"non_field_errors" if k == "__all__" else k: v for k, v in exc.errors.items()}
        return exceptions.ValidationError({"payload": errors}, code=exc.code)
    if isinstance(exc, ApprovalError):
        kind = next((k for error, k in _APPROVAL_ERRORS if isinstance(exc, error)), Conflict)
        return kind(str(exc), code=exc.code)
    if isinstance(exc, UnknownSnapshotError):
        return exceptions.NotFound(str(exc), code="snapshot_not_found")
    if isinstance(exc, RunFinishedError):  # a message to a completed or cancelled run
        return Conflict(str(exc), code=exc.code)
    if isinstance(exc, UnknownRunError):
        return exceptions.NotFound(str(exc), code="run_not_found")
    return exc


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler, with core errors translated and ``code`` added to the body."""
    exc = api_error(exc)
    response = drf_exception_handler(exc, context)
    if response is None:
        return response
    if isinstance(exc, exceptions.ValidationError):
        response.data = _validation_body(response.data)
        return response
    detail = response.data.get("detail") if isinstance(response.data, dict) else None
    if detail is not None:
        code = getattr(detail, "code", None) or "error"
        response.data = {"code": code, "detail": str(detail)}
        if response.status_code == status.HTTP_401_UNAUTHORIZED:
            response.data.update(_accepted(context))
    return response


def _accepted(context: dict[str, Any]) -> dict[str, Any]:
    """What a 401 adds: the schemes the view accepts, and how to use them."""
    from .authentication import accepted_schemes

    view = context.get("view")
    authenticators = view.get_authenticators() if view is not None else []
    if not authenticators:
        return {}
    names, how = accepted_schemes(authenticators)
    return {"accepted": names, "hint": how}


def _validation_body(errors: Any) -> dict[str, Any]:
    """A validation error's body: ``code`` and ``detail`` with the field messages."""
    if not isinstance(errors, dict):
        errors = {"non_field_errors": errors if isinstance(errors, list) else [errors]}
    fields = ", ".join(str(name) for name in errors)
    return {"code": "invalid", "detail": f"Invalid input: {fields}.", **errors}
