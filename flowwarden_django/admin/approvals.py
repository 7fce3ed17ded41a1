"""Approvals in the admin: the requests of paused workflow runs, their audit trail,
and Approve / Reject.

Approvals are never edited here: every decision goes through
``workflows.approvals.approve`` / ``reject`` (idempotent, audited, and resuming the
run), after a confirmation page, as buttons on an approval's page or as changelist
actions. Who may see and decide what is ``workflows.approvals.access``'s call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import capfirst
from django.utils.translation import gettext, ngettext_lazy
from django.utils.translation import gettext_lazy as _

from ..common.formatting import NONE_TEXT, state_json, truncate
from ..common.user_input import UserJSONError, check_comment, parse_decision_payload
from ..models import Approval, ApprovalEvent, WorkflowRun
from ..streams.operations.status import status_error
from ..workflows.waiting.approvals import (
    ApprovalError,
    ApprovalPermissionError,
    approve,
    assigned_approvals,
    can_decide,
    check_may_decide,
    reject,
    visible_approvals,
)
from ..workflows.waiting.approvals.access import DECIDE_ANY
from .base import (
    GuardedLookupsMixin,
    IndexedValuesFieldListFilter,
    LargeTableAdminMixin,
    ObjectOperationsMixin,
    ReadOnlyAdminMixin,
    age,
    reverse_for_key,
    status_badge,
    timestamp,
)
from .details import HealthDetailsMixin, describe_error, error_text
from .run_stores import run_store
from .run_texts import pretty_json, run_status_badge

logger = logging.getLogger("flowwarden_django.admin")

PENDING = Approval.Status.PENDING

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
TEMPLATES = "admin/flowwarden_django/approval"


def approval_status_badge(status: str) -> SafeString:
    """The approval status as the admin shows booleans: an icon, then the label."""
    labels = dict(Approval.Status.choices)
    return status_badge(
        status, labels=labels, icons=STATUS_ICONS, css_class="flowwarden-approval-status"
    )


def refusal_text(error: ApprovalError) -> str:
    """Why the core refused a decision, in the words of the admin."""
    texts = {
        "approval_already_decided": gettext("it was already %(status)s"),
        "approval_cancelled": gettext("it was cancelled: its run moved on"),
        "approval_expired": gettext("it expired before it was decided"),
        "approval_forbidden": gettext("you may not decide it"),
        "approval_not_found": gettext("it does not exist any more"),
        "run_busy": gettext("its run is busy right now; try again"),
    }
    text = texts.get(error.code)
    if text is None:
        return str(error)
    return text % {"status": error.status or gettext("decided")}


# -- the two decisions ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Decision:
    """Approve or reject, with the words the admin uses for it."""

    name: str
    status: str
    label: Any
    title: Any
    question: Any
    #: The question on one approval's page (its prompt is shown below it).
    question_one: Any
    button: Any
    done: Any  # ngettext_lazy(..., "count")
    past: Any
    call: Callable[..., Any]


APPROVE = Decision(
    name="approve",
    status=Approval.Status.APPROVED,
    label=_("Approve"),
    title=_("Approve"),
    question=_(
        "Approve the approvals below? Each run resumes with the decision at the step "
        "after the one that asked."
    ),
    question_one=_(
        "Approve the request below? The run resumes with the decision at the step "
        "after the one that asked."
    ),
    button=_("Yes, approve"),
    done=ngettext_lazy("Approved %(count)d approval.", "Approved %(count)d approvals.", "count"),
    past=_("Approved from the admin."),
    call=approve,
)
REJECT = Decision(
    name="reject",
    status=Approval.Status.REJECTED,
    label=_("Reject"),
    title=_("Reject"),
    question=_(
        "Reject the approvals below? Each run resumes with the decision at the step after "
        "the one that asked, which decides what a rejection means."
    ),
    question_one=_(
        "Reject the request below? The run resumes with the decision at the step after "
        "the one that asked, which decides what a rejection means."
    ),
    button=_("Yes, reject"),
    done=ngettext_lazy("Rejected %(count)d approval.", "Rejected %(count)d approvals.", "count"),
    past=_("Rejected from the admin."),
    call=reject,
)
DECISIONS = (APPROVE, REJECT)


@dataclasses.dataclass
class Outcome:
    """What deciding some approvals did to each."""

    #: ``(approval, run status afterwards)`` for each decision made now.
    done: list[tuple[Approval, str]] = dataclasses.field(default_factory=list)
    #: Approvals that already had this decision (nothing changed).
    repeated: list[Approval] = dataclasses.field(default_factory=list)
    #: ``(approval, why)`` for each refused or failed decision.
    failed: list[tuple[Approval, str]] = dataclasses.field(default_factory=list)
    #: What the decider should know (``DecisionResult.warning``), each once.
    warnings: list[str] = dataclasses.field(default_factory=list)


def _run_status(approval: Approval) -> str:
    """The status of *approval*'s run now ("" when it has no run row)."""
    status = (
        WorkflowRun.objects.using(approval._state.db or "default")
        .filter(pk=approval.coordination_id)
        .values_list("status", flat=True)
        .first()
    )
    return status or ""


