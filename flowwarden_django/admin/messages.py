"""Messages to workflow runs and the events runs publish, in the admin: read-only.

Messages are sent through ``Workflow.send``, the API or ``flowwarden_workflows
send``, and events are set by steps, so both are listed and shown here, never added,
edited or deleted. They are the run's data: holders of ``view_workflowrun`` see them
(as they see them on the run's page), as do holders of the models' own view
permissions. The list of one run's messages or events is ``?coordination_id=<id>``
(the run's page links to it).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin import SimpleListFilter
from django.contrib.admin.utils import quote
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..common.formatting import NONE_TEXT, truncate
from ..models import WorkflowEvent, WorkflowMessage
from .base import (
    GuardedLookupsMixin,
    LargeTableAdminMixin,
    ReadOnlyAdminMixin,
    age,
    code_or_none,
    field_display,
    fieldset_fields,
    fieldsets_in_place,
    run_url,
    short_id,
    status_badge,
    timestamp,
)
from .run_mailbox import one_line
from .run_texts import pretty_json

VIEW_RUNS_PERMISSION = "flowwarden_django.view_workflowrun"
VIEW_SNAPSHOTS_PERMISSION = "flowwarden_django.view_snapshotrecord"
#: Characters of a topic, a sender or a key in a list (the whole one is its tooltip).
NAME_WIDTH = 16
#: Characters of a coordination id in a list, as in the runs' list.
RUN_WIDTH = 12
#: Characters of a payload or a value in a list (the whole one is its tooltip).
VALUE_WIDTH = 40


class RunListFilter(SimpleListFilter):
    """``?coordination_id=<id>``: the rows of one run (the run's page links here). It
    offers no choices of its own: it shows the run filtered by, with *All* beside it."""

    title = _("run")
    parameter_name = "coordination_id"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        return [(value, truncate(value, NAME_WIDTH))] if value else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(coordination_id=value) if value else queryset


class DeliveryListFilter(SimpleListFilter):
    """Pending (``delivered_to`` is null) or delivered messages."""

    title = _("delivery")
    parameter_name = "delivery"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("pending", _("pending")), ("delivered", _("delivered"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "pending":
            return queryset.filter(delivered_to__isnull=True)
        if self.value() == "delivered":
            return queryset.filter(delivered_to__isnull=False)
        return queryset


class RunDataAdminMixin:
    """Read by who may view runs (``view_workflowrun``), as on the run's page, or holds
    the model's own view permission; the link to a row's run."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(VIEW_RUNS_PERMISSION) or super().has_view_permission(  # type: ignore[misc]
            request, obj
        )

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request) or super().has_module_permission(request)  # type: ignore[misc]

    @admin.display(description=_("run"), ordering="coordination_id")
    def run_link(self, obj: Any) -> SafeString:
        url = run_url(self.admin_site.name, obj.coordination_id)  # type: ignore[attr-defined]
        return format_html('<a href="{}">{}</a>', url, short_id(obj.coordination_id, RUN_WIDTH))

    @admin.display(description=_("run"))
    def run_page_link(self, obj: Any) -> SafeString:
        """The run's whole coordination id, linked to its page (the object's page)."""
        url = run_url(self.admin_site.name, obj.coordination_id)  # type: ignore[attr-defined]
        return format_html('<a href="{}">{}</a>', url, obj.coordination_id)


#: The delivery of a message: its label and icon.
DELIVERY_LABELS = {"delivered": _("delivered"), "pending": _("pending")}
DELIVERY_ICONS = {"delivered": "admin/img/icon-yes.svg", "pending": "admin/img/icon-clock.svg"}


def delivery_badge(message: WorkflowMessage) -> SafeString:
    """``delivered`` or ``pending``, with the admin's yes / clock icon."""
    state = "delivered" if message.delivered_to else "pending"
    return status_badge(
        state, labels=DELIVERY_LABELS, icons=DELIVERY_ICONS, css_class="flowwarden-delivery"
    )


