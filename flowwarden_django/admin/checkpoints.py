"""Read-only admin page of the ORM checkpoint store's rows.

Checkpoints are written only by the consumers (and deleted with the
``flowwarden_checkpoints`` management command), so the page lists and shows them
and nothing else: no add, no edit, no delete, no actions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.contrib import admin
from django.db import router
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import capfirst
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..common.formatting import NONE_TEXT
from ..models import StreamCheckpoint
from ..streams.backends.orm import OrmCheckpointStore
from ..streams.operations.display import copied_text, last_id_text, progress_time_text
from ..streams.operations.display import short_token as shorten_token
from ..streams.operations.status import instance_key
from ..streams.stores import checkpoint_stores
from ..streams.tokens import token_to_json
from .base import (
    GuardedLookupsMixin,
    ReadOnlyAdminMixin,
    age,
    field_display,
    fieldset_fields,
    short_id,
    timestamp,
)
from .bson_values import bson_html
from .details import HealthDetailsMixin
from .stores import sort_store_aliases


@dataclass(frozen=True)
class HiddenStore:
    """A configured checkpoint store whose checkpoints this admin page does not show."""

    alias: str
    backend: str

    @property
    def command(self) -> str:
        return f"python manage.py flowwarden_checkpoints list --store {self.alias}"


@dataclass(frozen=True)
class AdminStores:
    """Which database the page reads, and which configured stores it cannot show."""

    using: str | None
    hidden: tuple[HiddenStore, ...]


def admin_stores() -> AdminStores:
    """Sort ``CHECKPOINT_STORES`` into what the admin page shows and what it does not.

    The page reads the database of the ORM alias ``"default"`` (else of the first
    ORM alias): its ``OPTIONS["using"]``, or the database router when unset. Other
    backends, and ORM aliases on another database, are listed as hidden. Aliases
    whose backend cannot be loaded are skipped; the system checks report them.
    """
    routed = router.db_for_read(StreamCheckpoint)
    _, using, hidden = sort_store_aliases(checkpoint_stores, OrmCheckpointStore, routed)
    return AdminStores(using, tuple(HiddenStore(alias, what) for alias, what in hidden))


def short_token(data: bytes | memoryview | None) -> SafeString | str:
    """The token's ``_data`` (else its JSON) cut short, with the full relaxed EJSON as a title."""
    return bson_html(
        data,
        lambda token: format_html(
            '<code title="{}">{}</code>', token_to_json(token), shorten_token(token)
        ),
    )


def full_token(data: bytes | memoryview | None) -> SafeString | str:
    """The whole token as indented relaxed Extended JSON in a ``<pre>`` block."""
    return bson_html(data, _pretty_token)


def _pretty_token(token: dict[str, Any]) -> SafeString:
    # Relaxed EJSON is plain JSON, so reloading it only adds indentation (order is kept).
    pretty = json.dumps(json.loads(token_to_json(token)), indent=2, ensure_ascii=False)
    return format_html('<pre class="flowwarden-token">{}</pre>', pretty)


def initial_sync_table(progress: Mapping[str, Any] | None) -> SafeString | str:
    """An initial sync's progress as a small table: phase and reason, copied of
    estimated, started / last batch / finished times, last ``_id`` and batch number;
    ``"—"`` for a stream that never copied."""
    if not progress:
        return NONE_TEXT
    phase = str(progress.get("phase") or NONE_TEXT)
    reason = progress.get("reason")
    rows: list[tuple[str, Any]] = [
        (gettext("phase"), f"{phase} ({reason})" if reason else phase),
        (gettext("copied"), copied_text(progress)),
        (gettext("started at"), _moment(progress.get("started_at"))),
    ]
    if "updated_at" in progress:
        rows.append((gettext("last batch at"), _moment(progress.get("updated_at"))))
    rows += [
        (gettext("finished at"), _moment(progress.get("finished_at"))),
        (gettext("last _id"), _last_id(progress.get("last_id"))),
        (gettext("batch"), NONE_TEXT if progress.get("batch") is None else progress["batch"]),
    ]
    return format_html(
        '<table class="flowwarden-initial-sync"><tbody>{}</tbody></table>',
        format_html_join("", '<tr><th scope="row">{}</th><td>{}</td></tr>', rows),
    )


def _moment(value: Any) -> SafeString | str:
    """A progress record's ISO 8601 time with its age (as it is when unparsable)."""
    return progress_time_text(value, timestamp)


def _last_id(stored: Any) -> SafeString | str:
    """The last copied ``_id`` as relaxed Extended JSON in ``<code>``."""
    return NONE_TEXT if stored is None else format_html("<code>{}</code>", last_id_text(stored))