def decide_all(
    decision: Decision,
    approvals: Sequence[Approval],
    user: Any,
    *,
    comment: str = "",
    payload: Any = None,
    describe: Callable[[Exception], str] = status_error,
) -> Outcome:
    """Make *decision* on each approval as *user*, oldest first, through the core.

    A refusal (no permission, already decided the other way, expired, cancelled) or
    an unexpected error is reported for that approval only, the error as *describe*
    tells it (a page passes :func:`~.details.error_text` for its user).
    """
    outcome = Outcome()
    for approval in sorted(approvals, key=lambda a: (a.requested_at, str(a.pk))):
        if not can_decide(user, approval):
            error = ApprovalPermissionError("forbidden", approval_id=str(approval.pk))
            outcome.failed.append((approval, refusal_text(error)))
            continue
        try:
            result = decision.call(approval.pk, user, comment=comment, payload=payload)
        except ApprovalError as exc:
            outcome.failed.append((approval, refusal_text(exc)))
            continue
        except Exception as exc:
            logger.exception("%s of approval %s failed", decision.name, approval.pk)
            outcome.failed.append((approval, describe(exc)))
            continue
        if result.repeated:
            outcome.repeated.append(result.approval)
        else:
            outcome.done.append((result.approval, _run_status(result.approval)))
        if result.warning and result.warning not in outcome.warnings:
            outcome.warnings.append(result.warning)
    return outcome


def _prompt(approval: Approval, width: int = PROMPT_WIDTH) -> str:
    return truncate(approval.prompt or gettext("(no prompt)"), width)


def _status_label(status: str) -> str:
    return str(dict(WorkflowRun.Status.choices).get(status, status))


