"""What the approval admin shows of an approval: its status badge, its changelist
columns, the fields of its page, and the links to its run and paused snapshot."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..common.formatting import NONE_TEXT, truncate
from ..models import Approval
from ..workflows.waiting.approvals.due import due_times
from .approval_decisions import current_run_status
from .base import (
    age,
    field_display,
    html_or_none,
    run_url,
    status_badge,
    timestamp,
    with_note,
)
from .run_texts import pretty_json, run_status_badge

#: The admin icon shown next to each approval status.
STATUS_ICONS = {
    Approval.Status.PENDING: "admin/img/icon-alert.svg",
    Approval.Status.APPROVED: "admin/img/icon-yes.svg",
    Approval.Status.REJECTED: "admin/img/icon-no.svg",
    Approval.Status.EXPIRED: "admin/img/icon-clock.svg",
    Approval.Status.CANCELLED: "admin/img/icon-no.svg",
}

PROMPT_WIDTH = 60
#: Characters of a prompt in the changelist (the whole one is its tooltip).
LIST_WIDTH = 40


def approval_status_badge(status: str) -> SafeString:
    """The approval status as the admin shows booleans: an icon, then the label."""
    labels = dict(Approval.Status.choices)
    return status_badge(
        status, labels=labels, icons=STATUS_ICONS, css_class="flowwarden-approval-status"
    )


def short_prompt(approval: Approval, width: int = PROMPT_WIDTH) -> str:
    """*approval*'s prompt, cut to *width* characters."""
    return truncate(approval.prompt or gettext("(no prompt)"), width)


