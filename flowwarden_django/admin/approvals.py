"""Approvals in the admin: the requests of paused workflow runs, their audit trail,
and Approve / Reject.

Approvals are never edited here: every decision goes through
``workflows.approvals.approve`` / ``reject`` (idempotent, audited, and resuming the
run), after a confirmation page, as buttons on an approval's page or as changelist
actions. Who may see and decide what is ``workflows.approvals.access``'s call.

This module registers ``ApprovalAdmin`` and holds its options, permissions, queryset
and page; its parts live beside it: ``approval_columns`` (the list's columns, the
page's fields, the status badge), ``approval_actions`` (approve / reject and their
confirmation page) and ``approval_decisions`` (the two decisions and ``decide_all``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..common.formatting import NONE_TEXT, state_json
from ..models import Approval, ApprovalEvent
from ..workflows.waiting.approvals import assigned_approvals, can_decide, visible_approvals
from ..workflows.waiting.approvals.access import DECIDE_ANY
from .approval_actions import TEMPLATES as TEMPLATES
from .approval_actions import ApprovalActionsMixin
from .approval_claims import ApprovalClaimsMixin, ClaimedFilter
from .approval_columns import LIST_WIDTH as LIST_WIDTH
from .approval_columns import PROMPT_WIDTH as PROMPT_WIDTH
from .approval_columns import STATUS_ICONS as STATUS_ICONS
from .approval_columns import ApprovalColumnsMixin
from .approval_columns import approval_status_badge as approval_status_badge
from .approval_decisions import APPROVE as APPROVE
from .approval_decisions import DECISIONS, PENDING
from .approval_decisions import REJECT as REJECT
from .approval_decisions import Decision as Decision
from .approval_decisions import Outcome as Outcome
from .approval_decisions import decide_all as decide_all
from .approval_decisions import refusal_text as refusal_text
from .base import (
    ChangeContextMixin,
    ConfirmedOperationsMixin,
    GuardedLookupsMixin,
    IndexedValuesFieldListFilter,
    LargeTableAdminMixin,
    ReadOnlyAdminMixin,
    fieldset_fields,
)
from .details import HealthDetailsMixin, describe_error
from .run_stores import run_store

logger = logging.getLogger("flowwarden_django.admin")


@admin.register(Approval)
class ApprovalAdmin(
    ApprovalColumnsMixin,
    ApprovalActionsMixin,
    ApprovalClaimsMixin,
    HealthDetailsMixin,
    LargeTableAdminMixin,
    GuardedLookupsMixin,
    ReadOnlyAdminMixin,
    ConfirmedOperationsMixin,
    ChangeContextMixin,
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
        "claimed",
        "requested",
    ]
    list_filter = ["status", ClaimedFilter, ("workflow_name", IndexedValuesFieldListFilter)]
    search_fields = ["prompt", "coordination_id"]
    search_help_text = _("Search by prompt or coordination id.")
    date_hierarchy = "requested_at"
    ordering = ["-requested_at", "id"]
    empty_value_display = NONE_TEXT
    actions = ["approve_selected", "reject_selected", "claim_selected", "release_selected"]
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
        (
            _("Who may decide"),
            {"fields": ["assignees_text", "group", "permission", "claimed_by", "claimed_at"]},
        ),
        (
            _("Timing"),
            {
                "fields": [
                    "requested_at_text",
                    "expires_at_text",
                    "on_expiry",
                    "escalation_text",
                    "reminders_text",
                ]
            },
        ),
        (
            _("Decision"),
            {"fields": ["decided_by", "decided_at_text", "comment", "payload_json"]},
        ),
        (_("Paused state"), {"fields": ["paused_state"]}),
    ]
    readonly_fields = [*fieldset_fields(fieldsets), "paused_state_redacted"]

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

    def change_page_context(
        self, request: HttpRequest, approval: Approval | None
    ) -> dict[str, Any]:
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
        # The claims' context (ApprovalClaimsMixin) wins: it may take the decisions away.
        return {**context, **super().change_page_context(request, approval)}
