"""The dead-letter console: the ORM dead-letter store's rows in the admin.

Entries are listed and shown, never edited: operators replay, acknowledge or
discard them through ``streams/operations/replay.py`` (which changes their status with a
compare-and-set), as changelist actions or as buttons on an entry's page. Every
operation asks for confirmation first, like Django's "Delete selected".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.db import router
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext, ngettext, ngettext_lazy
from django.utils.translation import gettext_lazy as _

from ..common.formatting import NONE_TEXT
from ..common.user_input import UserJSONError, check_note
from ..models import DeadLetter
from ..streams.backends.orm import OrmDlqStore
from ..streams.operations.replay import (
    acknowledge_dead_letter,
    discard_dead_letter,
    replay_dead_letter,
)
from ..streams.operations.status import status_error
from ..streams.stores import dlq_stores
from .base import (
    ChangeContextMixin,
    ConfirmedOperationsMixin,
    GuardedLookupsMixin,
    ReadOnlyAdminMixin,
    age,
    confirmed_action,
    field_display,
    fieldset_fields,
    html_or_none,
    short_id,
    status_badge,
    timestamp,
    with_note,
)
from .bson_values import bson_html
from .details import error_text
from .stores import sort_store_aliases

PENDING = DeadLetter.Status.PENDING

logger = logging.getLogger("flowwarden_django.admin")

#: The admin icon shown next to each status.
STATUS_ICONS = {
    DeadLetter.Status.PENDING: "admin/img/icon-alert.svg",
    DeadLetter.Status.REPLAYING: "admin/img/icon-clock.svg",
    DeadLetter.Status.REPLAYED: "admin/img/icon-yes.svg",
    DeadLetter.Status.ACKNOWLEDGED: "admin/img/icon-yes.svg",
    DeadLetter.Status.DISCARDED: "admin/img/icon-no.svg",
}

DOCUMENT_KEY_WIDTH = 13


# -- which store the console acts through --------------------------------------------


@dataclass(frozen=True)
class HiddenDlqStore:
    """A configured dead-letter store whose entries this console does not show."""

    alias: str
    backend: str


@dataclass(frozen=True)
class DlqAdminStores:
    """The DLQ store alias the console acts through, the database it reads (``None``:
    the router's, when no ORM store is configured), and the stores it cannot show."""

    alias: str | None
    using: str | None
    hidden: tuple[HiddenDlqStore, ...]


def dlq_admin_stores() -> DlqAdminStores:
    """Sort ``DLQ_STORES`` into the ORM store the console uses and the others.

    The console acts through the ORM alias ``"default"`` (else the first ORM
    alias) and reads the database that store uses: its ``OPTIONS["using"]``, or
    the router's ``db_for_write`` when unset (the store reads there too, so the
    list never lags behind an operation just done). Other backends, and ORM
    aliases on another database, are listed as hidden. Aliases whose backend
    cannot be loaded are skipped; the system checks report them.
    """
    routed = router.db_for_write(DeadLetter)
    shown, using, hidden = sort_store_aliases(dlq_stores, OrmDlqStore, routed)
    return DlqAdminStores(
        shown,
        (using or routed) if shown is not None else None,
        tuple(HiddenDlqStore(alias, what) for alias, what in hidden),
    )


# -- rendering BSON values ---------------------------------------------------------------


def _relaxed_json(document: Mapping[str, Any], indent: int | None = None) -> str:
    from bson import json_util  # present: the document was just decoded with it

    return json_util.dumps(document, json_options=json_util.RELAXED_JSON_OPTIONS, indent=indent)


def pretty_bson(data: bytes | memoryview | None) -> SafeString | str:
    """A stored BSON document as indented relaxed Extended JSON in a ``<pre>`` block."""
    return bson_html(
        data,
        lambda document: format_html(
            '<pre class="flowwarden-bson">{}</pre>', _relaxed_json(document, indent=2)
        ),
    )


def short_document_key(data: bytes | memoryview | None) -> SafeString | str:
    """The key's ``_id`` (an ObjectId as its hex) cut short, with the full key as a title."""
    return bson_html(data, _short_key)


def _short_key(document: dict[str, Any]) -> SafeString:
    full = _relaxed_json(document)
    value: Any = json.loads(full)
    if list(value) == ["_id"]:
        value = value["_id"]
        if isinstance(value, dict) and list(value) == ["$oid"]:
            value = value["$oid"]
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if len(text) > DOCUMENT_KEY_WIDTH:  # the end of an ObjectId tells keys apart
        text = f"{text[:4]}…{text[-(DOCUMENT_KEY_WIDTH - 5) :]}"
    return format_html('<code title="{}">{}</code>', full, text)


def status_label(status: str) -> str:
    """The human label of a status (``"replayed"``), or the raw value when unknown."""
    return str(dict(DeadLetter.Status.choices).get(status, status))


def dlq_status_badge(status: str) -> SafeString:
    """The status as the admin shows booleans: an icon, then the label."""
    labels = dict(DeadLetter.Status.choices)
    return status_badge(
        status, labels=labels, icons=STATUS_ICONS, css_class="flowwarden-dlq-status"
    )


# -- operations ---------------------------------------------------------------------


@dataclass(frozen=True)
class Operation:
    """One thing operators do to dead letters, with the words the admin uses for it."""

    name: str
    permission: str
    label: str
    past: str
    title: str
    question: str
    button: str
    done: Any  # ngettext_lazy(..., "count")
    failed: Any
    takes_note: bool = False
    #: The statuses it applies to: a replay needs a pending entry; acknowledging or
    #: discarding also settles one left replaying by a replay that died midway.
    applies_to: tuple[str, ...] = (DeadLetter.Status.PENDING, DeadLetter.Status.REPLAYING)


REPLAY = Operation(
    name="replay",
    applies_to=(DeadLetter.Status.PENDING,),
    label=_("Replay"),
    past=_("Replayed from the dead-letter console."),
    permission="replay",
    title=_("Replay dead letters"),
    question=_(
        "Run the selected dead letters through the current handlers of their streams? "
        "An entry that succeeds is marked replayed; one that fails again stays pending "
        "with the new error."
    ),
    button=_("Yes, replay"),
    done=ngettext_lazy(
        "Replayed %(count)d dead letter.", "Replayed %(count)d dead letters.", "count"
    ),
    failed=_("Replay of dead letter “%(id)s” (%(stream)s) failed: %(error)s"),
)
ACKNOWLEDGE = Operation(
    name="acknowledge",
    label=_("Acknowledge"),
    past=_("Acknowledged from the dead-letter console."),
    permission="resolve",
    title=_("Acknowledge dead letters"),
    question=_("Mark the selected dead letters as handled by hand? They will not be replayed."),
    button=_("Yes, acknowledge"),
    done=ngettext_lazy(
        "Acknowledged %(count)d dead letter.", "Acknowledged %(count)d dead letters.", "count"
    ),
    failed=_("Dead letter “%(id)s” (%(stream)s) could not be acknowledged: %(error)s"),
    takes_note=True,
)
DISCARD = Operation(
    name="discard",
    label=_("Discard"),
    past=_("Discarded from the dead-letter console."),
    permission="resolve",
    title=_("Discard dead letters"),
    question=_(
        "Discard the selected dead letters? Their events will not be handled; the entries "
        "are kept until they expire."
    ),
    button=_("Yes, discard"),
    done=ngettext_lazy(
        "Discarded %(count)d dead letter.", "Discarded %(count)d dead letters.", "count"
    ),
    failed=_("Dead letter “%(id)s” (%(stream)s) could not be discarded: %(error)s"),
    takes_note=True,
)
OPERATIONS = (REPLAY, ACKNOWLEDGE, DISCARD)


@dataclass
class Report:
    """What one operation did to each entry it was asked about."""

    done: list[DeadLetter] = field(default_factory=list)
    failed: list[tuple[DeadLetter, str]] = field(default_factory=list)
    #: Entries that were not pending, with their status then ("" when not known).
    skipped: list[tuple[DeadLetter, str]] = field(default_factory=list)


def perform(
    operation: Operation,
    entries: Sequence[DeadLetter],
    *,
    store: str,
    by: str,
    note: str = "",
    describe: Callable[[Exception], str] = status_error,
) -> Report:
    """Run *operation* on each pending entry, oldest first; skip the others.

    An entry that stops being pending between the page and the call (another
    operator was faster) is skipped too: every operation is a compare-and-set.
    A store error fails that entry only, so the report still tells what the
    entries before it became; *describe* tells the error (a page passes
    :func:`~.details.error_text` for its user).
    """
    report = Report()
    for entry in sorted(entries, key=lambda e: (e.created_at, e.pk)):
        if entry.status not in operation.applies_to:
            report.skipped.append((entry, entry.status))
            continue
        try:
            _perform_one(operation, entry, report, store=store, by=by, note=note)
        except Exception as exc:
            logger.exception("%s of dead letter %s failed", operation.name, entry.pk)
            report.failed.append((entry, describe(exc)))
    return report


def _perform_one(
    operation: Operation, entry: DeadLetter, report: Report, *, store: str, by: str, note: str
) -> None:
    if operation is REPLAY:
        outcome = replay_dead_letter(entry.pk, store=store, by=by)
        if outcome.succeeded:
            report.done.append(entry)
        elif outcome.status in (PENDING, ""):  # the handler failed again, or it is gone
            report.failed.append((entry, outcome.error))
        else:
            report.skipped.append((entry, outcome.status))
        return
    settle = acknowledge_dead_letter if operation is ACKNOWLEDGE else discard_dead_letter
    if settle(entry.pk, store=store, by=by, note=note):
        report.done.append(entry)
    else:
        report.skipped.append((entry, ""))


@admin.register(DeadLetter)
class DeadLetterAdmin(
    GuardedLookupsMixin,
    ReadOnlyAdminMixin,
    ConfirmedOperationsMixin,
    ChangeContextMixin,
    admin.ModelAdmin,
):
    """The dead-letter console: list, filter and inspect parked events, and replay,
    acknowledge or discard them.

    Rows are read from the database of the ORM DLQ store alias ``"default"`` (see
    :func:`dlq_admin_stores`), and every operation goes through that alias.
    Entries are never edited or deleted here (expired ones are purged). Replaying
    needs ``flowwarden_django.replay_deadletter``; acknowledging and discarding
    need ``flowwarden_django.resolve_deadletter``.
    """

    # Five columns fit a 1280 px window beside the navigation sidebar and the filters:
    # the operation goes under the stream, the attempts and replays under the status.
    list_display = [
        "created",
        "stream_and_operation",
        "document_key_short",
        "error_kind",
        "status_and_counts",
    ]
    list_filter = [
        ("stream_name", admin.AllValuesFieldListFilter),
        "status",
        ("operation_type", admin.AllValuesFieldListFilter),
    ]
    search_fields = ["id", "error_message"]
    search_help_text = _("Search by entry id or error message.")
    date_hierarchy = "created_at"
    empty_value_display = NONE_TEXT
    actions = ["replay_selected", "acknowledge_selected", "discard_selected"]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "id",
                    "stream_name",
                    "operation_type",
                    "status_icon",
                    "attempts",
                    "created_at_text",
                    "first_attempt_at_text",
                    "last_attempt_at_text",
                    "expires_at_text",
                ]
            },
        ),
        (_("Event"), {"fields": ["document_key_json", "full_document_json", "resume_token_json"]}),
        (_("Error"), {"fields": ["error_type", "error_message", "stack_trace_text"]}),
        (_("Metadata"), {"fields": ["metadata_json"]}),
        (
            _("Replay history"),
            {
                "fields": [
                    "replay_count",
                    "last_replayed_at_text",
                    "resolved_at_text",
                    "resolved_by",
                    "note",
                ]
            },
        ),
    ]
    readonly_fields = fieldset_fields(fieldsets)

    object_operations = OPERATIONS

    # -- permissions: view, plus the operations ------------------------------------------

    def _has_perm(self, request: HttpRequest, action: str) -> bool:
        codename = get_permission_codename(action, self.opts)
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    def has_replay_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """May the user replay dead letters (``replay_deadletter``)?"""
        return self._has_perm(request, "replay")

    def has_resolve_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """May the user acknowledge or discard dead letters (``resolve_deadletter``)?"""
        return self._has_perm(request, "resolve")

    def _allowed(self, request: HttpRequest, operation: Operation) -> bool:
        return getattr(self, f"has_{operation.permission}_permission")(request)

    # -- data ----------------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[DeadLetter]:
        queryset = super().get_queryset(request)
        using = dlq_admin_stores().using
        return queryset.using(using) if using else queryset

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # Without an ORM DLQ store there is nothing to act through. *action_location*:
        # Django 6.1's (actions on change forms too); 5.2 passes none.
        if dlq_admin_stores().alias is None:
            return {}
        if action_location is None:
            return super().get_actions(request)
        return super().get_actions(request, action_location=action_location)

    def changelist_view(
        self, request: HttpRequest, extra_context: Mapping[str, Any] | None = None
    ) -> HttpResponse:
        stores = dlq_admin_stores()
        context = {
            "hidden_dlq_stores": stores.hidden,
            "dlq_store_missing": stores.alias is None,
            **(extra_context or {}),
        }
        return super().changelist_view(request, context)

    def change_page_context(self, request: HttpRequest, entry: DeadLetter | None) -> dict[str, Any]:
        tools = []
        if entry is not None and dlq_admin_stores().alias:
            tools = [
                (operation, self.object_url(entry, operation))
                for operation in OPERATIONS
                if self._allowed(request, operation) and entry.status in operation.applies_to
            ]
        return {"dlq_operations": tools}

    # -- changelist columns ------------------------------------------------------------

    created = field_display(age, "created_at", _("created"), ordering="created_at")

    document_key_short = field_display(short_document_key, "document_key", _("document key"))

    @admin.display(description=_("error type"), ordering="error_type")
    def error_kind(self, obj: DeadLetter) -> SafeString:
        return format_html(
            '<span class="flowwarden-token" title="{}">{}</span>',
            obj.error_type,
            _last_name(obj.error_type),
        )

    # Dates as every page of the package writes them (``timestamp``), not Django's default.
    created_at_text = field_display(timestamp, "created_at", _("created at"))

    first_attempt_at_text = field_display(timestamp, "first_attempt_at", _("first attempt at"))

    last_attempt_at_text = field_display(timestamp, "last_attempt_at", _("last attempt at"))

    expires_at_text = field_display(timestamp, "expires_at", _("expires at"))

    @admin.display(description=_("stream / operation"), ordering="stream_name")
    def stream_and_operation(self, obj: DeadLetter) -> SafeString:
        return with_note(short_id(obj.stream_name, 14), obj.operation_type, below=True)

    status_icon = field_display(dlq_status_badge, "status", _("status"), ordering="status")

    @admin.display(description=_("status, attempts, replays"), ordering="status")
    def status_and_counts(self, obj: DeadLetter) -> SafeString:
        counts = (
            ngettext("%(n)d attempt", "%(n)d attempts", obj.attempts) % {"n": obj.attempts}
            + ", "
            + ngettext("%(n)d replay", "%(n)d replays", obj.replay_count) % {"n": obj.replay_count}
        )
        return with_note(dlq_status_badge(obj.status), counts, below=True)

    # -- detail fields ---------------------------------------------------------------

    document_key_json = field_display(pretty_bson, "document_key", _("document key"))

    full_document_json = field_display(pretty_bson, "full_document", _("full document"))

    resume_token_json = field_display(pretty_bson, "resume_token", _("resume token"))

    stack_trace_text = field_display(
        html_or_none('<pre class="flowwarden-stack-trace">{}</pre>'),
        "stack_trace",
        _("stack trace"),
    )

    @admin.display(description=_("metadata"))
    def metadata_json(self, obj: DeadLetter) -> SafeString:
        text = json.dumps(obj.metadata or {}, indent=2, sort_keys=True, default=str)
        return format_html("<pre>{}</pre>", text)

    last_replayed_at_text = field_display(timestamp, "last_replayed_at", _("last replayed at"))

    resolved_at_text = field_display(timestamp, "resolved_at", _("resolved at"))

    # -- actions: a confirmation page, then the operation -------------------------------

    replay_selected = confirmed_action(
        REPLAY, permission="replay", description=_("Replay selected %(verbose_name_plural)s")
    )
    acknowledge_selected = confirmed_action(
        ACKNOWLEDGE,
        permission="resolve",
        description=_("Acknowledge selected %(verbose_name_plural)s"),
    )
    discard_selected = confirmed_action(
        DISCARD, permission="resolve", description=_("Discard selected %(verbose_name_plural)s")
    )

    def _act_on_selected(
        self, request: HttpRequest, operation: Operation, entries: Sequence[DeadLetter]
    ) -> None:
        self._perform_and_report(request, operation, entries)  # then back to the changelist

    # -- the same operations from an entry's page ---------------------------------------

    def operation_view(
        self, request: HttpRequest, object_id: str, *, operation: Operation
    ) -> HttpResponse:
        """Confirm (GET), then run (POST ``post=yes``) *operation* on one entry."""
        entry = self.get_object(request, unquote(object_id))
        if entry is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if not (self.has_view_permission(request, entry) and self._allowed(request, operation)):
            raise PermissionDenied
        if request.method == "POST" and request.POST.get("post") == "yes":
            self._perform_and_report(request, operation, [entry])
            return HttpResponseRedirect(self.object_url(entry))
        return self._confirmation(request, operation, [entry], entry=entry)

    # -- shared steps ------------------------------------------------------------------

    def _confirmation(
        self,
        request: HttpRequest,
        operation: Operation,
        entries: Sequence[DeadLetter],
        entry: DeadLetter | None = None,
    ) -> TemplateResponse:
        rows = [
            {
                "entry": row,
                "url": self.object_url(row),
                "document_key": short_document_key(row.document_key),
                "error_type": _last_name(row.error_type),
                "status": dlq_status_badge(row.status),
                "pending": row.status in operation.applies_to,
            }
            for row in entries
        ]
        context = self.confirmation_context(
            request,
            operation,
            entry,
            operation=operation,
            rows=rows,
            pending_count=sum(1 for row in rows if row["pending"]),
            entry=entry,
            store_missing=dlq_admin_stores().alias is None,
        )
        app_label, model_name = self.opts.app_label, self.opts.model_name
        templates = [
            f"admin/{app_label}/{model_name}/operation_confirmation.html",
            f"admin/{app_label}/operation_confirmation.html",
        ]
        return TemplateResponse(request, templates, context)

    def _perform_and_report(
        self, request: HttpRequest, operation: Operation, entries: Sequence[DeadLetter]
    ) -> None:
        alias = dlq_admin_stores().alias
        if alias is None:
            self.message_user(
                request,
                gettext("No ORM dead-letter store is configured, so nothing was changed."),
                messages.ERROR,
            )
            return
        note = request.POST.get("note", "").strip() if operation.takes_note else ""
        try:
            check_note(note, what=gettext("The note"))
        except UserJSONError as exc:
            self.message_user(request, gettext("Nothing was changed: %s.") % exc, messages.ERROR)
            return
        report = perform(
            operation,
            entries,
            store=alias,
            by=request.user.get_username(),
            note=note,
            describe=partial(error_text, request),
        )
        self._report(request, operation, report)
        for entry in report.done:
            self.log_change(request, entry, str(operation.past))

    def _report(self, request: HttpRequest, operation: Operation, report: Report) -> None:
        notify: Callable[..., None] = partial(self.message_user, request)
        if report.done:
            notify(operation.done % {"count": len(report.done)}, messages.SUCCESS)
        for entry, error in report.failed:
            values = {"id": entry.pk, "stream": entry.stream_name, "error": error}
            notify(operation.failed % values, messages.ERROR)
        if report.skipped:
            count = len(report.skipped)
            text = ngettext(
                "Skipped %(count)d dead letter that is not pending: %(entries)s",
                "Skipped %(count)d dead letters that are not pending: %(entries)s",
                count,
            )
            listed = ", ".join(
                f"{entry.pk} ({status_label(status)})" if status else entry.pk
                for entry, status in report.skipped
            )
            notify(text % {"count": count, "entries": listed}, messages.WARNING)


def _last_name(dotted: str) -> str:
    """``"myapp.errors.PaymentRejected"`` → ``"PaymentRejected"``."""
    return dotted.rsplit(".", 1)[-1]
