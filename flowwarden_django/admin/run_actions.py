"""The changelist actions on workflow runs (cancel, upgrade) and the permissions
they and the fork page need."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from ..workflows.operations.upgrades import upgrade_runs
from ..workflows.runs.records import UnknownRunError
from ..workflows.waiting.cancellation import cancel_coordination

#: The permission the fork action needs.
FORK_PERMISSION = "flowwarden_django.fork_workflowrun"
UPGRADE_PERMISSION = "flowwarden_django.upgrade_workflowrun"
CANCEL_PERMISSION = "flowwarden_django.cancel_workflowrun"
#: The most runs one "Cancel" action works on (select fewer, or use the command).
MAX_CANCELLED = 500
#: The most runs one "Upgrade" action works on (select fewer, or use the command).
MAX_UPGRADED = 500


class RunActionsMixin:
    """Cancel and upgrade the selected runs, for the users with the permission."""

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
