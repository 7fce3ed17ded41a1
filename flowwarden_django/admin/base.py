"""Pieces the flowwarden admin pages share: read-only model admins, guards against
hostile ids and filters, status badges and the other pieces of columns and fields,
and operations (approve, replay...) on one object or on the selected rows, each
confirmed on a page first."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import cache, cached_property, lru_cache, partial
from typing import Any
from urllib.parse import quote as url_quote

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import AllValuesFieldListFilter, helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ValidationError
from django.core.paginator import Page, Paginator
from django.core.signals import setting_changed
from django.db import connections
from django.db.models import Field, Min, QuerySet
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.templatetags.static import static
from django.urls import URLPattern, get_script_prefix, get_urlconf, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import RFC3986_SUBDELIMS
from django.utils.safestring import SafeString
from django.utils.text import capfirst
from django.utils.translation import get_language, gettext, ngettext

from ..common.formatting import NONE_TEXT, relative_time, truncate

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

    def response_action(
        self, request: HttpRequest, queryset: Any, *args: Any, **kwargs: Any
    ) -> HttpResponse | None:
        # *args/**kwargs: Django 6.1 adds ``action_location`` (actions on change forms).
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
        return super().response_action(request, queryset, *args, **kwargs)  # type: ignore[misc]

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return GuardedChangeList


class EstimatedCountPaginator(Paginator):
    """A changelist paginator that never counts a large table to its end.

    ``count`` counts at most ``exact_up_to`` rows, in one bounded query (``SELECT
    COUNT(*) FROM (SELECT ... LIMIT n + 1)``): a smaller list is counted exactly. A
    larger one, on PostgreSQL, is the planner's estimate of the list's rows (its
    ``EXPLAIN``: the table's ``pg_class.reltuples`` and, for a filtered list, the
    columns' statistics), never less than the rows counted; ``estimated`` is then
    true and the page says "about". Other databases count every row.
    """

    #: The most rows counted exactly.
    exact_up_to = 10_000
    #: From this many rows into the list, a page reads its rows' keys first and
    #: then those rows: the skipped rows are read from the ordering's index only
    #: (a "deferred join"), not each from the table.
    keys_first_from = 1_000

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Whether ``count`` is the planner's estimate.
        self.estimated = False

    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if (
            not isinstance(rows, QuerySet)
            or rows.query.is_sliced
            or connections[rows.db].vendor != "postgresql"
        ):
            return super().count
        # The primary keys only: no annotation is computed for a row merely counted.
        keys = rows.order_by().values("pk")
        counted = keys[: self.exact_up_to + 1].count()
        if counted <= self.exact_up_to:
            return counted
        self.estimated = True
        return max(counted, planned_rows(keys))

    def page(self, number: int | str) -> Page:
        rows = self.object_list
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        if (
            bottom < self.keys_first_from
            or not isinstance(rows, QuerySet)
            or rows.query.is_sliced
            or rows.query.distinct
        ):
            return super().page(number)
        top = bottom + self.per_page
        if top + self.orphans >= self.count:
            top = self.count
        keys = list(rows.values_list("pk", flat=True)[bottom:top])
        return self._get_page(rows.filter(pk__in=keys), number, self)


def planned_rows(queryset: QuerySet[Any]) -> int:
    """PostgreSQL's estimate of how many rows *queryset* returns (``EXPLAIN``)."""
    plan = json.loads(queryset.explain(format="json"))
    if isinstance(plan, list):
        plan = plan[0]
    return int(plan["Plan"]["Plan Rows"])


class LargeTableChangeList(GuardedChangeList):
    """The changelist of a table that grows large (runs, approvals): counted by
    :class:`EstimatedCountPaginator`; when the list is too long to count, its date
    hierarchy is found by index probes (:func:`probed_datetimes`) rather than by
    reading every row of the list. Columns that need more than the row are read for
    the page's rows only, after the page (the model admin's ``annotate_page``): an
    annotation of the list would be computed for every row a deep page skips."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Django adds the preserved filters to each row's link by resolving that link
        # (a URL resolution a row: a fifth of a filtered page's time); the links made
        # by url_for_result carry them already.
        self.row_link_query, self.preserved_filters = self.preserved_filters, ""

    def url_for_result(self, result: Any) -> str:
        url = reverse_for_key(
            f"admin:{self.opts.app_label}_{self.opts.model_name}_change",
            getattr(result, self.pk_attname),
            current_app=self.model_admin.admin_site.name,
        )
        return f"{url}?{self.row_link_query}" if self.row_link_query else url

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        annotate_page = getattr(self.model_admin, "annotate_page", None)
        if annotate_page is not None:
            self.result_list = list(self.result_list)
            if self.result_list:
                annotate_page(self.result_list)
        if self.date_hierarchy and getattr(self.paginator, "estimated", False):
            self.queryset = with_probed_datetimes(self.queryset)


class LargeTableAdminMixin:
    """A model admin whose changelist answers quickly however large its table: the
    estimating paginator, no count of the unfiltered table (``show_full_result_count
    = False``: Django's "Show all" link instead of "N total"), and the date hierarchy
    of :class:`LargeTableChangeList`."""

    paginator = EstimatedCountPaginator
    show_full_result_count = False

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return LargeTableChangeList

    def action_checkbox(self, obj: Any) -> SafeString:
        # The HTML of Django's own column, without rendering a form widget's
        # template for each row (a fifth of a 100-row page's time).
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
            helpers.ACTION_CHECKBOX_NAME,
            str(obj.pk),
            format_html(gettext("Select this object for an action - {}"), str(obj)),
        )


#: The most periods :func:`probed_datetimes` probes for before it reads the rows instead.
MAX_PROBED_PERIODS = 100


def probed_datetimes(queryset: QuerySet[Any], field_name: str, kind: str) -> list[datetime]:
    """What ``queryset.datetimes(field_name, kind)`` returns (the start of each year,
    month or day holding a row, in the current time zone, oldest first), found with
    one ``MIN()`` query per period, each an index probe when the field is indexed,
    instead of a ``DISTINCT`` over every row. After ``MAX_PROBED_PERIODS`` periods it
    asks ``datetimes`` after all."""
    if kind not in ("year", "month", "day"):
        return list(queryset.datetimes(field_name, kind))
    zone = timezone.get_current_timezone() if settings.USE_TZ else None
    rows = queryset.order_by()
    found: list[datetime] = []
    bound: datetime | None = None
    while len(found) < MAX_PROBED_PERIODS:
        probe = rows if bound is None else rows.filter(**{f"{field_name}__gte": bound})
        first = probe.aggregate(first=Min(field_name))["first"]
        if first is None:
            return found
        local = timezone.localtime(first, zone) if zone is not None else first
        start = _period_start(local.replace(tzinfo=None), kind)
        found.append(start if zone is None else timezone.make_aware(start, zone))
        following = _next_period(start, kind)
        bound = following if zone is None else timezone.make_aware(following, zone)
    return list(queryset.datetimes(field_name, kind))


def _period_start(moment: datetime, kind: str) -> datetime:
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if kind == "day":
        return day
    return day.replace(day=1) if kind == "month" else day.replace(month=1, day=1)


def _next_period(start: datetime, kind: str) -> datetime:
    if kind == "day":
        return start + timedelta(days=1)
    if kind == "month":
        return (start + timedelta(days=32)).replace(day=1)
    return start.replace(year=start.year + 1)


class _ProbedDatetimes:
    """A ``QuerySet`` mixin: ``datetimes()`` (as the admin's date hierarchy asks it)
    answered by :func:`probed_datetimes`."""

    def datetimes(self, field_name: str, kind: str, order: str = "ASC", tzinfo: Any = None) -> Any:
        if order == "ASC" and tzinfo is None:
            return probed_datetimes(self, field_name, kind)  # type: ignore[arg-type]
        return super().datetimes(field_name, kind, order, tzinfo)  # type: ignore[misc]


@cache
def _probed_class(cls: type[QuerySet[Any]]) -> type[QuerySet[Any]]:
    return type(f"Probed{cls.__name__}", (_ProbedDatetimes, cls), {})


def with_probed_datetimes(queryset: QuerySet[Any]) -> QuerySet[Any]:
    """*queryset*, whose ``datetimes()`` is :func:`probed_datetimes` (its clones' too)."""
    probed = queryset._chain()  # type: ignore[attr-defined]
    probed.__class__ = _probed_class(type(queryset))
    return probed


class IndexedValuesFieldListFilter(AllValuesFieldListFilter):
    """Django's ``AllValuesFieldListFilter`` (a link per distinct value of a field),
    which on PostgreSQL finds the values of a list of the whole table by one index
    probe per value (a recursive query: a loose index scan) instead of a ``DISTINCT``
    over every row. The field needs an index that starts with it; a list the model
    admin filters (what a user may see), a nullable field and other databases get
    Django's query."""

    def __init__(
        self,
        field: Any,
        request: HttpRequest,
        params: Any,
        model: Any,
        model_admin: Any,
        field_path: str,
    ) -> None:
        super().__init__(field, request, params, model, model_admin, field_path)
        values = self.lookup_choices  # Django's: the model admin's queryset, distinct
        if (
            "__" not in field_path
            and not field.null
            and not values.query.where
            and connections[values.db].vendor == "postgresql"
        ):
            self.lookup_choices = distinct_values(values, field.column)


def distinct_values(queryset: QuerySet[Any], column: str) -> list[Any]:
    """PostgreSQL: the distinct non-null values of *column* in *queryset*'s table, in
    order, by one index probe each."""
    connection = connections[queryset.db]
    table = connection.ops.quote_name(queryset.model._meta.db_table)
    name = connection.ops.quote_name(column)
    sql = (
        f"WITH RECURSIVE found(value) AS (SELECT MIN({name}) FROM {table} "
        f"UNION ALL SELECT (SELECT MIN({name}) FROM {table} WHERE {name} > found.value) "
        "FROM found WHERE found.value IS NOT NULL) "
        "SELECT value FROM found WHERE value IS NOT NULL"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return [row[0] for row in cursor.fetchall()]


def icon_url(path: str) -> str:
    """``static(path)``, found once per path (a changelist shows one icon a row)."""
    # A relative STATIC_URL is prefixed with the request's script prefix.
    return _icon_url(path, get_script_prefix())


@lru_cache(maxsize=64)
def _icon_url(path: str, prefix: str) -> str:
    return static(path)


@receiver(setting_changed)
def _forget_icon_urls(*, setting: str, **kwargs: Any) -> None:
    if setting in ("STATIC_URL", "STATIC_ROOT", "STORAGES", "FORCE_SCRIPT_NAME"):
        _icon_url.cache_clear()


def status_badge(
    status: str, *, labels: Mapping[str, Any], icons: Mapping[str, str], css_class: str
) -> SafeString:
    """A status as the admin shows booleans: an icon, then the label (*labels*: a
    model's ``Status.choices`` as a dict). The icon is drawn 13 px square from its
    top: the admin's clock is a sprite of two clocks, one above the other."""
    return format_html(
        '<span class="{0}" data-status="{1}"><img src="{2}" alt="{1}" width="13" '
        'height="13" style="object-fit: cover; object-position: top"> {3}</span>',
        css_class,
        status,
        icon_url(icons.get(status, UNKNOWN_ICON)),
        capfirst(str(labels.get(status, status))),
    )


def field_display(
    render: Callable[[Any], SafeString | str],
    field: str,
    description: Any,
    *,
    ordering: str | None = None,
) -> Callable[[Any, Any], SafeString | str]:
    """A model admin's column or detail field: *render* (``age``, ``timestamp``) of the
    object's *field*, under *description*, sorted by *ordering* when given."""

    def show(model_admin: Any, obj: Any) -> SafeString | str:
        return render(getattr(obj, field))

    show.__name__ = show.__qualname__ = f"{field}_{render.__name__}"
    return admin.display(description=description, ordering=ordering)(show)


def html_or_none(template: str) -> Callable[[Any], SafeString | str]:
    """A *render* for :func:`field_display`: a value in *template* (``format_html``,
    for example ``"<code>{}</code>"``), ``"—"`` for an empty one."""

    def html(value: Any) -> SafeString | str:
        return format_html(template, value) if value else NONE_TEXT

    return html


#: :func:`html_or_none` of ``<code>``: an id, a key, a name as written.
code_or_none = html_or_none("<code>{}</code>")


def with_note(value: Any, note: Any, *, below: bool = False) -> SafeString:
    """*value* (a list's cell, a field) followed by *note* in the quiet style of a
    detail: on the same line, or *below* it."""
    if below:
        return format_html('{}<br><span class="flowwarden-quiet">{}</span>', value, note)
    return format_html('{} <span class="flowwarden-quiet">{}</span>', value, note)


def run_url(site_name: str, coordination_id: Any) -> str:
    """The admin page of the run *coordination_id* on the admin site *site_name*."""
    return reverse_for_key(
        "admin:flowwarden_django_workflowrun_change", coordination_id, current_app=site_name
    )


def fieldset_fields(fieldsets: Sequence[tuple[Any, Mapping[str, Any]]]) -> list[str]:
    """Every field *fieldsets* names, in order: a read-only page's ``readonly_fields``."""
    return [name for _, options in fieldsets for name in options["fields"]]


def fields_in_place(names: Sequence[Any], replace: Mapping[str, str]) -> list[Any]:
    """*names* (columns, fields) with each one *replace* maps (a field some users may
    not see) replaced by the one shown in its place."""
    return [replace.get(name, name) if isinstance(name, str) else name for name in names]


def fieldsets_in_place(fieldsets: Sequence[Any], replace: Mapping[str, str]) -> list[Any]:
    """*fieldsets* with their fields :func:`fields_in_place`."""
    return [
        (name, {**options, "fields": fields_in_place(options["fields"], replace)})
        for name, options in fieldsets
    ]


def page_context(
    model_admin: Any, request: HttpRequest, title: Any, **context: Any
) -> dict[str, Any]:
    """The context of a page *model_admin* draws itself (one that extends
    ``object_page.html``): the site's (``each_context``), *title* with no subtitle,
    the model's ``opts`` and the admin's ``media``, then *context*. Marks *request*
    as the site's (``current_app``) for the URLs the template reverses."""
    request.current_app = model_admin.admin_site.name
    return {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "subtitle": None,
        "opts": model_admin.opts,
        "media": model_admin.media,
        **context,
    }


class ChangeContextMixin:
    """A change page with more context: ``change_view`` looks the object up (``None``
    when it is missing or hidden) and hands :meth:`change_page_context`'s dict to
    Django's change view, under whatever ``extra_context`` the caller gave.

    Mixins that add context override :meth:`change_page_context` and merge in
    ``super()``'s (what they put last wins)."""

    def change_page_context(self, request: HttpRequest, obj: Any) -> dict[str, Any]:
        """The context the change page of *obj* (or of nothing found) adds."""
        return {}

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: Mapping[str, Any] | None = None,
    ) -> HttpResponse:
        obj = self.get_object(request, unquote(object_id))  # type: ignore[attr-defined]
        context = {**self.change_page_context(request, obj), **(extra_context or {})}
        return super().change_view(request, object_id, form_url, context)  # type: ignore[misc]


class ObjectOperationsMixin:
    """Per-object operation pages: ``<object_id>/<operation.name>/`` for each of
    ``object_operations`` (anything with a ``name``), served by the admin's
    ``operation_view(request, object_id, *, operation)`` and named
    ``<app>_<model>_<operation.name>``, and the other pages of
    :meth:`object_views`."""

    object_operations: Sequence[Any] = ()

    def object_views(self) -> list[tuple[str, Callable[..., HttpResponse]]]:
        """``(name, view)`` of each page of one object the admin adds at
        ``<object_id>/<name>/``: the operations' pages; a mixin adds its own."""
        return [
            (operation.name, partial(self.operation_view, operation=operation))  # type: ignore[attr-defined]
            for operation in self.object_operations
        ]

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name  # type: ignore[attr-defined]
        site = self.admin_site  # type: ignore[attr-defined]
        urls = [
            path(
                f"<path:object_id>/{name}/",
                site.admin_view(view),
                name="{}_{}_{}".format(*info, name),
            )
            for name, view in self.object_views()
        ]
        return urls + super().get_urls()  # type: ignore[misc]

    def object_url(self, obj: Any, operation: Any = None) -> str:
        """The URL of *obj*'s change page, or of its *operation* page (an operation,
        or the name of one of :meth:`object_views`)."""
        opts = self.opts  # type: ignore[attr-defined]
        page = "change" if operation is None else getattr(operation, "name", operation)
        return reverse(
            f"admin:{opts.app_label}_{opts.model_name}_{page}",
            args=[quote(obj.pk)],
            current_app=self.admin_site.name,  # type: ignore[attr-defined]
        )


def confirmed_action(operation: Any, *, permission: str, description: Any) -> Callable[..., Any]:
    """The changelist action ``<operation.name>_selected`` of a
    :class:`ConfirmedOperationsMixin` admin, for users with *permission* (the admin's
    ``has_<permission>_permission``), listed as *description*."""

    def action(model_admin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        return model_admin.run_confirmed_action(request, operation, queryset)

    action.__name__ = action.__qualname__ = f"{operation.name}_selected"
    return admin.action(permissions=[permission], description=description)(action)


class ConfirmedOperationsMixin(ObjectOperationsMixin):
    """Operations (``name``, ``title``) asked first, like Django's "Delete selected":
    on the rows selected in the list (actions made by :func:`confirmed_action`) or on
    one object (its operation pages).

    The admin draws the question, ``_confirmation(request, operation, objects, **extra)``
    (*extra*: the one object, for its page, and the admin's own), with
    :meth:`confirmation_context`; its form posts ``post=yes``. An action then calls
    ``_act_on_selected(request, operation, objects)``: ``None`` goes back to the list."""

    def run_confirmed_action(
        self, request: HttpRequest, operation: Any, queryset: QuerySet[Any]
    ) -> HttpResponse | None:
        """The confirmation page of *operation* on the selected rows, or, when it was
        confirmed, what ``_act_on_selected`` makes of it."""
        objects = list(queryset)
        if request.POST.get("post") != "yes":
            return self._confirmation(request, operation, objects)  # type: ignore[attr-defined]
        return self._act_on_selected(request, operation, objects)  # type: ignore[attr-defined]

    def confirmation_context(
        self, request: HttpRequest, operation: Any, obj: Any = None, /, **context: Any
    ) -> dict[str, Any]:
        """The context of the page asking to confirm *operation* (titled
        ``operation.title``), then *context*: on the selected rows (the form posts the
        action ``<name>_selected`` again; "No" goes back to the list), or on *obj*
        alone (from its page, which "No" goes back to)."""
        if obj is None:
            action, cancel_url = f"{operation.name}_selected", request.get_full_path()
        else:
            action, cancel_url = None, self.object_url(obj)
        return page_context(
            self,
            request,
            operation.title,
            action_name=action,
            cancel_url=cancel_url,
            action_checkbox_name=helpers.ACTION_CHECKBOX_NAME,
            **context,
        )


#: Stands for the object's key in a reversed URL (see :func:`reverse_for_key`).
_KEY_MARKER = "fw-key-0f3a"
#: What reverse() leaves unencoded in a URL's path.
_URL_SAFE = RFC3986_SUBDELIMS + "/~:@"


def reverse_for_key(viewname: str, key: Any, *, current_app: str) -> str:
    """``reverse(viewname, args=[quote(key)], current_app=current_app)``, resolving
    the URL pattern once per view name rather than once per changelist row."""
    template = _url_template(
        viewname,
        current_app,
        get_script_prefix(),
        get_urlconf() or settings.ROOT_URLCONF,
        get_language(),  # i18n_patterns put it in the path
    )
    # Encoded as reverse() encodes its arguments.
    return template.replace(_KEY_MARKER, url_quote(quote(str(key)), safe=_URL_SAFE))


@lru_cache(maxsize=256)
def _url_template(
    viewname: str, current_app: str, prefix: str, urlconf: Any, language: str | None
) -> str:
    return reverse(viewname, args=[_KEY_MARKER], current_app=current_app)


#: How many characters of an id or a name a list shows (``tables.css``).
ID_WIDTH = 16


def short_id(value: str, width: int = ID_WIDTH) -> SafeString:
    """*value* (an id, a key, a name) as a list shows it: one token that never wraps
    (``tables.css``), cut to *width* characters ending with ``…``, the whole value as
    its title (the object's page shows it whole)."""
    return format_html(
        '<span class="flowwarden-token" title="{}">{}</span>', value, truncate(value, width)
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