@admin.register(WorkflowMessage)
class WorkflowMessageAdmin(
    RunDataAdminMixin,
    LargeTableAdminMixin,
    GuardedLookupsMixin,
    ReadOnlyAdminMixin,
    admin.ModelAdmin,
):
    """Messages sent to workflow runs: who sent what on which topic, and whether a
    wait of the run took it (the snapshot it was delivered to)."""

    list_display = ["topic_text", "run_link", "delivery", "sender_text", "sent"]
    list_filter = [DeliveryListFilter, RunListFilter]
    search_fields = ["coordination_id__exact", "topic__exact", "idempotency_key__exact"]
    search_help_text = _("Search by coordination id, topic or idempotency key (exact).")
    # The primary key's order: the order the messages were sent in.
    ordering = ["-id"]
    empty_value_display = NONE_TEXT
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "run_page_link",
                    "topic",
                    "sender_full",
                    "sent_at_text",
                    "idempotency_key_text",
                ]
            },
        ),
        (_("Delivery"), {"fields": ["delivery", "delivered_to_text", "delivered_at_text"]}),
        (_("Payload"), {"fields": ["payload_json"]}),
    ]
    readonly_fields = [*fieldset_fields(fieldsets), "delivered_to_id"]

    @admin.display(description=_("topic"), ordering="topic")
    def topic_text(self, obj: WorkflowMessage) -> SafeString:
        return short_id(obj.topic, NAME_WIDTH)

    @admin.display(description=_("delivery"))
    def delivery(self, obj: WorkflowMessage) -> SafeString:
        return delivery_badge(obj)

    @admin.display(description=_("sender"), ordering="sender")
    def sender_text(self, obj: WorkflowMessage) -> SafeString | str:
        return short_id(obj.sender, RUN_WIDTH) if obj.sender else NONE_TEXT

    sent = field_display(age, "sent_at", _("sent"), ordering="id")

    @admin.display(description=_("sender"))
    def sender_full(self, obj: WorkflowMessage) -> str:
        return obj.sender or NONE_TEXT

    sent_at_text = field_display(timestamp, "sent_at", _("sent at"))

    idempotency_key_text = field_display(code_or_none, "idempotency_key", _("idempotency key"))

    @admin.display(description=_("delivered to snapshot"))
    def delivered_to_text(self, obj: WorkflowMessage) -> SafeString | str:
        """The snapshot it was delivered to, linked to its page."""
        if not obj.delivered_to:
            return NONE_TEXT
        url = reverse(
            "admin:flowwarden_django_workflowrun_snapshot",
            args=[quote(obj.coordination_id), quote(obj.delivered_to)],
            current_app=self.admin_site.name,
        )
        return format_html('<a href="{}"><code>{}</code></a>', url, obj.delivered_to)

    #: The snapshot's id without the link, for who may not open snapshot pages.
    delivered_to_id = field_display(code_or_none, "delivered_to", _("delivered to snapshot"))

    delivered_at_text = field_display(timestamp, "delivered_at", _("delivered at"))

    @admin.display(description=_("payload"))
    def payload_json(self, obj: WorkflowMessage) -> SafeString:
        return pretty_json(obj.payload)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if request.user.has_perm(VIEW_SNAPSHOTS_PERMISSION):
            return fieldsets
        # No link to the snapshot page the user may not open (as on the run's page).
        return fieldsets_in_place(fieldsets, {"delivered_to_text": "delivered_to_id"})


@admin.register(WorkflowEvent)
class WorkflowEventAdmin(
    RunDataAdminMixin,
    LargeTableAdminMixin,
    GuardedLookupsMixin,
    ReadOnlyAdminMixin,
    admin.ModelAdmin,
):
    """Values workflow runs published (``ctx.set_event``): the latest per run and key."""

    list_display = ["key_text", "run_link", "value_text", "updated"]
    list_filter = [RunListFilter]
    search_fields = ["coordination_id__exact", "key__exact"]
    search_help_text = _("Search by coordination id or key (exact).")
    # The order of the unique (coordination_id, key) index.
    ordering = ["coordination_id", "key"]
    empty_value_display = NONE_TEXT
    fields = ["run_page_link", "key", "updated_at_text", "value_json"]
    readonly_fields = fields

    @admin.display(description=_("key"), ordering="key")
    def key_text(self, obj: WorkflowEvent) -> SafeString:
        return short_id(obj.key, NAME_WIDTH)

    @admin.display(description=_("value"))
    def value_text(self, obj: WorkflowEvent) -> SafeString:
        text = one_line(obj.value)
        return format_html(
            '<code class="flowwarden-value" title="{}">{}</code>', text, truncate(text, VALUE_WIDTH)
        )

    updated = field_display(age, "updated_at", _("updated"), ordering="updated_at")

    updated_at_text = field_display(timestamp, "updated_at", _("updated at"))

    @admin.display(description=_("value"))
    def value_json(self, obj: WorkflowEvent) -> SafeString:
        return pretty_json(obj.value)
