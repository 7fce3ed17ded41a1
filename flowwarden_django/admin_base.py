"""Pieces the flowwarden admin pages share: read-only model admins, status badges,
and pages that run one operation (approve, replay...) on one object."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from django.contrib.admin.utils import quote
from django.http import HttpRequest
from django.templatetags.static import static
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import capfirst

UNKNOWN_ICON = "admin/img/icon-unknown.svg"


class ReadOnlyAdminMixin:
    """A model admin whose rows are written elsewhere: no add, change or delete."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


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
