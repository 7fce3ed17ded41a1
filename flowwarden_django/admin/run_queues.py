"""The workflow queues in the run admin: the changelist's filter by queue and the
run page's queue fields (``workflows.queues``).

A run is on a queue when it was started on one (``start(queue=...)``: its ``queue``
column) or when its workflow declares one (``Workflow.define(..., queue=...)``): such a
run's ``queue`` is set only once it has waited for a slot, so the filter also matches
the runs of the workflow versions this process defines on that queue.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin import SimpleListFilter
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..common.formatting import NONE_TEXT
from ..models import WorkflowQueueSlot, WorkflowRun
from ..workflows import workflow_registry
from ..workflows.queues.settings import queue_configs
from .base import code_or_none, field_display, short_id, timestamp

#: Characters of a queue name in the list (the whole one is its tooltip).
QUEUE_WIDTH = 20


def declared_queues() -> dict[tuple[str, int], str]:
    """The queue each workflow version this process defines declares, by (name, version)."""
    found = {}
    for name in workflow_registry.names():
        for version in workflow_registry.versions(name):
            try:
                queue = getattr(workflow_registry.get(name, version), "queue", None)
            except LookupError:
                continue
            if queue:
                found[(name, version)] = queue
    return found


def queue_of(run: WorkflowRun) -> tuple[str, bool]:
    """The queue *run* is on (``""``: none) and whether it is its workflow's declared one
    (its ``queue`` column is then still unset)."""
    if run.queue:
        return run.queue, False
    declared = declared_queues().get((run.workflow_name, run.workflow_version), "")
    return declared, bool(declared)


class QueueListFilter(SimpleListFilter):
    """``?queue=<name>``: the runs on one queue. The choices are the configured queues,
    the queues whose slots exist (every queue a step was ever admitted to) and those
    the defined workflows declare: never a scan of the runs."""

    title = _("queue")
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        try:
            names = set(queue_configs())
        except ValueError:  # a bad setting: `manage.py check` says how to fix it
            names = set()
        db = model_admin.get_queryset(request).db
        slots = WorkflowQueueSlot.objects.using(db).order_by().values_list("queue", flat=True)
        names.update(slots.distinct())
        names.update(declared_queues().values())
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        on_it = Q(queue=value)
        declaring = Q()
        for (name, version), queue in declared_queues().items():
            if queue == value:
                declaring |= Q(workflow_name=name, workflow_version=version)
        if declaring:
            on_it |= Q(queue="") & declaring
        return queryset.filter(on_it)


class RunQueueFieldsMixin:
    """The run page's queue fields, and the queue beside a waiting run's status."""

    @admin.display(description=_("queue"))
    def queue_text(self, obj: WorkflowRun) -> SafeString | str:
        queue, declared = queue_of(obj)
        if not queue:
            return NONE_TEXT
        try:
            configured = queue in queue_configs()
        except ValueError:
            configured = True  # the setting is wrong as a whole: the check says so
        notes = []
        if declared:
            notes.append(gettext("its workflow's"))
        if not configured:
            notes.append(gettext("not configured: nothing admits its steps"))
        if not notes:
            return format_html("<code>{}</code>", queue)
        return format_html("<code>{}</code> ({})", queue, "; ".join(notes))

    queue_partition_text = field_display(code_or_none, "queue_partition", _("queue partition"))

    @admin.display(description=_("priority"))
    def queue_priority_text(self, obj: WorkflowRun) -> str:
        return str(obj.queue_priority)

    @admin.display(description=_("waiting for a slot since"))
    def queued_at_text(self, obj: WorkflowRun) -> SafeString | str:
        if obj.status != WorkflowRun.Status.WAITING_SLOT:
            return NONE_TEXT
        return timestamp(obj.queued_at)


def waiting_slot_note(obj: WorkflowRun) -> SafeString:
    """The queue a ``waiting_slot`` run waits in, beside its status."""
    return format_html("<small>({})</small>", short_id(obj.queue, QUEUE_WIDTH))
