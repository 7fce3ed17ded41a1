"""Workflow runs in the admin: the runs, each run's snapshot tree, each snapshot's
state and its diff against its parent, and forking a run from a snapshot.

Runs are listed and shown, never edited. Snapshots are read through the run's
snapshot store (the store of its workflow when the workflow is registered in this
process, else the ``snapshot_store_alias`` of the admin), so stores other than the
ORM one work too. Forking needs ``flowwarden_django.fork_workflowrun`` and asks for
confirmation first.

This module registers ``WorkflowRunAdmin`` and holds its options, URLs and the run's
page; its parts live beside it: ``run_columns`` (the list's columns, the page's
fields), ``run_actions`` (cancel, upgrade), ``run_snapshot_pages`` (the tree and one
snapshot), ``run_fork`` (the fork page), ``run_stores`` (which store holds a run's
snapshots), ``run_mailbox`` (the page's messages and events), ``run_queues`` (the
filter by queue, the page's queue fields) and ``run_texts`` (badges and texts,
shared with the approvals' pages).
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.http import HttpRequest
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..common.formatting import NONE_TEXT
from ..models import Approval, WorkflowRun
from ..streams.operations.status import instance_key
from ..workflows.definition.registry import workflow_registry
from ..workflows.operations.timeline import Timeline, load_timeline
from .base import (
    ChangeContextMixin,
    GuardedLookupsMixin,
    LargeTableAdminMixin,
    ReadOnlyAdminMixin,
    fieldset_fields,
    fieldsets_in_place,
)
from .details import HealthDetailsMixin, error_text
from .run_actions import RunActionsMixin
from .run_columns import RunColumnsMixin, approval_url
from .run_fork import ForkPageMixin
from .run_mailbox import run_mailbox
from .run_queues import QueueListFilter, RunQueueFieldsMixin, queue_of
from .run_snapshot_pages import SnapshotPagesMixin
from .run_stores import RunStore, run_store
from .snapshots import PAGE_SIZE
from .workflows_page import diagram_url

logger = logging.getLogger("flowwarden_django.admin")

VIEW_SNAPSHOTS_PERMISSION = "flowwarden_django.view_snapshotrecord"
#: The run page's fieldset of its queue (shown for a run on one only).
QUEUE_FIELDSET = _("Queue")


@admin.register(WorkflowRun)
class WorkflowRunAdmin(
    RunColumnsMixin,
    RunQueueFieldsMixin,
    RunActionsMixin,
    SnapshotPagesMixin,
    ForkPageMixin,
    HealthDetailsMixin,
    LargeTableAdminMixin,
    GuardedLookupsMixin,
    ReadOnlyAdminMixin,
    ChangeContextMixin,
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
    list_filter = ["status", ("workflow_name", admin.AllValuesFieldListFilter), QueueListFilter]
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
        (
            QUEUE_FIELDSET,
            {
                "fields": [
                    "queue_text",
                    "queue_partition_text",
                    "queue_priority_text",
                    "queued_at_text",
                ]
            },
        ),
        (_("Runner"), {"fields": ["runner_text", "claimed_until_text", "attempts"]}),
        (_("Resume input"), {"fields": ["resume_input_json"]}),
        (_("Dates"), {"fields": ["created_at_text", "updated_at_text"]}),
    ]
    #: The runner token names its process's instance (``<hostname>:<pid>``).
    detail_fields = {"runner_text": "runner_key_text"}
    readonly_fields = [*fieldset_fields(fieldsets), "head_snapshot_id", "runner_key_text"]

    def has_snapshot_permission(self, request: HttpRequest) -> bool:
        """May the user read snapshots (``view_snapshotrecord``), as in the API?"""
        return request.user.has_perm(VIEW_SNAPSHOTS_PERMISSION)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or not queue_of(obj)[0]:
            fieldsets = [item for item in fieldsets if item[0] is not QUEUE_FIELDSET]
        if self.has_snapshot_permission(request):
            return fieldsets
        # The head's id without the links to the snapshot pages the user may not open.
        return fieldsets_in_place(fieldsets, {"head_snapshot": "head_snapshot_id"})

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

    def timeline_of(self, request: HttpRequest, run: WorkflowRun) -> tuple[Timeline | None, str]:
        """*run*'s timeline (``timeline``), or ``None`` and why it cannot be drawn."""
        # Users without the details see each worker by its opaque key, as the runner.
        worker_name = instance_key if self.redacting(request) else None
        try:
            found = self.store_of(run)
            timeline = load_timeline(
                run,
                found.store,
                child_url=lambda cid: self._url("change", cid),
                worker_name=worker_name,
            )
            return timeline, ""
        except NotImplementedError:
            return None, gettext("The run's snapshot store cannot list its snapshots.")
        except Exception as exc:  # a broken store: the rest of the page still shows
            logger.exception("timeline of run %s failed", run.pk)
            return None, error_text(request, exc)

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

    # -- the run's page --------------------------------------------------------------

    def change_page_context(self, request: HttpRequest, run: WorkflowRun | None) -> dict[str, Any]:
        tools: list[tuple[str, str, str]] = []
        if run is not None and self.has_snapshot_permission(request):
            tools.append(("tree", self.tree_url(run.pk), gettext("Snapshot tree")))
            pending = Approval.objects.using(run._state.db).filter(
                coordination_id=run.pk, status=Approval.Status.PENDING
            )
            for approval in pending.order_by("requested_at"):
                url = approval_url(self.admin_site.name, approval.pk)
                tools.append(("approval", url, gettext("Pending approval")))
        if run is not None and workflow_registry.defines(run.workflow_name, run.workflow_version):
            url = diagram_url(run.workflow_name, run.workflow_version, run.pk, self.admin_site.name)
            tools.append(("diagram", url, gettext("Diagram")))
        context: dict[str, Any] = {"workflow_run_tools": tools}
        if run is not None:
            context["run_mailbox"] = run_mailbox(run, self.admin_site.name)
            if self.has_snapshot_permission(request):
                context["run_timeline"], context["run_timeline_error"] = self.timeline_of(
                    request, run
                )
        return context