class ApprovalColumnsMixin:
    """The approval changelist's columns, the approval page's read-only fields (but
    the paused state) and the links to the run and its snapshot."""

    def _run_url(self, coordination_id: str) -> str:
        return run_url(self.admin_site.name, coordination_id)

    def _snapshot_url(self, approval: Approval) -> str:
        return reverse(
            "admin:flowwarden_django_workflowrun_snapshot",
            args=[quote(approval.coordination_id), quote(approval.snapshot_id)],
            current_app=self.admin_site.name,
        )

    # -- changelist columns ----------------------------------------------------------

    @admin.display(description=_("prompt"), ordering="prompt")
    def prompt_short(self, obj: Approval) -> SafeString:
        # Short enough for a 1280 px changelist; the whole prompt is the tooltip.
        return format_html('<span title="{}">{}</span>', obj.prompt, short_prompt(obj, LIST_WIDTH))

    @admin.display(description=_("coordination"), ordering="coordination_id")
    def coordination(self, obj: Approval) -> SafeString:
        return format_html(
            '<a href="{}" class="flowwarden-run-link" title="{}">{}</a>',
            self._run_url(obj.coordination_id),
            obj.coordination_id,
            truncate(obj.coordination_id, 12),
        )

    # Ages, not full dates: the changelist fits a 1280 px screen (the exact time is
    # each one's tooltip).
    @admin.display(description=_("requested"), ordering="requested_at")
    def requested(self, obj: Approval) -> SafeString | str:
        """When it was asked, and (while it is pending) when it expires and escalates
        or escalated, and whether it is overdue."""
        due = due_times(obj)
        lines = [age(obj.requested_at)]
        if due.due_at is not None:
            lines.append(format_html("{} {}", gettext("expires"), age(due.due_at)))
        if due.escalated_at is not None and obj.status == Approval.Status.PENDING:
            lines.append(format_html("{} {}", gettext("escalated"), age(due.escalated_at)))
        elif due.escalate_at is not None:
            lines.append(format_html("{} {}", gettext("escalates"), age(due.escalate_at)))
        if due.overdue:
            lines.append(
                format_html('<strong class="flowwarden-overdue">{}</strong>', gettext("overdue"))
            )
        if len(lines) == 1:
            return lines[0]
        rest = format_html_join(mark_safe("<br>"), "{}", ((line,) for line in lines[1:]))
        return with_note(lines[0], rest, below=True)

    @admin.display(description=_("status"), ordering="status")
    def status_and_decision(self, obj: Approval) -> SafeString:
        """The status, and who decided when."""
        if obj.decided_at is None:
            return approval_status_badge(obj.status)
        return format_html("{}<br>{}", approval_status_badge(obj.status), self.decided(obj))

    status_icon = field_display(approval_status_badge, "status", _("status"), ordering="status")

    @admin.display(description=_("who may decide"))
    def deciders(self, obj: Approval) -> SafeString | str:
        parts = [format_html("{}", name) for name in obj.assignees]
        if obj.group:
            parts.append(format_html("{} <em>{}</em>", gettext("group"), obj.group))
        if obj.permission:
            parts.append(format_html("{} <code>{}</code>", gettext("permission"), obj.permission))
        if not parts:
            return NONE_TEXT
        return format_html_join(", ", "{}", ((part,) for part in parts))

    @admin.display(description=_("decided"), ordering="decided_at")
    def decided(self, obj: Approval) -> SafeString | str:
        if obj.decided_at is None:
            return NONE_TEXT
        return with_note(obj.decided_by or gettext("system"), age(obj.decided_at))

    # -- detail fields ---------------------------------------------------------------

    prompt_text = field_display(
        html_or_none('<p class="flowwarden-prompt">{}</p>'), "prompt", _("prompt")
    )

    @admin.display(description=_("run status"))
    def run_status(self, obj: Approval) -> SafeString | str:
        status = current_run_status(obj)
        return run_status_badge(status) if status else NONE_TEXT

    @admin.display(description=_("paused snapshot"))
    def snapshot(self, obj: Approval) -> SafeString:
        return format_html(
            '<a href="{}"><code>{}</code></a>', self._snapshot_url(obj), obj.snapshot_id
        )

    @admin.display(description=_("assignees"))
    def assignees_text(self, obj: Approval) -> str:
        return ", ".join(obj.assignees) or NONE_TEXT

    requested_at_text = field_display(timestamp, "requested_at", _("requested at"))

    @admin.display(description=_("expires at"))
    def expires_at_text(self, obj: Approval) -> SafeString | str:
        if obj.expires_at is not None and obj.status != Approval.Status.PENDING:
            return _lapsed(timestamp(obj.expires_at), obj)
        return timestamp(obj.expires_at)

    @admin.display(description=_("escalation"))
    def escalation_text(self, obj: Approval) -> SafeString | str:
        """When it escalates or escalated, to whom, and whether it is overdue."""
        if obj.escalate_at is None:
            return NONE_TEXT
        to = obj.escalate_to_group and gettext("group %(group)s") % {"group": obj.escalate_to_group}
        to = to or ", ".join(str(name) for name in obj.escalate_to_users or ())
        if obj.escalated_at is not None:
            text = format_html("{} {} {}", gettext("escalated at"), timestamp(obj.escalated_at), to)
        else:
            text = format_html("{} {} {}", gettext("escalates at"), timestamp(obj.escalate_at), to)
            if obj.status != Approval.Status.PENDING:
                text = _lapsed(text, obj)
        if due_times(obj).overdue:
            text = format_html(
                '{} <strong class="flowwarden-overdue">{}</strong>', text, gettext("overdue")
            )
        return text

    @admin.display(description=_("reminders"))
    def reminders_text(self, obj: Approval) -> SafeString | str:
        """Every how long, how many were sent, and when the next one is due."""
        if obj.remind_every is None:
            return NONE_TEXT
        text = format_html(
            "{}",
            gettext("every %(every)s; %(count)d sent")
            % {"every": obj.remind_every, "count": obj.reminders_sent},
        )
        if obj.next_reminder_at is not None and obj.status == Approval.Status.PENDING:
            text = format_html("{}; {} {}", text, gettext("next"), age(obj.next_reminder_at))
        return text

    decided_at_text = field_display(timestamp, "decided_at", _("decided at"))

    @admin.display(description=_("decision payload"))
    def payload_json(self, obj: Approval) -> SafeString | str:
        return NONE_TEXT if obj.payload is None else pretty_json(obj.payload)


def _lapsed(text: SafeString | str, approval: Approval) -> SafeString:
    """*text* (a time it has) noted as no longer applying to the decided *approval*."""
    note = gettext("no longer applies: the approval is %(status)s")
    return with_note(text, format_html("({})", note % {"status": approval.get_status_display()}))
