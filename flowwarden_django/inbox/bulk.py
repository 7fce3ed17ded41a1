"""Approve or reject several approvals at once from the inbox's list.

``POST bulk/`` (CSRF-protected, like every POST) with ``ids`` (at most
``MAX_BULK_IDS`` approval ids), ``approve`` or ``reject`` (the button pressed) and
an optional ``comment``. Each approval is decided on its own through the same core
call as its page (``workflows.approvals.decide``: its permission and claim checks,
its audit), oldest first; one refusal skips that approval only. An approval with a
decision form (``await_approval(form=...)``) is never decided here: it needs its
form, on its own page. Then back to the list, with its filters, and a message: how
many were approved or rejected, and each skipped one with why.

The list asks ``bulk_choices`` which of its rows get a checkbox.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.mixins import LoginRequiredMixin
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext
from django.views import View

from ..common.formatting import truncate
from ..common.user_input import MAX_COMMENT_CHARS, UserJSONError, check_comment
from ..models import Approval
from ..workflows.waiting.approvals import (
    ApprovalError,
    ApprovalPermissionError,
    check_may_decide,
    decidable_approvals,
    decide,
    visible_approvals,
)
from .forms import InboxFilter

logger = logging.getLogger("flowwarden_django.inbox")

#: The most approval ids one bulk request may name.
MAX_BULK_IDS = 100
#: Characters of a prompt in a bulk message.
PROMPT_CHARS = 60
#: Skipped approvals named one message each; the rest are counted in one more.
MAX_SKIPPED_MESSAGES = 20
DECISIONS = {"approve": "approved", "reject": "rejected"}
#: The core's refusals (``ApprovalError.code``) in the inbox's words.
REFUSALS = {
    "approval_already_decided": gettext_lazy("it was already decided"),
    "approval_cancelled": gettext_lazy("it was cancelled: its run moved on"),
    "approval_claimed": gettext_lazy("someone else claimed it: only they decide it"),
    "approval_expired": gettext_lazy("it expired before it was decided"),
    "approval_forbidden": gettext_lazy("you may not decide it"),
    "approval_not_found": gettext_lazy("it does not exist any more"),
    "run_busy": gettext_lazy("its run is busy right now; try again"),
}
NEEDS_FORM = gettext_lazy("it needs its form: decide it on its own page")


class ApprovalIdsField(forms.Field):
    """A list of approval ids from repeated ``ids`` fields: each a UUID, repeats
    dropped, at least one and at most ``MAX_BULK_IDS`` (counting repeats)."""

    widget = forms.MultipleHiddenInput
    default_error_messages = {
        "required": gettext_lazy("Select at least one approval."),
        "too_many": gettext_lazy("Select at most %(max)d approvals at a time (%(count)d sent)."),
        "invalid": gettext_lazy("Not an approval id: %(value)s"),
    }

    def to_python(self, value: Any) -> list[uuid.UUID]:
        values = [] if value in self.empty_values else list(value)
        if len(values) > MAX_BULK_IDS:
            raise forms.ValidationError(
                self.error_messages["too_many"],
                code="too_many",
                params={"max": MAX_BULK_IDS, "count": len(values)},
            )
        ids: dict[uuid.UUID, None] = {}
        for text in values:
            try:
                ids[uuid.UUID(str(text))] = None
            except ValueError:
                raise forms.ValidationError(
                    self.error_messages["invalid"],
                    code="invalid",
                    params={"value": truncate(str(text), 40)},
                ) from None
        return list(ids)

    def validate(self, value: list[uuid.UUID]) -> None:
        if self.required and not value:
            raise forms.ValidationError(self.error_messages["required"], code="required")


class BulkDecisionForm(forms.Form):
    """The selected approvals and the comment every decision gets."""

    ids = ApprovalIdsField()
    comment = forms.CharField(required=False, max_length=MAX_COMMENT_CHARS, strip=True)

    def clean_comment(self) -> str:
        try:
            return check_comment(self.cleaned_data["comment"])
        except UserJSONError as exc:
            raise forms.ValidationError(str(exc)) from exc


def bulk_choices(user: Any, approvals: Iterable[Approval]) -> dict[Any, str]:
    """For each of *approvals* (by pk) that *user* may decide now, ``""`` when it can
    be decided in bulk, ``"form"`` when it needs its form. Others are left out: no
    checkbox (one query, whatever the number of rows)."""
    rows = [a for a in approvals if a.status == Approval.Status.PENDING]
    mine = user.get_username()
    rows = [a for a in rows if not a.claimed_by or a.claimed_by == mine]
    allowed = set(
        decidable_approvals(user).filter(pk__in=[a.pk for a in rows]).values_list("pk", flat=True)
    )
    return {a.pk: ("form" if a.form else "") for a in rows if a.pk in allowed}


def filter_query(data: Any) -> str:
    """The list's filters in *data* (a query dict), validated and re-encoded, so that
    a redirect keeps them and nothing else."""
    filters = InboxFilter(data)
    if not filters.is_valid():
        return ""
    chosen = {k: v for k, v in filters.cleaned_data.items() if v}
    page = str(data.get("page", ""))
    if page.isdigit() and len(page) < 10:
        chosen["page"] = page
    return urlencode(chosen)


class BulkDecisionView(LoginRequiredMixin, View):
    """``POST bulk/``: decide the selected approvals (see the module)."""

    http_method_names = ["post"]

    def _url(self, name: str) -> str:
        namespace = self.request.resolver_match.namespace if self.request.resolver_match else ""
        return reverse(f"{namespace}:{name}" if namespace else name)

    def get_login_url(self) -> str:
        return self._url("login")

    def post(self, request: HttpRequest) -> HttpResponse:
        query = filter_query(request.GET)
        back = HttpResponseRedirect(self._url("list") + (f"?{query}" if query else ""))
        decision = next((DECISIONS[k] for k in DECISIONS if k in request.POST), None)
        form = BulkDecisionForm(
            {"ids": request.POST.getlist("ids"), "comment": request.POST.get("comment", "")}
        )
        if decision is None:
            messages.error(request, _("Choose Approve selected or Reject selected."))
            return back
        if not form.is_valid():
            for errors in form.errors.values():
                for error in errors:
                    messages.error(request, error)
            return back
        self.decide_each(request, decision, form.cleaned_data["ids"], form.cleaned_data["comment"])
        return back

    def decide_each(
        self, request: HttpRequest, decision: str, ids: list[uuid.UUID], comment: str
    ) -> None:
        user = request.user
        found = {a.pk: a for a in visible_approvals(user).filter(pk__in=ids)}
        done = 0
        skipped: list[tuple[str, str]] = []
        warnings: list[str] = []
        for pk in ids:
            if pk not in found:  # or not theirs to see: the same answer, no trace
                skipped.append((str(pk), _("no such approval, or not one of yours")))
        for approval in sorted(found.values(), key=lambda a: (a.requested_at, str(a.pk))):
            name = truncate(approval.prompt or _("(no prompt)"), PROMPT_CHARS)
            why = self.refusal(approval, decision, user, comment)
            if why:
                skipped.append((name, why))
                continue
            try:
                result = decide(approval.pk, decision, user, comment=comment)
            except ApprovalError as exc:  # audited by the core
                skipped.append((name, str(REFUSALS.get(exc.code, exc))))
                continue
            except Exception:  # one approval's failure must not stop the others
                logger.exception("bulk %s of approval %s failed", decision, approval.pk)
                skipped.append((name, _("it could not be decided (see the server's log)")))
                continue
            if result.repeated:
                skipped.append((name, _("it was already %(status)s") % {"status": decision}))
            else:
                done += 1
            if result.warning and result.warning not in warnings:
                warnings.append(result.warning)
        if done:
            text = (
                ngettext("Approved %(count)d approval.", "Approved %(count)d approvals.", done)
                if decision == "approved"
                else ngettext("Rejected %(count)d approval.", "Rejected %(count)d approvals.", done)
            )
            messages.success(request, text % {"count": done})
        for name, why in skipped[:MAX_SKIPPED_MESSAGES]:
            messages.warning(
                request, _("Skipped “%(what)s”: %(why)s.") % {"what": name, "why": why}
            )
        if len(skipped) > MAX_SKIPPED_MESSAGES:
            more = len(skipped) - MAX_SKIPPED_MESSAGES
            text = ngettext("…and %(count)d more skipped.", "…and %(count)d more skipped.", more)
            messages.warning(request, text % {"count": more})
        for warning in warnings:
            messages.warning(request, warning)

    @staticmethod
    def refusal(approval: Approval, decision: str, user: Any, comment: str) -> str:
        """Why *approval* is not decided in bulk before the core is asked ("" if it
        may be): it needs its form, or *user* may not decide it (audited, as the
        single page audits it)."""
        if approval.form:
            return str(NEEDS_FORM)
        try:
            check_may_decide(approval, decision, user, comment=comment)
        except ApprovalPermissionError:
            return str(REFUSALS["approval_forbidden"])
        return ""
