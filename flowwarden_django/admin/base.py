"""Pieces the flowwarden admin pages share: read-only model admins, guards against
hostile ids and filters, status badges, and pages that run one operation (approve,
replay...) on one object."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any

from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ValidationError
from django.db.models import Field
from django.http import HttpRequest, HttpResponse
from django.templatetags.static import static
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import capfirst
from django.utils.translation import ngettext

from ..common.formatting import NONE_TEXT, relative_time

UNKNOWN_ICON = "admin/img/icon-unknown.svg"


class ReadOnlyAdminMixin:
    """A model admin whose rows are written elsewhere: no add, change or delete."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def possible_value(field: Field[Any, Any], value: Any) -> bool:
    """Whether *value* (from a URL or a form) could be stored in *field*: it converts
    to the field's type and holds no NUL (which PostgreSQL refuses even to compare)."""
    if isinstance(value, str) and "\x00" in value:
        return False
    try:
        python = field.to_python(value)
    except (ValidationError, ValueError, TypeError):
        return False
    return not (isinstance(python, str) and "\x00" in python)


class GuardedChangeList(ChangeList):
    """A changelist that refuses, as ``IncorrectLookupParameters`` (Django then
    redirects to ``?e=1``), the filter parameters its model admin does not offer:

    * any parameter that no ``list_filter`` nor the ``date_hierarchy`` consumes
      (``?prompt__regex=(``, ``?pk__in=…``): Django would pass it to the database;
    * a NUL in a filter parameter (PostgreSQL raises ``DataError`` on it);
    * a ``date_hierarchy`` date whose range the database cannot hold (the year
      9999, whose end is in the year 10000).
    """

    def get_filters(self, request: HttpRequest) -> Any:
        params = self.get_filters_params()
        for key, values in params.items():
            if "\x00" in key or any("\x00" in value for value in values):
                raise IncorrectLookupParameters(f"NUL in the filter {key!r}")
        try:
            filters = super().get_filters(request)
        except (ValueError, OverflowError) as exc:  # the date hierarchy's range overflowed
            raise IncorrectLookupParameters(exc) from exc
        remaining: dict[str, list[Any]] = filters[2]
        bounds: set[str] = set()
        if self.date_hierarchy and f"{self.date_hierarchy}__year" in params:
            bounds = {f"{self.date_hierarchy}__gte", f"{self.date_hierarchy}__lt"}
        unknown = sorted(set(remaining) - bounds)
        if unknown:
            raise IncorrectLookupParameters(f"unknown filters: {', '.join(unknown)}")
        for key in bounds & set(remaining):
            for value in remaining[key]:
                _check_storable(value)
        return filters


def _check_storable(value: Any) -> None:
    """Raise ``IncorrectLookupParameters`` when the aware datetime *value* falls outside
    the years 1 to 9999 in UTC (as the database adapters convert it)."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        try:
            value.astimezone(UTC)
        except (ValueError, OverflowError) as exc:
            raise IncorrectLookupParameters(exc) from exc


class GuardedLookupsMixin:
    """Hostile ids and filters get a "not found", a redirect with a message, or
    Django's ``?e=1`` redirect, never a server error:

    * an object id the primary key cannot hold (not a UUID, a NUL...) is "not found"
      on every page that loads one object (``get_object``);
    * a bulk action with such a selected id changes nothing (``response_action``);
    * the changelist accepts only the filters it offers (:class:`GuardedChangeList`).
    """

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Any:
        opts = self.opts  # type: ignore[attr-defined]
        field = opts.pk if from_field is None else opts.get_field(from_field)
        if not possible_value(field, object_id):
            return None
        return super().get_object(request, object_id, from_field)  # type: ignore[misc]

    def response_action(self, request: HttpRequest, queryset: Any) -> HttpResponse | None:
        selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        invalid = [value for value in selected if not possible_value(self.opts.pk, value)]  # type: ignore[attr-defined]
        if invalid:
            text = ngettext(
                "%(count)d selected item has an invalid id. No items have been changed.",
                "%(count)d selected items have an invalid id. No items have been changed.",
                len(invalid),
            )
            self.message_user(request, text % {"count": len(invalid)}, messages.ERROR)  # type: ignore[attr-defined]
            return None  # the changelist redirects back to itself
        return super().response_action(request, queryset)  # type: ignore[misc]

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return GuardedChangeList


def status_badge(
    status: str, *, labels: Mapping[str, Any], icons: Mapping[str, str], css_class: str
) -> SafeString:
    """A status as the admin shows booleans: an icon, then the label (*labels*: a
    model's ``Status.choices`` as a dict)."""
    return format_html(
        '<span class="{0}" data-status="{1}"><img src="{2}" alt="{1}"> {3}</span>',
        css_class,
        status,
        static(icons.get(status, UNKNOWN_ICON)),
        capfirst(str(labels.get(status, status))),
    )


class ObjectOperationsMixin:
    """Per-object operation pages: ``<object_id>/<operation.name>/`` for each of
    ``object_operations`` (anything with a ``name``), served by the admin's
    ``operation_view(request, object_id, *, operation)`` and named
    ``<app>_<model>_<operation.name>``."""

    object_operations: Sequence[Any] = ()

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name  # type: ignore[attr-defined]
        site = self.admin_site  # type: ignore[attr-defined]
        urls = [
            path(
                f"<path:object_id>/{operation.name}/",
                site.admin_view(partial(self.operation_view, operation=operation)),  # type: ignore[attr-defined]
                name="{}_{}_{}".format(*info, operation.name),
            )
            for operation in self.object_operations
        ]
        return urls + super().get_urls()  # type: ignore[misc]

    def object_url(self, obj: Any, operation: Any = None) -> str:
        """The URL of *obj*'s change page, or of its *operation* page."""
        opts = self.opts  # type: ignore[attr-defined]
        page = "change" if operation is None else operation.name
        return reverse(
            f"admin:{opts.app_label}_{opts.model_name}_{page}",
            args=[quote(obj.pk)],
            current_app=self.admin_site.name,  # type: ignore[attr-defined]
        )


def age(value: datetime | None) -> SafeString | str:
    """``"3 minutes ago"`` (``"in 2 days"`` for a time to come) with the exact ISO
    timestamp as a title; ``"—"`` for ``None``."""
    if value is None:
        return NONE_TEXT
    text = relative_time(value)
    return format_html('<time datetime="{0}" title="{0}">{1}</time>', value.isoformat(), text)


def timestamp(value: datetime | None) -> SafeString | str:
    """The exact ISO timestamp followed by its age, for the detail page."""
    if value is None:
        return NONE_TEXT
    return format_html("{} ({})", value.isoformat(), age(value))
