"""Typed decision forms: ``await_approval(..., form=RefundDecisionForm, initial=...)``.

An approval may name a Django ``Form`` (by its import path, so a deploy can change the
class) that validates the payload of an *approval* (a rejection's payload stays free
JSON: a form says what approving needs). ``clean_payload`` runs it inside ``decide``,
so the API, the inbox, the admin and direct calls all validate the same way; the
payload stored and handed to the next step (``ctx.decision.payload``) is the form's
``cleaned_data`` made JSON-safe by ``json_safe``. ``describe_form`` tells a client
which fields to show.
"""

from __future__ import annotations

import datetime
import decimal
import itertools
import json
import re
import uuid
from collections.abc import Mapping
from typing import Any

from django import forms
from django.core.files.base import File
from django.db.models import Model
from django.forms.models import ModelChoiceIteratorValue
from django.utils.duration import duration_iso_string
from django.utils.module_loading import import_string
from django.utils.translation import gettext

from ....common.user_input import MAX_PAYLOAD_BYTES, check_user_json
from .errors import ApprovalError

#: The longest form path ``Approval.form`` holds.
MAX_FORM_PATH = 255
#: The most choices a form description lists per field.
MAX_DESCRIBED_CHOICES = 500
_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")


class ApprovalFormError(ApprovalError, ValueError):
    """The payload does not pass the approval's form; ``errors`` maps each field
    (``__all__`` for the form as a whole) to its messages."""

    code = "approval_payload_invalid"

    def __init__(self, message: str, errors: dict[str, list[str]], **kwargs: str) -> None:
        super().__init__(message, **kwargs)
        self.errors = errors


class ApprovalFormUnavailableError(ApprovalError):
    """The approval's form cannot be loaded (it no longer imports, or is not a
    ``Form``): a deploy changed it. Nobody can approve it until the path imports
    again (or the approval is rejected, which needs no form)."""

    code = "approval_form_unavailable"


def form_path(form: Any) -> str:
    """The import path of *form* (a ``Form`` subclass or its dotted path), checked to
    import and to be a ``Form``; ``TypeError``/``ValueError`` otherwise."""
    if isinstance(form, str):
        path = form.strip()
        load_form(path, error=ValueError)
        return path
    if not (isinstance(form, type) and issubclass(form, forms.BaseForm)):
        raise TypeError(f"form must be a Django Form class or its import path, not {form!r}")
    path = f"{form.__module__}.{form.__qualname__}"
    if "<" in path or load_form(path, error=ValueError) is not form:
        raise ValueError(f"form {form!r} must be importable as {path!r} (a module-level class)")
    return path


def load_form(path: str, *, error: type[Exception] = ApprovalFormUnavailableError) -> type:
    """The ``Form`` class at *path*; *error* when the path is malformed, does not
    import or names something that is not a ``Form`` class."""
    if not isinstance(path, str) or len(path) > MAX_FORM_PATH or not _PATH.fullmatch(path):
        raise error(f"form path {str(path)[:80]!r} is not a dotted import path")
    try:
        found = import_string(path)
    except Exception as exc:  # ImportError, or whatever the module raises on import
        raise error(f"form {path!r} cannot be imported: {exc}") from None
    if not (isinstance(found, type) and issubclass(found, forms.BaseForm)):
        raise error(f"{path!r} is not a Django Form class")
    return found


def build_form(
    path: str,
    *,
    initial: Any = None,
    error: type[Exception] = ApprovalFormUnavailableError,
    **kwargs: Any,
) -> forms.BaseForm:
    """An instance of the form at *path* with *initial* (and *kwargs*: ``data``,
    ``prefix``); *error* when it does not load or cannot be made that way (a form
    whose ``__init__`` wants more arguments, say)."""
    form_class = load_form(path, error=error)
    try:
        return form_class(initial=initial or None, **kwargs)
    except Exception as exc:
        raise error(f"form {path!r} cannot be made with its initial data: {exc!r}") from None


def check_initial(initial: Any) -> dict[str, Any] | None:
    """*initial* (a mapping of field names to values, or ``None``) as stored JSON."""
    if initial is None:
        return None
    if not isinstance(initial, Mapping):
        raise TypeError(f"initial must be a mapping, not {type(initial).__name__}")
    return check_user_json(json_safe(dict(initial)), what="initial", max_bytes=MAX_PAYLOAD_BYTES)


def json_safe(value: Any) -> Any:
    """*value* (a form's ``cleaned_data``, say) as plain JSON: ``Decimal`` as a string
    (its digits kept), dates, times and datetimes in ISO 8601, a ``timedelta`` as an
    ISO 8601 duration, UUIDs as strings, model instances as their primary key, files
    as their name, sets, tuples and querysets as lists."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return duration_iso_string(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, ModelChoiceIteratorValue):
        return json_safe(value.value)
    if isinstance(value, Model):
        return json_safe(value.pk)
    if isinstance(value, File):
        return value.name
    if isinstance(value, Mapping):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset) or hasattr(value, "__iter__"):
        return [json_safe(item) for item in value]
    return str(value)


def clean_payload(approval: Any, decision: str, payload: Any) -> Any:
    """The payload to store for *decision* on *approval*: *payload* itself unless the
    approval has a form and this is an approval; then the form's ``cleaned_data``
    (JSON-safe), or ``ApprovalFormError`` with the form's errors."""
    if not approval.form or decision != "approved":
        return payload
    form = bound_form(approval, payload)
    if not form.is_valid():
        errors = {name: [str(m) for m in messages] for name, messages in form.errors.items()}
        raise ApprovalFormError(
            f"the payload does not pass the form of approval {approval.pk}",
            errors,
            approval_id=str(approval.pk),
            status=approval.status,
        )
    return check_user_json(
        json_safe(form.cleaned_data), what="the cleaned payload", max_bytes=MAX_PAYLOAD_BYTES
    )


