"""Approve and reject in the approval admin: the changelist actions and the buttons
of an approval's page, each confirmed on a page first, decided through the workflow
core and reported to the user."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from functools import partial
from typing import Any

from django.contrib import messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.text import capfirst
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..common.user_input import UserJSONError, check_comment, parse_decision_payload
from ..models import Approval, WorkflowRun
from ..workflows.waiting.approvals import ApprovalPermissionError, can_decide, check_may_decide
from ..workflows.waiting.approvals.forms import (
    ApprovalFormUnavailableError,
    json_safe,
    page_form,
    page_form_or_error,
)
from .approval_columns import approval_status_badge, short_prompt
from .approval_decisions import APPROVE, PENDING, REJECT, Decision, decide_all
from .base import confirmed_action
from .details import error_text

TEMPLATES = "admin/flowwarden_django/approval"
#: Why an approval with a decision form is left out of a bulk decision.
NEEDS_FORM = _("it has a decision form: decide it on its own page")


def _status_label(status: str) -> str:
    return str(dict(WorkflowRun.Status.choices).get(status, status))


class ApprovalActionsMixin:
    """Approve / Reject: as actions on the selected approvals (with
    :class:`~.base.ConfirmedOperationsMixin`), and as one approval's operation
    (``object_operations``), each with its confirmation page."""

    approve_selected = confirmed_action(
        APPROVE, permission="decide", description=_("Approve selected %(verbose_name_plural)s")
    )
    reject_selected = confirmed_action(
        REJECT, permission="decide", description=_("Reject selected %(verbose_name_plural)s")
    )

    def _act_on_selected(
        self, request: HttpRequest, decision: Decision, approvals: Sequence[Approval]
    ) -> HttpResponse | None:
        comment = request.POST.get("comment", "").strip()
        try:
            check_comment(comment)
        except UserJSONError as exc:
            error = capfirst(str(exc))
            return self._confirmation(
                request, decision, approvals, comment=comment, comment_error=error
            )
        # A typed approval is never decided in bulk, approved or rejected: it is
        # decided on its own page, where its form is shown.
        for typed in (a for a in approvals if a.form):
            text = gettext("Skipped “%(prompt)s”: %(why)s.")
            self.message_user(
                request, text % {"prompt": short_prompt(typed), "why": NEEDS_FORM}, messages.WARNING
            )
        untyped = [a for a in approvals if not a.form]
        if untyped:
            self._decide_and_report(request, decision, untyped, comment=comment)
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
            return self._confirmation(request, decision, [approval], approval=approval)
        comment = request.POST.get("comment", "").strip()
        payload_text = request.POST.get("payload", "").strip()
        form = partial(
            self._confirmation,
            request,
            decision,
            [approval],
            approval=approval,
            comment=comment,
            payload_text=payload_text,
        )
        try:
            check_comment(comment)
        except UserJSONError as exc:
            return form(comment_error=capfirst(str(exc)))
        if decision is APPROVE and approval.form:  # a typed approval: its form's data
            try:
                typed = page_form(approval, request.POST)
            except ApprovalFormUnavailableError:
                return form()  # the page says why it cannot be approved
            if not typed.is_valid():
                return form(typed_form=typed)
            payload = json_safe(typed.cleaned_data)
        else:
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
        approval: Approval | None = None,
        *,
        comment: str = "",
        payload_text: str = "",
        payload_error: str | None = None,
        comment_error: str | None = None,
        typed_form: Any = None,
    ) -> TemplateResponse:
        typed_error = ""
        if approval is not None and decision is APPROVE and typed_form is None:
            typed_form, typed_error = page_form_or_error(approval)
        rows = []
        for row in approvals:
            allowed = can_decide(request.user, row)
            skipped = ""
            if row.status != PENDING:
                skipped = gettext("not pending: %(status)s") % {"status": row.get_status_display()}
            elif not allowed:
                skipped = gettext("you may not decide it")
            elif row.form and approval is None:  # never decided in bulk
                skipped = str(NEEDS_FORM)
            elif row.claimed_by and row.claimed_by != request.user.get_username():
                skipped = gettext("claimed by %(who)s") % {"who": row.claimed_by}
            rows.append(
                {
                    "approval": row,
                    "url": self.object_url(row),
                    "prompt": short_prompt(row),
                    "run_url": self._run_url(row.coordination_id),
                    "status": approval_status_badge(row.status),
                    "skipped": skipped,
                }
            )
        state_text, state_error = ("", "")
        if approval is not None:
            state_text, state_error = self._paused_state(approval, partial(error_text, request))
        context = {
            "question": decision.question_one if approval is not None else decision.question,
            "decision": decision,
            "rows": rows,
            "decidable_count": 0 if typed_error else sum(1 for r in rows if not r["skipped"]),
            "typed_form": typed_form,
            "typed_error": typed_error,
            "approval": approval,
            "comment": comment,
            "payload_text": payload_text,
            "payload_error": payload_error,
            "comment_error": comment_error,
            "state_text": state_text,
            "state_error": state_error,
        }
        page = self.confirmation_context(request, decision, approval, **context)  # type: ignore[attr-defined]
        return TemplateResponse(request, f"{TEMPLATES}/decision_confirmation.html", page)

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
                    "prompt": short_prompt(approval),
                }
            if runs:
                text = f"{text} " + gettext("Run %(runs)s now.") % {"runs": runs}
            notify(text, messages.SUCCESS)
        for approval in outcome.repeated:
            text = gettext("“%(prompt)s” was already %(status)s: nothing changed.")
            values = {"prompt": short_prompt(approval), "status": approval.get_status_display()}
            notify(text % values, messages.WARNING)
        for approval, why in outcome.failed:
            text = gettext("Could not %(decision)s “%(prompt)s”: %(why)s.")
            values = {"decision": decision.name, "prompt": short_prompt(approval), "why": why}
            notify(text % values, messages.ERROR)
        for warning in outcome.warnings:  # a run this process cannot continue
            notify(warning, messages.WARNING)
