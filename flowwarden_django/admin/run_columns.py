"""What the run admin shows of a run: its changelist columns and the fields of its
page."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..common.formatting import NONE_TEXT, truncate
from ..models import Approval, WorkflowRun
from .base import (
    age,
    code_or_none,
    field_display,
    html_or_none,
    reverse_for_key,
    run_url,
    short_id,
    timestamp,
    with_note,
)
from .details import redacted_runner
from .run_queues import waiting_slot_note
from .run_texts import pretty_json, run_status_badge, wakes_text

PROMPT_WIDTH = 40
#: Characters of the topic a run waits for, beside its status.
TOPIC_WIDTH = 20
#: The statuses whose ``wake_at`` is shown: a sleep's end, a wait's timeout.
WAKING = (WorkflowRun.Status.SLEEPING, WorkflowRun.Status.WAITING_MESSAGE)


class RunColumnsMixin:
    """The run changelist's columns and the run page's read-only fields."""

    @admin.display(description=_("status"), ordering="status")
    def status_icon(self, obj: WorkflowRun) -> SafeString:
        badge = run_status_badge(obj.status)
        if obj.status == WorkflowRun.Status.WAITING_MESSAGE:
            return format_html(
                '{} <small>(<span class="flowwarden-token" title="{}">{}</span>)</small>',
                badge,
                obj.waiting_topic,
                truncate(obj.waiting_topic, TOPIC_WIDTH),
            )
        if obj.status == WorkflowRun.Status.WAITING_SLOT and obj.queue:
            return format_html("{} {}", badge, waiting_slot_note(obj))
        if obj.status == WorkflowRun.Status.SLEEPING and obj.wake_at is not None:
            return format_html("{} <small>({})</small>", badge, wakes_text(obj.wake_at))
        return badge

    @admin.display(description=_("wakes at"))
    def wake_at_text(self, obj: WorkflowRun) -> SafeString | str:
        """When a sleeping run wakes, or a run waiting for a message times out."""
        if obj.status not in WAKING or obj.wake_at is None:
            return NONE_TEXT
        return timestamp(obj.wake_at)

    @admin.display(description=_("coordination / key"), ordering="coordination_id")
    def coordination(self, obj: WorkflowRun) -> SafeString:
        """The coordination id and the run's key, shortened (the list links them to
        the run's page, which shows them whole)."""
        if not obj.idempotency_key:
            return short_id(obj.coordination_id, 12)
        return with_note(short_id(obj.coordination_id, 12), self.run_key(obj), below=True)

    last_step_text = field_display(code_or_none, "last_step", _("last step"), ordering="last_step")

    @admin.display(description=_("pending approval"))
    def pending_approval(self, obj: WorkflowRun) -> SafeString | str:
        pk = getattr(obj, "pending_approval_id", None)
        if pk is None:
            return NONE_TEXT
        prompt = getattr(obj, "pending_approval_prompt", "") or gettext("approval")
        return format_html(
            '<a href="{}" title="{}">{}</a>',
            approval_url(self.admin_site.name, pk),
            prompt,
            truncate(prompt, PROMPT_WIDTH),
        )

    updated = field_display(age, "updated_at", _("updated"), ordering="updated_at")

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

    failure_reason_text = field_display(
        html_or_none('<pre class="flowwarden-json">{}</pre>'), "failure_reason", _("failure reason")
    )

    @admin.display(description=_("workflow"), ordering="workflow_name")
    def workflow_and_version(self, obj: WorkflowRun) -> SafeString:
        return with_note(short_id(obj.workflow_name, 20), f"v{obj.workflow_version}")

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
                    approval_url(self.admin_site.name, a.pk),
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
        url = run_url(self.admin_site.name, obj.parent_coordination_id)
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
                    run_url(self.admin_site.name, child.pk),
                    child.pk,
                    child.workflow_name,
                    run_status_badge(child.status),
                )
                for child in rows
            ),
        )
        return format_html('<ul class="flowwarden-children">{}</ul>', items)

    runner_text = field_display(code_or_none, "runner", _("runner"))

    @admin.display(description=_("runner"))
    def runner_key_text(self, obj: WorkflowRun) -> SafeString | str:
        """The runner with its instance as its key, for users who may not see its id."""
        return code_or_none(redacted_runner(obj.runner))

    claimed_until_text = field_display(timestamp, "claimed_until", _("claimed until"))

    @admin.display(description=_("resume input"))
    def resume_input_json(self, obj: WorkflowRun) -> SafeString | str:
        return NONE_TEXT if obj.resume_input is None else pretty_json(obj.resume_input)

    created_at_text = field_display(timestamp, "created_at", _("created at"))

    updated_at_text = field_display(timestamp, "updated_at", _("updated at"))


def approval_url(site_name: str, pk: Any) -> str:
    """The admin page of approval *pk* on admin site *site_name*."""
    return reverse_for_key("admin:flowwarden_django_approval_change", pk, current_app=site_name)
