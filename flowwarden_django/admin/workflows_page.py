"""The admin's "Workflows" page: every workflow this process defines, its versions
and its runs by status (each count links to the runs' list filtered so), and the
diagram of each version (``diagram``), with a run's position marked when the page
is opened from that run (``?run=<coordination id>``).

It is the changelist of ``DefinedWorkflow`` (a proxy of ``WorkflowRun``, listed as
"Workflows" in the app index); viewing needs ``view_workflowrun``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.http import urlencode
from django.utils.translation import gettext

from ..models import DefinedWorkflow, WorkflowRun
from ..workflows.definition.metadata import NEXT_STEP
from ..workflows.definition.registry import workflow_registry
from .base import ReadOnlyAdminMixin, page_context, possible_value
from .diagram import build_diagram, defined_workflows
from .run_stores import run_store

VIEW_RUNS_PERMISSION = "flowwarden_django.view_workflowrun"
TEMPLATES = "admin/flowwarden_django/definedworkflow"


def diagram_url(name: str, version: int, run: str = "", site: str = "admin") -> str:
    """The page of the diagram of *name* version *version* (marking run *run*)."""
    url = reverse(f"{site}:flowwarden_django_definedworkflow_diagram", args=[quote(name), version])
    return f"{url}?{urlencode({'run': run})}" if run else url


def runs_url(name: str, status: str = "", site: str = "admin") -> str:
    """The runs' list filtered to workflow *name* (and *status*)."""
    query = {"workflow_name": name}
    if status:
        query["status__exact"] = status
    return f"{reverse(f'{site}:flowwarden_django_workflowrun_changelist')}?{urlencode(query)}"


@admin.register(DefinedWorkflow)
class DefinedWorkflowAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Workflows: each defined workflow with its versions, its runs by status and
    its diagrams. Nothing is edited here; viewing needs ``view_workflowrun``."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(VIEW_RUNS_PERMISSION)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        view = self.admin_site.admin_view
        return [
            path(
                "diagram/<str:name>/<int:version>/",
                view(self.diagram_view),
                name="{}_{}_diagram".format(*info),
            ),
            path("", view(self.changelist_view), name="{}_{}_changelist".format(*info)),
            # A run's id here (the app index's links, a guessed URL): its workflow's diagram.
            path(
                "<path:object_id>/", view(self.run_diagram_view), name="{}_{}_change".format(*info)
            ),
        ]

    def _context(self, request: HttpRequest, title: str) -> dict[str, Any]:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return page_context(self, request, title, runs_opts=WorkflowRun._meta)

    def changelist_view(
        self, request: HttpRequest, extra_context: Mapping[str, Any] | None = None
    ) -> HttpResponse:
        context = self._context(request, gettext("Workflows"))
        site = self.admin_site.name
        rows = []
        for entry in defined_workflows():
            statuses = [
                (label, entry.counts.get(value, 0), runs_url(entry.name, value, site))
                for value, label in WorkflowRun.Status.choices
                if entry.counts.get(value)
            ]
            rows.append(
                {
                    "entry": entry,
                    "versions": [
                        (v, diagram_url(entry.name, v, site=site)) for v in entry.versions
                    ],
                    "statuses": statuses,
                    "runs_url": runs_url(entry.name, site=site),
                }
            )
        context.update(rows=rows, **(extra_context or {}))
        return TemplateResponse(request, f"{TEMPLATES}/change_list.html", context)

    def run_diagram_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The "change" page of a workflow (a run: the proxy's rows are runs): a
        redirect to the diagram of the run's workflow version, marking the run; to the
        list when no such run is defined here."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        run = None
        if possible_value(WorkflowRun._meta.pk, object_id):  # a NUL: PostgreSQL refuses it
            run = WorkflowRun.objects.filter(pk=object_id).first()
        if run is None or not workflow_registry.defines(run.workflow_name, run.workflow_version):
            return HttpResponseRedirect(
                reverse(f"{self.admin_site.name}:{self._name('changelist')}")
            )
        return HttpResponseRedirect(
            diagram_url(run.workflow_name, run.workflow_version, run.pk, self.admin_site.name)
        )

    def _name(self, view: str) -> str:
        return f"{self.opts.app_label}_{self.opts.model_name}_{view}"

    def diagram_view(self, request: HttpRequest, name: str, version: int) -> HttpResponse:
        """The diagram of version *version* of workflow *name*, with the position of
        run ``?run=`` marked."""
        if not workflow_registry.defines(name, version):
            raise Http404(
                gettext("No workflow “%(name)s” version %(version)s is defined here.")
                % {"name": name, "version": version}
            )
        title = gettext("Workflow %(name)s, version %(version)s") % {
            "name": name,
            "version": version,
        }
        context = self._context(request, title)
        run = None
        cid = request.GET.get("run", "")
        if cid and possible_value(WorkflowRun._meta.pk, cid):
            run = WorkflowRun.objects.filter(
                pk=cid, workflow_name=name, workflow_version=version
            ).first()
        definition = workflow_registry.get(name, version)
        diagram = build_diagram(definition, run, next_step=_next_step(run))
        site = self.admin_site.name
        context.update(
            diagram=diagram,
            run=run,
            run_url=reverse(f"{site}:flowwarden_django_workflowrun_change", args=[quote(run.pk)])
            if run is not None
            else "",
            other_versions=[
                (v, diagram_url(name, v, site=site))
                for v in workflow_registry.versions(name)
                if v != version
            ],
            changelist_url=reverse(f"{site}:{self._name('changelist')}"),
        )
        return TemplateResponse(request, f"{TEMPLATES}/diagram.html", context)


def _next_step(run: WorkflowRun | None) -> str:
    """The step *run*'s head jumped to (``workflow.nextStep``), ``""`` when none or
    when its head cannot be read."""
    if run is None or not run.head_snapshot_id:
        return ""
    try:
        head = run_store(run.workflow_name, run.coordination_id, "default").store.load(
            run.head_snapshot_id
        )
    except Exception:  # the page is about the definition: the jump is a detail
        return ""
    return head.metadata.get(NEXT_STEP, "") if head is not None else ""
