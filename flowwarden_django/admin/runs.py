"""Workflow runs in the admin: the runs, each run's snapshot tree, each snapshot's
state and its diff against its parent, and forking a run from a snapshot.

Runs are listed and shown, never edited. Snapshots are read through the run's
snapshot store (the store of its workflow when the workflow is registered in this
process, else the ``snapshot_store_alias`` of the admin), so stores other than the
ORM one work too. Forking needs ``flowwarden_django.fork_workflowrun`` and asks for
confirmation first.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from functools import partial
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.text import capfirst
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from ..common.formatting import NONE_TEXT, state_json, truncate
from ..common.user_input import UserJSONError, parse_user_json
from ..models import Approval, WorkflowRun
from ..workflows.definition.metadata import LAST_STEP
from ..workflows.definition.registry import workflow_registry
from ..workflows.execution.step_timings import step_timing_of
from ..workflows.operations.forking import fork_snapshot as fork_snapshot_in_store
from ..workflows.operations.upgrades import upgrade_runs
from ..workflows.runs.records import UnknownRunError
from ..workflows.storage.snapshot import WorkflowSnapshot
from ..workflows.storage.store import SnapshotStore, snapshot_stores
from ..workflows.waiting.cancellation import cancel_coordination, cancellation_of
from ..workflows.waiting.children import spawned
from .base import (
    GuardedLookupsMixin,
    LargeTableAdminMixin,
    ReadOnlyAdminMixin,
    age,
    reverse_for_key,
    short_id,
    status_badge,
    timestamp,
)
from .details import HealthDetailsMixin, error_text, redacted_runner
from .snapshots import (
    PAGE_SIZE,
    DiffLine,
    NotListableError,
    TreeNode,
    build_forest,
    describe,
    flatten,
    load_page,
    node_badges,
    state_diff,
)

logger = logging.getLogger("flowwarden_django.admin")

#: The permission the fork action needs.
FORK_PERMISSION = "flowwarden_django.fork_workflowrun"
UPGRADE_PERMISSION = "flowwarden_django.upgrade_workflowrun"
CANCEL_PERMISSION = "flowwarden_django.cancel_workflowrun"
#: The most runs one "Cancel" action works on (select fewer, or use the command).
MAX_CANCELLED = 500
#: The most runs one "Upgrade" action works on (select fewer, or use the command).
MAX_UPGRADED = 500
VIEW_SNAPSHOTS_PERMISSION = "flowwarden_django.view_snapshotrecord"

#: The admin icon shown next to each run status.
RUN_STATUS_ICONS = {
    WorkflowRun.Status.RUNNING: "admin/img/icon-clock.svg",
    WorkflowRun.Status.HIBERNATED: "admin/img/icon-clock.svg",
    WorkflowRun.Status.WAITING: "admin/img/icon-alert.svg",
    WorkflowRun.Status.COMPLETED: "admin/img/icon-yes.svg",
    WorkflowRun.Status.FAILED: "admin/img/icon-no.svg",
    WorkflowRun.Status.NEEDS_UPGRADE: "admin/img/icon-alert.svg",
    WorkflowRun.Status.SLEEPING: "admin/img/icon-clock.svg",
    WorkflowRun.Status.WAITING_CHILDREN: "admin/img/icon-clock.svg",
    WorkflowRun.Status.CANCELLED: "admin/img/icon-no.svg",
}

#: The words of the tree's badges.
BADGE_LABELS = {"root": _("root"), "fork": _("fork"), "head": _("head")}

#: How deep branches nest in the drawn tree; deeper ones are drawn as chains of their own.
MAX_BRANCH_DEPTH = 8

PROMPT_WIDTH = 40
TEMPLATES = "admin/flowwarden_django/workflowrun"


def run_status_badge(status: str) -> SafeString:
    """The run status as the admin shows booleans: an icon, then the label."""
    labels = dict(WorkflowRun.Status.choices)
    return status_badge(
        status, labels=labels, icons=RUN_STATUS_ICONS, css_class="flowwarden-run-status"
    )


def tree_step_text(snapshot: WorkflowSnapshot) -> dict[str, str]:
    """What the tree says of how the snapshot's step ran (``duration``, ``attempts``,
    ``errors``: the classes of the failed attempts, never their messages, which may
    quote the state), of its cancellation (``cancelled``), or of the child runs it
    started (``children``: listed on the run's page)."""
    found: dict[str, str] = {}
    cancelled = cancellation_of(snapshot)
    if cancelled:
        found["cancelled"] = cancelled.get("reason") or gettext("cancelled")
    children = spawned(snapshot)
    if children is not None:
        count = len(children.get("workflows") or [])
        found["children"] = ngettext(
            "started %(count)d child run", "started %(count)d child runs", count
        ) % {"count": count}
    timing = step_timing_of(snapshot.metadata)
    if timing is None:
        return found
    if timing.duration_ms is not None:
        found["duration"] = duration_text(timing.duration_ms)
    if timing.attempts and timing.attempts > 1:
        found["attempts"] = ngettext("%(count)d attempt", "%(count)d attempts", timing.attempts) % {
            "count": timing.attempts
        }
    if timing.errors:
        found["errors"] = ", ".join(f"#{e.attempt} {e.error}" for e in timing.errors)
    return found


def duration_text(milliseconds: float) -> str:
    """``850 ms``, ``12.4 s``, ``3 min 5 s``."""
    if milliseconds < 1000:
        return f"{milliseconds:.0f} ms" if milliseconds >= 10 else f"{milliseconds:.1f} ms"
    seconds = milliseconds / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s"


def wakes_text(wake_at: Any) -> SafeString:
    """``wakes in 2 hours`` (``due 3 minutes ago`` once past), the exact time as a title."""
    return format_html(
        "{} {}",
        gettext("wakes") if wake_at > timezone.now() else gettext("due"),
        age(wake_at),
    )


def pretty_json(value: Any) -> SafeString:
    """*value* as indented JSON with sorted keys in a ``<pre>`` block (escaped)."""
    return format_html('<pre class="flowwarden-json">{}</pre>', state_json(value))


# -- which store holds a run's snapshots ----------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunStore:
    """The snapshot store of a run and how the page names it; ``registered`` is
    whether the run's workflow is defined in this process (forks then go through
    ``Workflow.fork``)."""

    store: SnapshotStore
    label: str
    registered: bool


def run_store(workflow_name: str, coordination_id: str, alias: str = "default") -> RunStore:
    """The store of the run's workflow when it is registered, else ``snapshot_stores[alias]``."""
    if workflow_name in workflow_registry:
        store = workflow_registry.get(workflow_name).workflow(coordination_id).store
        label = gettext("the store of workflow “%(name)s” (%(backend)s)") % {
            "name": workflow_name,
            "backend": type(store).__name__,
        }
        return RunStore(store, label, True)
    store = snapshot_stores[alias]
    label = gettext("snapshot store “%(alias)s” (%(backend)s)") % {
        "alias": alias,
        "backend": type(store).__name__,
    }
    return RunStore(store, label, False)


def fork_snapshot(run: WorkflowRun, found: RunStore, snapshot_id: str, state: Any) -> Any:
    """Fork *run* off *snapshot_id* with *state*: ``Workflow.fork`` when the workflow is
    registered (it checks the snapshot belongs to the run), else ``store.fork``."""
    if found.registered and workflow_registry.defines(run.workflow_name, run.workflow_version):
        definition = workflow_registry.get(run.workflow_name, run.workflow_version)
        return definition.workflow(run.coordination_id).fork(snapshot_id, state)
    return fork_snapshot_in_store(found.store, snapshot_id, state)


@admin.register(WorkflowRun)
class WorkflowRunAdmin(
    HealthDetailsMixin,
    LargeTableAdminMixin,
    GuardedLookupsMixin,
    ReadOnlyAdminMixin,
    admin.ModelAdmin,
):
    """Workflow runs: list, filter and inspect them, browse each run's snapshot tree,
    read a snapshot's state and its diff against its parent, and fork a run.

    Runs are written by the engine only, so nothing is added, edited or deleted
    here. Viewing needs ``view_workflowrun``; forking also needs
    ``fork_workflowrun``. Snapshots of runs whose workflow is not registered in this
    process are read from ``snapshot_stores[snapshot_store_alias]``.
    """

    #: The snapshot store alias of runs whose workflow is not registered here.
    snapshot_store_alias = "default"
    #: Snapshots per page of the tree.
    tree_page_size = PAGE_SIZE

    list_display = [
        "coordination",
        "workflow_and_version",
        "status_icon",
        "last_step_text",
        "pending_approval",
        "updated",
    ]
    list_filter = ["status", ("workflow_name", admin.AllValuesFieldListFilter)]
    search_fields = ["coordination_id", "idempotency_key"]
    search_help_text = _("Search by coordination id or idempotency key.")
    date_hierarchy = "updated_at"
    # The order of the fw_run_updated index (the coordination id breaks ties).
    ordering = ["-updated_at", "coordination_id"]
    empty_value_display = NONE_TEXT
    actions = ["upgrade_selected", "cancel_selected"]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "coordination_id",
                    "workflow_name",
                    "workflow_version",
                    "status_icon",
                    "wake_at_text",
                    "last_step_text",
                    "head_snapshot",
                    "idempotency_key",
                    "failure_reason_text",
                    "approvals_list",
                    "parent_run",
                    "child_runs",
                ]
            },
        ),
        (_("Runner"), {"fields": ["runner_text", "claimed_until_text", "attempts"]}),
        (_("Resume input"), {"fields": ["resume_input_json"]}),
        (_("Dates"), {"fields": ["created_at_text", "updated_at_text"]}),
    ]
    #: The runner token names its process's instance (``<hostname>:<pid>``).
    detail_fields = {"runner_text": "runner_key_text"}
    readonly_fields = [
        "coordination_id",
        "workflow_name",
        "workflow_version",
        "status_icon",
        "wake_at_text",
        "last_step_text",
        "head_snapshot",
        "head_snapshot_id",
        "idempotency_key",
        "failure_reason_text",
        "approvals_list",
        "parent_run",
        "child_runs",
        "runner_text",
        "runner_key_text",
        "claimed_until_text",
        "attempts",
        "resume_input_json",
        "created_at_text",
        "updated_at_text",
    ]

    # -- permissions: view, plus fork ------------------------------------------------

    def has_fork_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """May the user fork runs from a snapshot (``fork_workflowrun``)?"""
        return request.user.has_perm(FORK_PERMISSION)

    def has_upgrade_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """May the user upgrade runs to another version (``upgrade_workflowrun``)?"""
        return request.user.has_perm(UPGRADE_PERMISSION)

    def has_cancel_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """May the user cancel runs (``cancel_workflowrun``)?"""
        return request.user.has_perm(CANCEL_PERMISSION)

    @admin.action(permissions=["cancel"], description=_("Cancel the selected runs"))
    def cancel_selected(self, request: HttpRequest, queryset: Any) -> None:
        """Cancel the selected runs (``Workflow.cancel``, by the user): none runs
        another step; each cancelled run gets a history entry. Completed and already
        cancelled runs are left alone."""
        selected = list(queryset.order_by().values_list("pk", flat=True)[: MAX_CANCELLED + 1])
        by = request.user.get_username()
        reason = gettext("cancelled in the admin")
        cancelled, finished = 0, 0
        for cid in selected[:MAX_CANCELLED]:
            try:
                outcome = cancel_coordination(cid, reason, by=by, using=queryset.db)
            except UnknownRunError:
                continue
            if not outcome.cancelled:
                finished += 1
                continue
            cancelled += 1
            run = queryset.model.objects.using(queryset.db).filter(pk=cid).first()
            if run is not None:
                self.log_change(request, run, gettext("Cancelled."))
        text = ngettext("Cancelled %(count)d run.", "Cancelled %(count)d runs.", cancelled)
        level = messages.SUCCESS if cancelled else messages.WARNING
        self.message_user(request, text % {"count": cancelled}, level)
        if finished:
            text = ngettext(
                "%(count)d selected run was already finished and was left alone.",
                "%(count)d selected runs were already finished and were left alone.",
                finished,
            )
            self.message_user(request, text % {"count": finished}, messages.INFO)
        if len(selected) > MAX_CANCELLED:
            self.message_user(
                request,
                gettext(
                    "Only the first %(max)d selected runs were cancelled: run "
                    "`manage.py flowwarden_workflows cancel` for the others."
                )
                % {"max": MAX_CANCELLED},
                messages.WARNING,
            )

    @admin.action(
        permissions=["upgrade"],
        description=_("Upgrade the selected runs (the declared upgrades)"),
    )
    def upgrade_selected(self, request: HttpRequest, queryset: Any) -> None:
        """Apply the declared upgrades (``Workflow.define_upgrade``) to the selected
        runs, as ``flowwarden_workflows upgrade --run ...`` does; each upgraded run
        gets a history entry."""
        selected = list(queryset.order_by().values_list("pk", flat=True)[: MAX_UPGRADED + 1])
        capped = len(selected) > MAX_UPGRADED
        outcomes = upgrade_runs(
            coordination_ids=selected[:MAX_UPGRADED],
            using=queryset.db,
            by=request.user.get_username(),
        )
        upgraded = [o for o in outcomes if o.upgraded]
        runs = {
            run.pk: run for run in queryset.filter(pk__in=[o.coordination_id for o in upgraded])
        }
        for outcome in upgraded:
            text = gettext(
                "Upgraded from version %(from)s (after step “%(from_step)s”) to version "
                "%(to)s (after step “%(to_step)s”)."
            ) % {
                "from": outcome.from_version,
                "from_step": outcome.from_step or "-",
                "to": outcome.to_version,
                "to_step": outcome.to_step or "-",
            }
            if outcome.coordination_id in runs:
                self.log_change(request, runs[outcome.coordination_id], text)
        refused = [o for o in outcomes if not o.upgraded]
        untouched = len(selected[:MAX_UPGRADED]) - len(outcomes)
        text = ngettext("Upgraded %(count)d run.", "Upgraded %(count)d runs.", len(upgraded))
        self.message_user(
            request,
            text % {"count": len(upgraded)},
            messages.SUCCESS if upgraded else messages.WARNING,
        )
        for outcome in refused[:5]:
            self.message_user(
                request,
                gettext("Run “%(run)s” was not upgraded: %(reason)s")
                % {"run": outcome.coordination_id, "reason": outcome.reason},
                messages.WARNING,
            )
        if untouched:
            self.message_user(
                request,
                ngettext(
                    "%(count)d selected run has no declared upgrade from its version.",
                    "%(count)d selected runs have no declared upgrade from their version.",
                    untouched,
                )
                % {"count": untouched},
                messages.INFO,
            )
        if capped:
            self.message_user(
                request,
                gettext(
                    "Only the first %(max)d selected runs were upgraded: run "
                    "`manage.py flowwarden_workflows upgrade` for the others."
                )
                % {"max": MAX_UPGRADED},
                messages.WARNING,
            )

    def has_snapshot_permission(self, request: HttpRequest) -> bool:
        """May the user read snapshots (``view_snapshotrecord``), as in the API?"""
        return request.user.has_perm(VIEW_SNAPSHOTS_PERMISSION)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if self.has_snapshot_permission(request):
            return fieldsets
        # The head's id without the links to the snapshot pages the user may not open.
        return [
            (name, {**options, "fields": [_no_link(f) for f in options["fields"]]})
            for name, options in fieldsets
        ]

    # -- data ------------------------------------------------------------------------

    def annotate_page(self, runs: list[WorkflowRun]) -> None:
        """Give each run of a changelist page its newest pending approval
        (``pending_approval_id`` and ``_prompt``), in one query for the page."""
        pending = (
            Approval.objects.using(runs[0]._state.db)
            .filter(coordination_id__in=[run.pk for run in runs], status=Approval.Status.PENDING)
            .order_by("coordination_id", "-requested_at")
            .values_list("coordination_id", "pk", "prompt")
        )
        newest: dict[str, tuple[str, str]] = {}
        for cid, pk, prompt in pending:
            newest.setdefault(cid, (pk, prompt))
        for run in runs:
            run.pending_approval_id, run.pending_approval_prompt = newest.get(run.pk, (None, ""))

    def store_of(self, run: WorkflowRun) -> RunStore:
        """Where *run*'s snapshots are read (see :func:`run_store`)."""
        return run_store(run.workflow_name, run.coordination_id, self.snapshot_store_alias)

    # -- urls ------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        view = self.admin_site.admin_view
        urls = [
            path(
                "<path:object_id>/snapshots/<str:snapshot_id>/fork/",
                view(self.fork_view),
                name="{}_{}_fork".format(*info),
            ),
            path(
                "<path:object_id>/snapshots/<str:snapshot_id>/",
                view(self.snapshot_view),
                name="{}_{}_snapshot".format(*info),
            ),
            path(
                "<path:object_id>/tree/nodes/",
                view(self.tree_nodes_view),
                name="{}_{}_tree_nodes".format(*info),
            ),
            path("<path:object_id>/tree/", view(self.tree_view), name="{}_{}_tree".format(*info)),
        ]
        return urls + super().get_urls()

    def _url(self, name: str, *args: str) -> str:
        info = self.opts.app_label, self.opts.model_name
        return reverse(
            "admin:{}_{}_{}".format(*info, name),
            args=[quote(arg) for arg in args],
            current_app=self.admin_site.name,
        )

    def tree_url(self, coordination_id: str) -> str:
        return self._url("tree", coordination_id)

    def snapshot_url(self, coordination_id: str, snapshot_id: str) -> str:
        return self._url("snapshot", coordination_id, snapshot_id)

    def fork_url(self, coordination_id: str, snapshot_id: str) -> str:
        return self._url("fork", coordination_id, snapshot_id)

    # -- changelist columns ----------------------------------------------------------

    @admin.display(description=_("status"), ordering="status")
    def status_icon(self, obj: WorkflowRun) -> SafeString:
        badge = run_status_badge(obj.status)
        if obj.status == WorkflowRun.Status.SLEEPING and obj.wake_at is not None:
            return format_html("{} <small>({})</small>", badge, wakes_text(obj.wake_at))
        return badge

    @admin.display(description=_("wakes at"))
    def wake_at_text(self, obj: WorkflowRun) -> SafeString | str:
        if obj.status != WorkflowRun.Status.SLEEPING or obj.wake_at is None:
            return NONE_TEXT
        return timestamp(obj.wake_at)

    @admin.display(description=_("coordination / key"), ordering="coordination_id")
    def coordination(self, obj: WorkflowRun) -> SafeString:
        """The coordination id and the run's key, shortened (the list links them to
        the run's page, which shows them whole)."""
        if not obj.idempotency_key:
            return short_id(obj.coordination_id, 12)
        return format_html(
            '{}<br><span class="flowwarden-quiet">{}</span>',
            short_id(obj.coordination_id, 12),
            self.run_key(obj),
        )

    @admin.display(description=_("last step"), ordering="last_step")
    def last_step_text(self, obj: WorkflowRun) -> SafeString | str:
        return format_html("<code>{}</code>", obj.last_step) if obj.last_step else NONE_TEXT

    @admin.display(description=_("pending approval"))
    def pending_approval(self, obj: WorkflowRun) -> SafeString | str:
        pk = getattr(obj, "pending_approval_id", None)
        if pk is None:
            return NONE_TEXT
        prompt = getattr(obj, "pending_approval_prompt", "") or gettext("approval")
        return format_html(
            '<a href="{}" title="{}">{}</a>',
            _approval_url(self.admin_site.name, pk),
            prompt,
            truncate(prompt, PROMPT_WIDTH),
        )

    @admin.display(description=_("updated"), ordering="updated_at")
    def updated(self, obj: WorkflowRun) -> SafeString | str:
        return age(obj.updated_at)

    # -- detail fields ---------------------------------------------------------------

    @admin.display(description=_("key"), ordering="idempotency_key")
    def run_key(self, obj: WorkflowRun) -> SafeString | str:
        """The run's idempotency key (``shop.orders:502``): what people know it by."""
        if not obj.idempotency_key:
            return NONE_TEXT
        return short_id(obj.idempotency_key, 18)

    @admin.display(description=_("head snapshot"))
    def head_snapshot(self, obj: WorkflowRun) -> SafeString | str:
        if not obj.head_snapshot_id:
            return NONE_TEXT
        return format_html(
            '<a href="{}"><code>{}</code></a> · <a href="{}">{}</a>',
            self.snapshot_url(obj.coordination_id, obj.head_snapshot_id),
            obj.head_snapshot_id,
            self.tree_url(obj.coordination_id),
            gettext("Snapshot tree"),
        )

    @admin.display(description=_("failure reason"))
    def failure_reason_text(self, obj: WorkflowRun) -> SafeString | str:
        if not obj.failure_reason:
            return NONE_TEXT
        return format_html('<pre class="flowwarden-json">{}</pre>', obj.failure_reason)

    @admin.display(description=_("workflow"), ordering="workflow_name")
    def workflow_and_version(self, obj: WorkflowRun) -> SafeString:
        return format_html(
            '{} <span class="flowwarden-quiet">v{}</span>',
            short_id(obj.workflow_name, 20),
            obj.workflow_version,
        )

    @admin.display(description=_("approvals"))
    def approvals_list(self, obj: WorkflowRun) -> SafeString | str:
        rows = Approval.objects.using(obj._state.db).filter(coordination_id=obj.pk)
        rows = rows.order_by("requested_at", "pk")
        if not rows:
            return NONE_TEXT
        items = format_html_join(
            "",
            '<li class="flowwarden-approval-{}"><a href="{}">{}</a> — {} ({})</li>',
            (
                (
                    a.status,
                    _approval_url(self.admin_site.name, a.pk),
                    truncate(a.prompt or gettext("approval"), PROMPT_WIDTH),
                    a.step_name,
                    a.get_status_display(),
                )
                for a in rows
            ),
        )
        return format_html('<ul class="flowwarden-approvals">{}</ul>', items)

    @admin.display(description=_("parent run"))
    def parent_run(self, obj: WorkflowRun) -> SafeString | str:
        if not obj.parent_coordination_id:
            return NONE_TEXT
        url = reverse_for_key(
            "admin:flowwarden_django_workflowrun_change",
            obj.parent_coordination_id,
            current_app=self.admin_site.name,
        )
        return format_html('<a href="{}">{}</a>', url, obj.parent_coordination_id)

    @admin.display(description=_("child runs"))
    def child_runs(self, obj: WorkflowRun) -> SafeString | str:
        rows = WorkflowRun.objects.using(obj._state.db).filter(parent_coordination_id=obj.pk)
        rows = list(rows.order_by("created_at", "pk")[: self.tree_page_size])
        if not rows:
            return NONE_TEXT
        items = format_html_join(
            "",
            '<li><a href="{}">{}</a> {} {}</li>',
            (
                (
                    reverse_for_key(
                        "admin:flowwarden_django_workflowrun_change",
                        child.pk,
                        current_app=self.admin_site.name,
                    ),
                    child.pk,
                    child.workflow_name,
                    run_status_badge(child.status),
                )
                for child in rows
            ),
        )
        return format_html('<ul class="flowwarden-children">{}</ul>', items)

    @admin.display(description=_("runner"))
    def runner_text(self, obj: WorkflowRun) -> SafeString | str:
        return format_html("<code>{}</code>", obj.runner) if obj.runner else NONE_TEXT

    @admin.display(description=_("runner"))
    def runner_key_text(self, obj: WorkflowRun) -> SafeString | str:
        """The runner with its instance as its key, for users who may not see its id."""
        runner = redacted_runner(obj.runner)
        return format_html("<code>{}</code>", runner) if runner else NONE_TEXT

    @admin.display(description=_("claimed until"))
    def claimed_until_text(self, obj: WorkflowRun) -> SafeString | str:
        return timestamp(obj.claimed_until)

    @admin.display(description=_("resume input"))
    def resume_input_json(self, obj: WorkflowRun) -> SafeString | str:
        return NONE_TEXT if obj.resume_input is None else pretty_json(obj.resume_input)

    @admin.display(description=_("created at"))
    def created_at_text(self, obj: WorkflowRun) -> SafeString | str:
        return timestamp(obj.created_at)

    @admin.display(description=_("updated at"))
    def updated_at_text(self, obj: WorkflowRun) -> SafeString | str:
        return timestamp(obj.updated_at)

    # -- the run's page --------------------------------------------------------------

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: Mapping[str, Any] | None = None,
    ) -> HttpResponse:
        run = self.get_object(request, unquote(object_id))
        tools: list[tuple[str, str, str]] = []
        if run is not None and self.has_snapshot_permission(request):
            tools.append(("tree", self.tree_url(run.pk), gettext("Snapshot tree")))
            pending = Approval.objects.using(run._state.db).filter(
                coordination_id=run.pk, status=Approval.Status.PENDING
            )
            for approval in pending.order_by("requested_at"):
                url = _approval_url(self.admin_site.name, approval.pk)
                tools.append(("approval", url, gettext("Pending approval")))
        context = {"workflow_run_tools": tools, **(extra_context or {})}
        return super().change_view(request, object_id, form_url, context)

    # -- shared steps of the snapshot pages ------------------------------------------

    def _run_or_redirect(
        self, request: HttpRequest, object_id: str
    ) -> tuple[WorkflowRun | None, HttpResponse | None]:
        run = self.get_object(request, unquote(object_id))
        if run is None:
            return None, self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if not self.has_view_permission(request, run) or not self.has_snapshot_permission(request):
            raise PermissionDenied
        return run, None

    def _context(self, request: HttpRequest, run: WorkflowRun, title: str) -> dict[str, Any]:
        request.current_app = self.admin_site.name
        return {
            **self.admin_site.each_context(request),
            "title": title,
            "subtitle": None,
            "opts": self.opts,
            "run": run,
            "run_url": self._url("change", run.pk),
            "tree_url": self.tree_url(run.pk),
            "media": self.media,
        }

    def _load_snapshot(
        self, request: HttpRequest, run: WorkflowRun, snapshot_id: str
    ) -> tuple[RunStore, WorkflowSnapshot] | None:
        """The run's store and its snapshot *snapshot_id*, or ``None`` with a message."""
        try:
            found = self.store_of(run)
            snapshot = found.store.load(snapshot_id)
        except Exception as exc:  # a broken store or an undecodable row: say so, don't 500
            logger.exception("snapshot %s of run %s cannot be read", snapshot_id, run.pk)
            text = gettext("Snapshot “%(id)s” cannot be read: %(error)s")
            values = {"id": snapshot_id, "error": error_text(request, exc)}
            self.message_user(request, text % values, messages.ERROR)
            return None
        if snapshot is None or snapshot.coordination_id != run.coordination_id:
            text = gettext("Run “%(run)s” has no snapshot “%(id)s” in %(store)s.")
            values = {"run": run.coordination_id, "id": snapshot_id, "store": found.label}
            self.message_user(request, text % values, messages.WARNING)
            return None
        return found, snapshot

    # -- the snapshot tree -----------------------------------------------------------

    def tree_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The run's snapshots as a tree, a page at a time (``?after=<seq>``)."""
        run, redirect = self._run_or_redirect(request, object_id)
        if redirect is not None:
            return redirect
        assert run is not None
        after = _int_param(request, "after")
        title = gettext("Snapshot tree of run %(run)s") % {"run": run.coordination_id}
        context = self._context(request, run, title)
        context.update(
            head_id=run.head_snapshot_id,
            after=after,
            chains=[],
            page=None,
            error=None,
            not_listable=None,
            store_label="",
            nodes_url=self._url("tree_nodes", run.pk),
        )
        try:
            found = self.store_of(run)
            context["store_label"] = found.label
            page = load_page(found.store, run.coordination_id, after, self.tree_page_size)
        except NotListableError as exc:
            context["not_listable"] = str(exc)
        except Exception as exc:  # a broken store or an undecodable row: say so, don't 500
            logger.exception("snapshot tree of run %s failed", run.coordination_id)
            context["error"] = error_text(request, exc)
        else:
            starts = build_forest(page.snapshots)
            context.update(
                page=page,
                count=len(page.snapshots),
                chains=self._chains(starts, run),
                next_url=self._page_url(run, page.next_after),
            )
        if context["head_id"]:
            context["head_url"] = self.snapshot_url(run.pk, context["head_id"])
        return TemplateResponse(request, f"{TEMPLATES}/snapshot_tree.html", context)

    def tree_nodes_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The page of the tree after ``?after=<seq>`` as JSON: each node's HTML and
        parent, in ``seq`` order, and the ``after`` of the page that follows."""
        run, redirect = self._run_or_redirect(request, object_id)
        if redirect is not None:
            return JsonResponse({"error": gettext("No such workflow run.")}, status=404)
        assert run is not None
        after = _int_param(request, "after")
        try:
            page = load_page(
                self.store_of(run).store, run.coordination_id, after, self.tree_page_size
            )
        except Exception as exc:
            logger.exception("snapshot tree of run %s failed", run.coordination_id)
            return JsonResponse({"error": error_text(request, exc)}, status=500)
        nodes = []
        for node in flatten(build_forest(page.snapshots)):
            html = render_to_string(
                f"{TEMPLATES}/tree_node.html",
                {"item": self._item(node, run)},
                request=request,
            )
            nodes.append({**describe(node.snapshot), "html": html})
        return JsonResponse(
            {
                "nodes": nodes,
                "after": after,
                "next_after": page.next_after,
                "next_url": self._page_url(run, page.next_after),
            }
        )

    def _page_url(self, run: WorkflowRun, after: int | None) -> str | None:
        if after is None:
            return None
        return f"{self.tree_url(run.pk)}?{urlencode({'after': after})}"

    def _chains(self, starts: list[TreeNode], run: WorkflowRun) -> list[list[dict[str, Any]]]:
        """The chains to draw, each a list of items with their branches nested.

        Branches nest at most ``MAX_BRANCH_DEPTH`` deep (templates render them
        recursively); deeper ones are drawn as chains of their own after the others,
        each naming its parent.
        """
        chains: list[list[dict[str, Any]]] = []
        pending = [(start, False) for start in starts]
        while pending:
            start, moved = pending.pop(0)
            overflow: list[TreeNode] = []
            chain = self._chain(start, run, 0, overflow)
            if moved:
                chain[0]["parent_url"] = self.snapshot_url(run.pk, start.snapshot.parent_id or "")
            chains.append(chain)
            pending.extend((branch, True) for branch in overflow)
        return chains

    def _chain(
        self, start: TreeNode, run: WorkflowRun, depth: int, overflow: list[TreeNode]
    ) -> list[dict[str, Any]]:
        items = []
        for node in start.chain:
            item = self._item(node, run)
            if depth < MAX_BRANCH_DEPTH:
                item["branches"] = [
                    self._chain(branch, run, depth + 1, overflow) for branch in node.branches
                ]
            else:
                item["moved_branches"] = [
                    (branch.snapshot.id, branch.seq) for branch in node.branches
                ]
                overflow.extend(node.branches)
            items.append(item)
        return items

    def _item(self, node: TreeNode, run: WorkflowRun) -> dict[str, Any]:
        """What the node template needs to draw *node* (without its branches)."""
        snapshot = node.snapshot
        item = {
            "node": node,
            "snapshot": snapshot,
            "url": self.snapshot_url(run.pk, snapshot.id),
            "badges": [(key, BADGE_LABELS[key]) for key in node_badges(node, run.head_snapshot_id)],
            "is_head": snapshot.id == run.head_snapshot_id,
            "branches": [],
            "moved_branches": [],
            "parent_url": None,
            "step": tree_step_text(snapshot),
        }
        if node.detached and snapshot.parent_id:
            item["parent_url"] = self.snapshot_url(run.pk, snapshot.parent_id)
        return item

    # -- one snapshot ----------------------------------------------------------------

    def snapshot_view(self, request: HttpRequest, object_id: str, snapshot_id: str) -> HttpResponse:
        """A snapshot: its fields, its state as JSON, and the diff against its parent."""
        run, redirect = self._run_or_redirect(request, object_id)
        if redirect is not None:
            return redirect
        assert run is not None
        loaded = self._load_snapshot(request, run, unquote(snapshot_id))
        if loaded is None:
            return HttpResponseRedirect(self.tree_url(run.pk))
        found, snapshot = loaded
        parent = None
        if snapshot.parent_id:
            try:
                parent = found.store.load(snapshot.parent_id)
            except Exception:  # shown as "not in the store": the page is about the child
                logger.exception("parent %s cannot be read", snapshot.parent_id)
        state_text = state_json(snapshot.state)
        diff: list[DiffLine] | None = None
        if parent is not None:
            diff = state_diff(state_json(parent.state), state_text)
        title = gettext("Snapshot #%(seq)s of run %(run)s") % {
            "seq": snapshot.seq,
            "run": run.coordination_id,
        }
        parent_url = fork_url = None
        if snapshot.parent_id:
            parent_url = self.snapshot_url(run.pk, snapshot.parent_id)
        if self.has_fork_permission(request, run):
            fork_url = self.fork_url(run.pk, snapshot.id)
        context = self._context(request, run, title)
        context.update(
            snapshot=snapshot,
            parent=parent,
            parent_url=parent_url,
            is_head=snapshot.id == run.head_snapshot_id,
            last_step=snapshot.metadata.get(LAST_STEP, ""),
            # The page shows the state: the errors' messages too.
            timing=step_timing_of(snapshot.metadata),
            cancellation=cancellation_of(snapshot),
            metadata_text=state_json(dict(snapshot.metadata)),
            state_text=state_text,
            diff=diff,
            store_label=found.label,
            fork_url=fork_url,
        )
        return TemplateResponse(request, f"{TEMPLATES}/snapshot.html", context)

    # -- forking ---------------------------------------------------------------------

    def fork_view(self, request: HttpRequest, object_id: str, snapshot_id: str) -> HttpResponse:
        """Fork the run off a snapshot: edit the state (GET), check it and ask (POST),
        fork (POST ``post=yes``)."""
        run, redirect = self._run_or_redirect(request, object_id)
        if redirect is not None:
            return redirect
        assert run is not None
        if not self.has_fork_permission(request, run):
            raise PermissionDenied
        loaded = self._load_snapshot(request, run, unquote(snapshot_id))
        if loaded is None:
            return HttpResponseRedirect(self.tree_url(run.pk))
        found, snapshot = loaded
        render = partial(self._fork_page, request, run, snapshot)
        if request.method != "POST":
            return render(state_json(snapshot.state))
        text = request.POST.get("state", "")
        try:
            state = parse_user_json(text, what="the state")
        except UserJSONError as exc:
            return render(text, error=capfirst(str(exc)))
        if request.POST.get("post") != "yes":
            return render(text, state=state, confirm=True)
        try:
            child = fork_snapshot(run, found, snapshot.id, state)
        except Exception as exc:  # the serializer refused the state, the store failed, ...
            logger.exception("fork of snapshot %s failed", snapshot.id)
            error = gettext("The fork failed: %(error)s") % {
                "error": f"{type(exc).__name__}: {exc}"
            }
            return render(text, error=error)
        values = {
            "source": snapshot.seq,
            "run": run.coordination_id,
            "seq": child.seq,
            "id": child.id,
        }
        self.log_change(
            request, run, gettext("Forked snapshot #%(source)s as #%(seq)s (%(id)s).") % values
        )
        done = gettext(
            "Forked snapshot #%(source)s of run “%(run)s”: new snapshot #%(seq)s (%(id)s). "
            "The next run of the workflow continues from it."
        )
        self.message_user(request, done % values, messages.SUCCESS)
        return HttpResponseRedirect(self.snapshot_url(run.pk, child.id))

    def _fork_page(
        self,
        request: HttpRequest,
        run: WorkflowRun,
        snapshot: WorkflowSnapshot,
        text: str,
        *,
        state: Any = None,
        confirm: bool = False,
        error: str | None = None,
    ) -> TemplateResponse:
        if confirm:
            title = gettext("Fork snapshot #%(seq)s of run %(run)s?")
        else:
            title = gettext("Fork snapshot #%(seq)s of run %(run)s")
        context = self._context(
            request, run, title % {"seq": snapshot.seq, "run": run.coordination_id}
        )
        context.update(
            snapshot=snapshot,
            snapshot_url=self.snapshot_url(run.pk, snapshot.id),
            state_text=text,
            error=error,
            confirm=confirm,
        )
        if confirm:
            pretty = state_json(state)
            context.update(
                pretty_state=pretty,
                compact_state=json.dumps(state, ensure_ascii=False, separators=(",", ":")),
                diff=state_diff(state_json(snapshot.state), pretty),
            )
        return TemplateResponse(request, f"{TEMPLATES}/fork.html", context)


def _no_link(field: str) -> str:
    return "head_snapshot_id" if field == "head_snapshot" else field


def _int_param(request: HttpRequest, name: str) -> int:
    try:
        return max(int(request.GET.get(name, 0)), 0)
    except ValueError:
        return 0


def _approval_url(site_name: str, pk: Any) -> str:
    return reverse_for_key("admin:flowwarden_django_approval_change", pk, current_app=site_name)