@admin.register(StreamCheckpoint)
class StreamCheckpointAdmin(
    HealthDetailsMixin, GuardedLookupsMixin, ReadOnlyAdminMixin, admin.ModelAdmin
):
    """View-only list and detail of ``StreamCheckpoint`` rows (the ORM checkpoint store).

    Rows are read from the database of the ORM store alias ``"default"`` when its
    ``OPTIONS["using"]`` names one (see :func:`admin_stores`). Checkpoints kept by
    other backends are not in this table; the changelist names those aliases and the
    management command that lists them. The owner's instance id is shown only to whom
    ``FLOWWARDEN["HEALTH_DETAILS"]`` names, its key to the others.
    """

    list_display = [
        "stream",
        "instance",
        "processed_token",
        "processed_age",
        "seen_token",
        "seen_age",
        "heartbeat_age",
    ]
    search_fields = ["stream_name"]
    empty_value_display = NONE_TEXT
    actions = None
    fieldsets = [
        (None, {"fields": ["stream_name", "instance_id"]}),
        (_("Processed anchor"), {"fields": ["processed_token_full", "processed_at"]}),
        (_("Seen anchor"), {"fields": ["seen_token_full", "seen_at"]}),
        (_("Heartbeat"), {"fields": ["heartbeat_at"]}),
        (_("Initial sync"), {"fields": ["initial_sync_progress"]}),
        (_("Metadata"), {"fields": ["metadata_json"]}),
    ]
    detail_fields = {"instance": "instance_key_text", "instance_id": "instance_key_text"}
    readonly_fields = [*fieldset_fields(fieldsets), "instance_key_text"]

    # -- data ----------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[StreamCheckpoint]:
        queryset = super().get_queryset(request)
        using = admin_stores().using
        return queryset.using(using) if using else queryset

    def changelist_view(
        self, request: HttpRequest, extra_context: Mapping[str, Any] | None = None
    ) -> HttpResponse:
        context = {
            "title": capfirst(StreamCheckpoint._meta.verbose_name_plural),
            "hidden_checkpoint_stores": admin_stores().hidden,
            **(extra_context or {}),
        }
        return super().changelist_view(request, context)

    # -- changelist columns ------------------------------------------------------------

    @admin.display(description=_("stream"), ordering="stream_name")
    def stream(self, obj: StreamCheckpoint) -> SafeString:
        return short_id(obj.stream_name, 24)

    @admin.display(description=_("instance id"), ordering="instance_id")
    def instance(self, obj: StreamCheckpoint) -> SafeString | str:
        return short_id(obj.instance_id, 24) if obj.instance_id else NONE_TEXT

    @admin.display(description=_("instance key"))
    def instance_key_text(self, obj: StreamCheckpoint) -> SafeString | str:
        """The owner's key (``instance_key``), for users who may not see its id."""
        if not obj.instance_id:
            return NONE_TEXT
        return format_html("<code>{}</code>", instance_key(obj.instance_id))

    @admin.display(description=_("last processed token"))
    def processed_token(self, obj: StreamCheckpoint) -> SafeString | str:
        return short_token(obj.last_processed_token)

    processed_age = field_display(
        age, "last_processed_at", _("processed age"), ordering="last_processed_at"
    )

    @admin.display(description=_("last seen token"))
    def seen_token(self, obj: StreamCheckpoint) -> SafeString | str:
        return short_token(obj.last_seen_token)

    seen_age = field_display(age, "last_seen_at", _("seen age"), ordering="last_seen_at")

    heartbeat_age = field_display(
        age, "last_heartbeat_at", _("heartbeat age"), ordering="last_heartbeat_at"
    )

    # -- detail fields ---------------------------------------------------------------

    @admin.display(description=_("last processed token"))
    def processed_token_full(self, obj: StreamCheckpoint) -> SafeString | str:
        return full_token(obj.last_processed_token)

    processed_at = field_display(timestamp, "last_processed_at", _("last processed at"))

    @admin.display(description=_("last seen token"))
    def seen_token_full(self, obj: StreamCheckpoint) -> SafeString | str:
        return full_token(obj.last_seen_token)

    seen_at = field_display(timestamp, "last_seen_at", _("last seen at"))

    heartbeat_at = field_display(timestamp, "last_heartbeat_at", _("last heartbeat at"))

    @admin.display(description=_("progress"))
    def initial_sync_progress(self, obj: StreamCheckpoint) -> SafeString | str:
        return initial_sync_table(obj.initial_sync)

    @admin.display(description=_("metadata"))
    def metadata_json(self, obj: StreamCheckpoint) -> SafeString:
        text = json.dumps(obj.metadata or {}, indent=2, sort_keys=True, default=str)
        return format_html("<pre>{}</pre>", text)