def bound_form(approval: Any, payload: Any) -> forms.BaseForm:
    """*approval*'s form bound to *payload* (a JSON object, or ``None``).

    A value that is not a scalar (or, for a multiple-choice field, a list of
    scalars) is refused as that field's error before the form sees it, so that a
    nested object is never turned into its ``str()`` by a ``CharField``; the others
    reach the form as text, as from an HTML form (what Django's fields expect: a
    ``DateField`` given a number would raise instead of refusing it)."""
    if payload is not None and not isinstance(payload, Mapping):
        raise ApprovalFormError(
            "the payload must be a JSON object", {"__all__": ["The payload must be an object."]}
        )
    data = dict(payload or {})
    form = build_form(approval.form, initial=approval.form_initial)
    wrong = {
        name: ["Enter a single value, not an object or a list."]
        for name, field in form.fields.items()
        if name in data and not _plain(data[name], _multiple(field))
    }
    if wrong:
        raise ApprovalFormError(f"the payload of approval {approval.pk} has bad values", wrong)
    texts = {name: _text(value) for name, value in data.items() if name in form.fields}
    return build_form(approval.form, data=texts, initial=approval.form_initial)


def unbound_form(approval: Any) -> forms.BaseForm:
    """*approval*'s form, unbound, with its initial data (to show it)."""
    return build_form(approval.form, initial=approval.form_initial)


def page_form(approval: Any, data: Any = None, *, prefix: str = "form") -> forms.BaseForm | None:
    """*approval*'s form for an HTML page (the inbox, the admin), with its initial
    data, bound to *data* (a POST) when given, its fields named ``<prefix>-<name>``;
    ``None`` for an untyped approval. ``ApprovalFormUnavailableError`` when the form
    cannot be loaded. Its valid ``cleaned_data`` through ``json_safe`` is the payload
    to approve with (``decide`` validates it again)."""
    if not approval.form:
        return None
    return build_form(approval.form, data=data, initial=approval.form_initial, prefix=prefix)


def page_form_or_error(approval: Any) -> tuple[forms.BaseForm | None, str]:
    """*approval*'s unbound :func:`page_form` and ``""``, or, when the form cannot be
    loaded, ``None`` and why, as the page says it: the approval can be rejected, not
    approved."""
    try:
        return page_form(approval), ""
    except ApprovalFormUnavailableError as exc:
        return None, gettext(
            "This approval's decision form cannot be loaded (%(error)s): it can be "
            "rejected, but not approved until the form is restored."
        ) % {"error": exc}


def add_form_errors(form: forms.BaseForm, error: ApprovalFormError) -> None:
    """Show *error* (``decide`` refused the payload) on the page's *form*."""
    for name, messages in error.errors.items():
        for message in messages:
            form.add_error(name if name in form.fields else None, message)


def describe_form(approval: Any) -> dict[str, Any] | None:
    """What a client needs to build *approval*'s form: its path and fields (name,
    type, required, label, help text, choices, initial), or, when the form cannot be
    loaded, its path, no fields and the ``error``. ``None`` for an untyped approval."""
    if not approval.form:
        return None
    try:
        form = unbound_form(approval)
    except ApprovalFormUnavailableError as exc:
        return {"path": approval.form, "fields": [], "error": str(exc)}
    fields = []
    for name, field in form.fields.items():
        choices = None
        if isinstance(field, forms.ChoiceField):
            listed = itertools.islice(_flat_choices(field.choices), MAX_DESCRIBED_CHOICES)
            choices = [{"value": json_safe(v), "label": str(label)} for v, label in listed]
        fields.append(
            {
                "name": name,
                "type": type(field).__name__,
                "required": bool(field.required),
                "label": str(form[name].label),
                "help_text": str(field.help_text or ""),
                "choices": choices,
                "multiple": _multiple(field),
                "initial": json_safe(form.get_initial_for_field(field, name)),
            }
        )
    return {"path": approval.form, "fields": fields, "error": ""}


def _flat_choices(choices: Any) -> Any:
    for value, label in choices:
        if isinstance(label, list | tuple):  # an optgroup
            yield from label
        else:
            yield value, label


def _multiple(field: forms.Field) -> bool:
    return isinstance(field, forms.MultipleChoiceField | forms.ModelMultipleChoiceField)


def _text(value: Any) -> Any:
    if isinstance(value, list):
        return [_text(item) for item in value]
    return value if value is None or isinstance(value, str) else json.dumps(value)


def _plain(value: Any, multiple: bool) -> bool:
    scalar = (str, int, float, bool, type(None))
    if multiple and isinstance(value, list):
        return all(isinstance(item, scalar) for item in value)
    return isinstance(value, scalar)