@admin.register(Approval)
class ApprovalAdmin(
    HealthDetailsMixin,
    LargeTableAdminMixin,
    GuardedLookupsMixin,
    ReadOnlyAdminMixin,
    ObjectOperationsMixin,
    admin.ModelAdmin,
):
    """Approvals: list and inspect what paused runs wait for, with the audit trail,
    and approve or reject them.

    Any active staff user may open the page: superusers and holders of
    ``view_approval`` or ``decide_approval`` see every approval, everyone else only
    those ``visible_approvals`` gives them (assigned to them by name, group or
    permission). Approve / Reject are offered where ``can_decide`` allows, and go
    through ``workflows.approvals``; runs resume in the same request when the
    in-process execution provider is configured.
    """

    #: The snapshot store alias of runs whose workflow is not registered here.
    snapshot_store_alias = "default"

    # Six columns fit a 1280 px screen beside the nav sidebar and the filters: the
    # workflow and step are on each approval's page (and the workflow is a filter).
    list_display = [
        "prompt_short",
        "coordination",
        "status_and_decision",
        "deciders",
        "requested",
    ]
    list_filter = ["status", ("workflow_name", IndexedValuesFieldListFilter)]
    search_fields = ["prompt", "coordination_id"]
    search_help_text = _("Search by prompt or coordination id.")
    date_hierarchy = "requested_at"
    ordering = ["-requested_at", "id"]
    empty_value_display = NONE_TEXT
    actions = ["approve_selected", "reject_selected"]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "prompt_text",
                    "status_icon",
                    "workflow_name",
                    "coordination",
                    "run_status",
                    "step_name",
                    "snapshot",
                ]
            },
        ),
        (_("Who may decide"), {"fields": ["assignees_text", "group", "permission"]}),
        (_("Timing"), {"fields": ["requested_at_text", "expires_at_text", "on_expiry"]}),
        (
            _("Decision"),
            {"fields": ["decided_by", "decided_at_text", "comment", "payload_json"]},
        ),
        (_("Paused state"), {"fields": ["paused_state"]}),
    ]
    readonly_fields = [
        "prompt_text",
        "status_icon",
        "workflow_name",
        "coordination",
        "run_status",
        "step_name",
        "snapshot",
        "assignees_text",
        "group",
        "permission",
        "requested_at_text",
        "expires_at_text",
        "on_expiry",
        "decided_by",
        "decided_at_text",
        "comment",
        "payload_json",
        "paused_state",
        "paused_state_redacted",
    ]

    object_operations = DECISIONS
    #: Without the details (``HEALTH_DETAILS``) a store's error names its class only.
    detail_fields = {"paused_state": "paused_state_redacted"}

    # -- permissions -----------------------------------------------------------------

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Deciders need no model permission: the queryset holds what they may see.
        user = request.user
        return bool(user.is_active and user.is_staff) or super().has_view_permission(request, obj)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request) or super().has_module_permission(request)

    def has_decide_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """May the user decide any approval (``decide_approval``, or one assigned to them)?"""
        if obj is not None:
            return can_decide(request.user, obj)
        user = request.user
        return user.has_perm(DECIDE_ANY) or assigned_approvals(user).exists()

    # -- data ------------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Approval]:
        queryset = super().get_queryset(request)
        queryset = queryset.prefetch_related("assignments")
        if not request.user.is_superuser:
            queryset = queryset.filter(pk__in=visible_approvals(request.user).values("pk"))
        return queryset

    # -- urls ------------------------------------------------------------------------

    def _run_url(self, coordination_id: str) -> str:
        return reverse_for_key(
            "admin:flowwarden_django_workflowrun_change",
            coordination_id,
            current_app=self.admin_site.name,
        )

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
        return format_html('<span title="{}">{}</span>', obj.prompt, _prompt(obj, LIST_WIDTH))

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
        """When it was asked, and when it expires (while it is pending)."""
        if obj.expires_at is None or obj.status != Approval.Status.PENDING:
            return age(obj.requested_at)
        return format_html(
            '{}<br><span class="flowwarden-quiet">{} {}</span>',
            age(obj.requested_at),
            gettext("expires"),
            age(obj.expires_at),
        )

    @admin.display(description=_("status"), ordering="status")
    def status_and_decision(self, obj: Approval) -> SafeString:
        """The status, and who decided when."""
        if obj.decided_at is None:
            return approval_status_badge(obj.status)
        return format_html("{}<br>{}", approval_status_badge(obj.status), self.decided(obj))

    @admin.display(description=_("status"), ordering="status")
    def status_icon(self, obj: Approval) -> SafeString:
        return approval_status_badge(obj.status)

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
        who = obj.decided_by or gettext("system")
        return format_html('{} <span class="flowwarden-quiet">{}</span>', who, age(obj.decided_at))

    # -- detail fields ---------------------------------------------------------------

    @admin.display(description=_("prompt"))
    def prompt_text(self, obj: Approval) -> SafeString | str:
        if not obj.prompt:
            return NONE_TEXT
        return format_html('<p class="flowwarden-prompt">{}</p>', obj.prompt)

    @admin.display(description=_("run status"))
    def run_status(self, obj: Approval) -> SafeString | str:
        status = _run_status(obj)
        return run_status_badge(status) if status else NONE_TEXT

    @admin.display(description=_("paused snapshot"))
    def snapshot(self, obj: Approval) -> SafeString:
        return format_html(
            '<a href="{}"><code>{}</code></a>', self._snapshot_url(obj), obj.snapshot_id
        )

    @admin.display(description=_("assignees"))
    def assignees_text(self, obj: Approval) -> str:
        return ", ".join(obj.assignees) or NONE_TEXT

    @admin.display(description=_("requested at"))
    def requested_at_text(self, obj: Approval) -> SafeString | str:
        return timestamp(obj.requested_at)

    @admin.display(description=_("expires at"))
    def expires_at_text(self, obj: Approval) -> SafeString | str:
        if obj.expires_at is not None and obj.status != Approval.Status.PENDING:
            return format_html(
                '{} <span class="flowwarden-quiet">({})</span>',
                timestamp(obj.expires_at),
                gettext("no longer applies: the approval is %(status)s")
                % {"status": obj.get_status_display()},
            )
        return timestamp(obj.expires_at)

    @admin.display(description=_("decided at"))
    def decided_at_text(self, obj: Approval) -> SafeString | str:
        return timestamp(obj.decided_at)

    @admin.display(description=_("decision payload"))
    def payload_json(self, obj: Approval) -> SafeString | str:
        return NONE_TEXT if obj.payload is None else pretty_json(obj.payload)

    @admin.display(description=_("state"))
    def paused_state(self, obj: Approval) -> SafeString | str:
        return self._paused_state_html(obj, details=True)

    @admin.display(description=_("state"))
    def paused_state_redacted(self, obj: Approval) -> SafeString | str:
        return self._paused_state_html(obj, details=False)

    def _paused_state_html(self, approval: Approval, *, details: bool) -> SafeString:
        state, error = self._paused_state(approval, partial(describe_error, details=details))
        if error:
            return format_html('<span class="errornote">{}</span>', error)
        return format_html('<pre class="flowwarden-json flowwarden-state">{}</pre>', state)

    def _paused_state(
        self, approval: Approval, describe: Callable[[Exception], str]
    ) -> tuple[str, str]:
        """``(the paused snapshot's state as JSON, "")``, or ``("", why not)``, a
        store's error as *describe* tells it."""
        try:
            found = run_store(
                approval.workflow_name, approval.coordination_id, self.snapshot_store_alias
            )
            snapshot = found.store.load(approval.snapshot_id)
        except Exception as exc:  # a broken store must not break the page
            logger.exception("paused snapshot of approval %s cannot be read", approval.pk)
            return "", gettext("The snapshot cannot be read: %(error)s") % {"error": describe(exc)}
        if snapshot is None:
            return "", gettext("The snapshot is not in %(store)s any more.") % {
                "store": found.label
            }
        return state_json(snapshot.state), ""

    # -- the approval's page ---------------------------------------------------------

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: Mapping[str, Any] | None = None,
    ) -> HttpResponse:
        approval = self.get_object(request, unquote(object_id))
        context: dict[str, Any] = {"approval_decisions": [], "approval_events": []}
        if approval is not None:
            if approval.status == PENDING and can_decide(request.user, approval):
                context["approval_decisions"] = [
                    (decision, self.object_url(approval, decision)) for decision in DECISIONS
                ]
            events = ApprovalEvent.objects.using(approval._state.db).filter(approval=approval)
            context["approval_events"] = [
                {
                    "event": event,
                    "payload": None if event.payload is None else state_json(event.payload),
                }
                for event in events.order_by("at", "id")
            ]
            context["run_url"] = self._run_url(approval.coordination_id)
        return super().change_view(
            request, object_id, form_url, {**context, **(extra_context or {})}
        )

    # -- deciding --------------------------------------------------------------------

    @admin.action(permissions=["decide"], description=_("Approve selected %(verbose_name_plural)s"))
    def approve_selected(self, request: HttpRequest, queryset: QuerySet[Approval]) -> Any:
        return self._run_action(request, APPROVE, queryset)

    @admin.action(permissions=["decide"], description=_("Reject selected %(verbose_name_plural)s"))
    def reject_selected(self, request: HttpRequest, queryset: QuerySet[Approval]) -> Any:
        return self._run_action(request, REJECT, queryset)

    def _run_action(
        self, request: HttpRequest, decision: Decision, queryset: QuerySet[Approval]
    ) -> TemplateResponse | None:
        approvals = list(queryset)
        if request.POST.get("post") != "yes":
            action = f"{decision.name}_selected"
            return self._confirmation(
                request, decision, approvals, request.get_full_path(), action=action
            )
        comment = request.POST.get("comment", "").strip()
        try:
            check_comment(comment)
        except UserJSONError as exc:
            action = f"{decision.name}_selected"
            return self._confirmation(
                request,
                decision,
                approvals,
                request.get_full_path(),
                action=action,
                comment=comment,
                comment_error=capfirst(str(exc)),
            )
        self._decide_and_report(request, decision, approvals, comment=comment)
        return None  # back to the changelist

    def operation_view(
        self, request: HttpRequest, object_id: str, *, operation: Decision
    ) -> HttpResponse:
        """Confirm (GET), then make (POST ``post=yes``) decision *operation* on one
        approval."""
        decision = operation
        approval = self.get_object(request, unquote(object_id))
        if approval is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if not can_decide(request.user, approval):
            if request.method == "POST":  # an attempt: audited, as the core audits refusals
                with contextlib.suppress(ApprovalPermissionError):
                    db = approval._state.db
                    check_may_decide(approval, str(decision.status), request.user, using=db)
            raise PermissionDenied
        change_url = self.object_url(approval)
        if request.method != "POST" or request.POST.get("post") != "yes":
            if approval.status != PENDING:
                text = gettext("This approval is %(status)s: there is nothing to decide.")
                values = {"status": approval.get_status_display()}
                self.message_user(request, text % values, messages.WARNING)
                return HttpResponseRedirect(change_url)
            return self._confirmation(request, decision, [approval], change_url, approval=approval)
        comment = request.POST.get("comment", "").strip()
        payload_text = request.POST.get("payload", "").strip()
        form = partial(
            self._confirmation,
            request,
            decision,
            [approval],
            change_url,
            approval=approval,
            comment=comment,
            payload_text=payload_text,
        )
        try:
            check_comment(comment)
        except UserJSONError as exc:
            return form(comment_error=capfirst(str(exc)))
        try:
            payload = parse_decision_payload(payload_text)
        except UserJSONError as exc:
            return form(payload_error=capfirst(str(exc)))
        self._decide_and_report(request, decision, [approval], comment=comment, payload=payload)
        return HttpResponseRedirect(change_url)

    def _confirmation(
        self,
        request: HttpRequest,
        decision: Decision,
        approvals: Sequence[Approval],
        cancel_url: str,
        *,
        action: str | None = None,
        approval: Approval | None = None,
        comment: str = "",
        payload_text: str = "",
        payload_error: str | None = None,
        comment_error: str | None = None,
    ) -> TemplateResponse:
        rows = []
        for row in approvals:
            allowed = can_decide(request.user, row)
            skipped = ""
            if row.status != PENDING:
                skipped = gettext("not pending: %(status)s") % {"status": row.get_status_display()}
            elif not allowed:
                skipped = gettext("you may not decide it")
            rows.append(
                {
                    "approval": row,
                    "url": self.object_url(row),
                    "prompt": _prompt(row),
                    "run_url": self._run_url(row.coordination_id),
                    "status": approval_status_badge(row.status),
                    "skipped": skipped,
                }
            )
        state_text, state_error = ("", "")
        if approval is not None:
            state_text, state_error = self._paused_state(approval, partial(error_text, request))
        context = {
            **self.admin_site.each_context(request),
            "title": decision.title,
            "subtitle": None,
            "question": decision.question_one if approval is not None else decision.question,
            "opts": self.opts,
            "decision": decision,
            "rows": rows,
            "decidable_count": sum(1 for row in rows if not row["skipped"]),
            "approval": approval,
            "action_name": action,
            "cancel_url": cancel_url,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "comment": comment,
            "payload_text": payload_text,
            "payload_error": payload_error,
            "comment_error": comment_error,
            "state_text": state_text,
            "state_error": state_error,
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, f"{TEMPLATES}/decision_confirmation.html", context)

    def _decide_and_report(
        self,
        request: HttpRequest,
        decision: Decision,
        approvals: Sequence[Approval],
        *,
        comment: str = "",
        payload: Any = None,
    ) -> None:
        outcome = decide_all(
            decision,
            approvals,
            request.user,
            comment=comment,
            payload=payload,
            describe=partial(error_text, request),
        )
        for approval, _status in outcome.done:
            self.log_change(request, approval, str(decision.past))
        notify = partial(self.message_user, request)
        if outcome.done:
            runs = ", ".join(
                gettext("%(run)s is %(status)s")
                % {"run": approval.coordination_id, "status": _status_label(status)}
                for approval, status in outcome.done
                if status
            )
            text = decision.done % {"count": len(outcome.done)}
            if len(outcome.done) == 1:
                approval = outcome.done[0][0]
                text = gettext("%(decision)s “%(prompt)s”.") % {
                    "decision": capfirst(approval.get_status_display()),
                    "prompt": _prompt(approval),
                }
            if runs:
                text = f"{text} " + gettext("Run %(runs)s now.") % {"runs": runs}
            notify(text, messages.SUCCESS)
        for approval in outcome.repeated:
            text = gettext("“%(prompt)s” was already %(status)s: nothing changed.")
            values = {"prompt": _prompt(approval), "status": approval.get_status_display()}
            notify(text % values, messages.WARNING)
        for approval, why in outcome.failed:
            text = gettext("Could not %(decision)s “%(prompt)s”: %(why)s.")
            values = {"decision": decision.name, "prompt": _prompt(approval), "why": why}
            notify(text % values, messages.ERROR)
        for warning in outcome.warnings:  # a run this process cannot continue
            notify(warning, messages.WARNING)
