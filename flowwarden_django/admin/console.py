"""The "Streams" page of the admin: every declared stream as all processes report it,
with Start / Stop / Restart and Resync, and each stream's initial-sync progress.

It is the changelist of ``StreamWorker`` (listed as "Stream workers" in the app
index). Viewing needs the view permission of stream workers (or the control
permission); the buttons need ``flowwarden_django.control_stream``. Each button
leads to a confirmation page whose POST writes the stream's ``StreamControl`` row;
every ``StreamManager`` reads it within ``FLOWWARDEN["STATUS_INTERVAL"]``. Resync
also writes an on-demand initial-sync request with the stream's checkpoint (see
``streams.resync``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern, re_path, reverse
from django.utils import timezone
from django.utils.html import conditional_escape, format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..common.formatting import NONE_TEXT, relative_time, truncate
from ..models import StreamControl, StreamWorker
from ..streams.initial_sync.progress import CopyProgress
from ..streams.initial_sync.resync import ResyncError, request_resync
from ..streams.operations.display import state_notes
from ..streams.operations.status import (
    StreamStatus,
    status_error,
    status_interval,
    stream_status,
)
from ..streams.registry import stream_registry
from ..streams.spec import StreamSpec
from ..views import may_see_details
from .base import GuardedLookupsMixin, ReadOnlyAdminMixin
from .details import redact_worker

#: The permission the Start / Stop / Restart buttons need.
CONTROL_PERMISSION = "flowwarden_django.control_stream"

CONSOLE_TEMPLATE = "admin/flowwarden_django/streams/console.html"
CONFIRM_TEMPLATE = "admin/flowwarden_django/streams/confirm.html"


@dataclasses.dataclass(frozen=True)
class StreamAction:
    """One operator request: its button, its confirmation text and its effect."""

    name: str
    label: str
    question: str
    explanation: str
    done: str
    #: The ``StreamControl`` fields it writes, given the time of the request.
    changes: Callable[[datetime], dict[str, Any]]
    #: Instead of *changes*: what the request does, given the stream, the user and the
    #: time (it may raise ``ResyncError``).
    perform: Callable[[str, str, datetime], None] | None = None

    def available(self, status: StreamStatus) -> bool:
        """Whether the button makes sense for the stream as it is now."""
        if not status.enabled:
            return False
        if self.name == "resync":
            return not (status.initial_sync is not None and status.initial_sync.copying)
        return status.paused if self.name == "start" else not status.paused

    def apply(self, stream_name: str, user: str, now: datetime) -> None:
        """Carry out the request."""
        if self.perform is not None:
            self.perform(stream_name, user, now)
        else:
            StreamControl.request(stream_name, by=user, at=now, **self.changes(now))


ACTIONS: dict[str, StreamAction] = {
    action.name: action
    for action in (
        StreamAction(
            "start",
            _("Start"),
            _("Start the stream “%(name)s”?"),
            _(
                "The stream is no longer paused: the processes that run it start it again "
                "(for a single-leader stream, the process that holds or wins the lease), "
                "resuming from its checkpoint."
            ),
            _("Stream “%(name)s” will start within %(seconds)s seconds."),
            lambda now: {"paused": False},
        ),
        StreamAction(
            "stop",
            _("Stop"),
            _("Stop the stream “%(name)s”?"),
            _(
                "Every process stops consuming it, saves its checkpoint and keeps it "
                "stopped, even across process restarts, until someone starts it here. "
                "Changes made meanwhile are consumed after the start, as long as they are "
                "still in the oplog."
            ),
            _("Stream “%(name)s” is paused: every process stops it within %(seconds)s seconds."),
            lambda now: {"paused": True},
        ),
        StreamAction(
            "restart",
            _("Restart"),
            _("Restart the stream “%(name)s”?"),
            _(
                "Every process running it stops it, saving its checkpoint, and starts it "
                "again from that checkpoint. Events are not lost."
            ),
            _("Stream “%(name)s” will restart within %(seconds)s seconds."),
            lambda now: {"restart_requested_at": now},
        ),
        StreamAction(
            "resync",
            _("Resync"),
            _("Copy the collection of stream “%(name)s” again?"),
            _(
                "Every process running it restarts it and hands every document of its "
                "collection to its snapshot handler (on_snapshot, else on_insert), then "
                "streams from the position taken before the copy: changes made during the "
                "copy are delivered after it. Handlers must be idempotent. The progress "
                "shows here."
            ),
            _("Stream “%(name)s” will copy its collection again within %(seconds)s seconds."),
            lambda now: {},
            perform=lambda name, user, now: request_resync(name, by=user, now=now),
        ),
    )
}


@dataclasses.dataclass(frozen=True)
class ActionLink:
    """A button of the console: label and URL of the confirmation page."""

    name: str
    label: str
    url: str


@dataclasses.dataclass(frozen=True)
class ConsoleRow:
    """One stream on the console page, with its cells ready to render."""

    status: StreamStatus
    notes: tuple[str, ...]
    last_event: SafeString | str
    checkpoint_age: SafeString | str
    heartbeat_age: SafeString | str
    dlq_url: str | None
    actions: tuple[ActionLink, ...]
    #: The initial sync in progress, shown as a progress bar.
    copy: CopyProgress | None = None


def age_html(at: datetime | None, now: datetime) -> SafeString | str:
    """``"3 minutes ago"`` in a ``<time>`` with the ISO timestamp as title; ``"—"`` if unknown."""
    if at is None:
        return NONE_TEXT
    text = relative_time(at, now)
    return format_html('<time datetime="{0}" title="{0}">{1}</time>', at.isoformat(), text)


def dead_letters_url(stream_name: str | None = None) -> str | None:
    """The dead-letter changelist; given *stream_name*, its pending entries (its backlog).

    ``None`` when dead letters are not in the admin.
    """
    try:
        url = reverse("admin:flowwarden_django_deadletter_changelist")
    except NoReverseMatch:
        return None
    if stream_name is None:
        return url
    return f"{url}?{urlencode({'stream_name': stream_name, 'status__exact': 'PENDING'})}"


@admin.register(StreamWorker)
class StreamConsoleAdmin(GuardedLookupsMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """The "Streams" console, in place of the stream workers' changelist.

    Lists :func:`~flowwarden_django.streams.operations.status.stream_status` (state, leader,
    instances, ages, DLQ backlog) and, for users with ``control_stream``, offers
    Start / Stop / Restart through a confirmation page.
    """

    # -- permissions -----------------------------------------------------------------

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) or self.has_control_permission(request)

    def has_control_permission(self, request: HttpRequest) -> bool:
        """Whether the user may start, stop and restart streams."""
        return request.user.has_perm(CONTROL_PERMISSION)

    # -- the object's pages (view, history) -------------------------------------------

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> StreamWorker | None:
        """The row, redacted for a user without the details (``HEALTH_DETAILS``): its
        page, its title, its breadcrumbs and its history page show what the console
        shows."""
        worker = super().get_object(request, object_id, from_field)
        if worker is not None and not may_see_details(request):
            worker = redact_worker(worker)
        return worker

    # -- URLs ------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        opts = self.model._meta
        control = re_path(
            r"^control/(?P<action>start|stop|restart|resync)/(?P<stream_name>.+)/$",
            self.admin_site.admin_view(self.control_view),
            name=f"{opts.app_label}_{opts.model_name}_control",
        )
        return [control, *super().get_urls()]

    def console_url(self) -> str:
        """The console page (this model's changelist)."""
        opts = self.model._meta
        return reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")

    def control_url(self, action: str, stream_name: str) -> str:
        """The confirmation page of *action* on *stream_name*."""
        opts = self.model._meta
        return reverse(
            f"admin:{opts.app_label}_{opts.model_name}_control",
            kwargs={"action": action, "stream_name": stream_name},
        )

    # -- views -----------------------------------------------------------------------

    def changelist_view(
        self, request: HttpRequest, extra_context: Mapping[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        now = timezone.now()
        can_control = self.has_control_permission(request)
        details = may_see_details(request)
        try:
            statuses, error = stream_status(now), None
        except Exception as exc:  # the page must say why, not fail with a 500
            statuses, error = [], status_error(exc, details=details)
        if not details:
            statuses = [status.redacted() for status in statuses]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": _("Streams"),
            "rows": [self._row(status, now, can_control) for status in statuses],
            "can_control": can_control,
            "error": error,
            "interval": _seconds(status_interval()),
            "dead_letters_url": dead_letters_url(),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, CONSOLE_TEMPLATE, context)

    def control_view(self, request: HttpRequest, action: str, stream_name: str) -> HttpResponse:
        """GET: the confirmation page. POST: write ``StreamControl``, then back to the list."""
        if not self.has_control_permission(request):
            raise PermissionDenied
        specs = stream_registry.specs()
        if stream_name not in specs or action not in ACTIONS:
            raise Http404(gettext("No stream named “%(name)s”.") % {"name": stream_name})
        spec, chosen = specs[stream_name], ACTIONS[action]
        status = next(s for s in stream_status() if s.name == stream_name)
        if not may_see_details(request):
            status = status.redacted()
        names = {"name": stream_name, "seconds": _seconds(status_interval())}
        if not chosen.available(status):
            messages.warning(request, self._unavailable(chosen, spec, status) % names)
            return HttpResponseRedirect(self.console_url())
        if request.method == "POST":
            try:
                chosen.apply(stream_name, request.user.get_username(), timezone.now())
            except ResyncError as exc:
                messages.error(request, gettext("Cannot resync: %(reason)s.") % {"reason": exc})
                return HttpResponseRedirect(self.console_url())
            messages.success(request, chosen.done % names)
            return HttpResponseRedirect(self.console_url())
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": _("Are you sure?"),
            "action": chosen,
            "question": chosen.question % names,
            "status": status,
            "console_url": self.console_url(),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, CONFIRM_TEMPLATE, context)

    # -- helpers ---------------------------------------------------------------------

    def _row(self, status: StreamStatus, now: datetime, can_control: bool) -> ConsoleRow:
        actions = tuple(
            ActionLink(action.name, str(action.label), self.control_url(action.name, status.name))
            for action in ACTIONS.values()
            if can_control and action.available(status)
        )
        return ConsoleRow(
            status=status,
            notes=_notes(status),
            last_event=age_html(status.last_event_time, now),
            checkpoint_age=age_html(status.checkpoint_at, now),
            heartbeat_age=age_html(status.heartbeat_at, now),
            dlq_url=dead_letters_url(status.name) if status.dlq_store else None,
            actions=actions,
            copy=status.initial_sync
            if status.initial_sync and status.initial_sync.copying
            else None,
        )

    @staticmethod
    def _unavailable(action: StreamAction, spec: StreamSpec, status: StreamStatus) -> str:
        if not spec.enabled:
            return gettext(
                "Stream “%(name)s” is disabled in its declaration (enabled=False); "
                "no process runs it."
            )
        if action.name == "start":
            return gettext("Stream “%(name)s” is not paused.")
        return gettext("Stream “%(name)s” is paused; start it first.")


def _notes(status: StreamStatus) -> tuple[str, ...]:
    notes = state_notes(status, gettext)
    if status.stale_instances:
        # Each id shortened and unbroken, as in the instances' column, whole in its title.
        instances = format_html_join(
            ", ",
            '<code title="{}">{}</code>',
            ((i, truncate(i, 24)) for i in status.stale_instances),
        )
        text = conditional_escape(gettext("no report from %(instances)s"))
        notes.append(mark_safe(text % {"instances": instances}))
    copied = status.initial_sync
    if copied is not None and not copied.copying and copied.finished_at is not None:
        notes.append(
            gettext("last copy: %(summary)s, finished %(when)s")
            % {
                "summary": copied.summary(),
                "when": relative_time(copied.finished_at, timezone.now()),
            }
        )
    if status.error:
        notes.append(status.error)
    return tuple(notes)


def _seconds(value: float) -> str:
    return f"{value:g}"
