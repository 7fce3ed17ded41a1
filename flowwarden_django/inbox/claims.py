"""Claim and release in the inbox: the buttons of an approval's page (``POST
<id>/claim/``, ``<id>/release/``, through ``workflows.waiting.approvals.claims``),
what the page needs to show them, and the list's "assigned to me" (claimed by you)
and "unclaimed" filter."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.mixins import LoginRequiredMixin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views import View

from ..models import Approval
from ..workflows.waiting.approvals import (
    ApprovalError,
    ApprovalPermissionError,
    can_decide,
    claim,
    release,
    visible_approvals,
)
from ..workflows.waiting.approvals.claims import REASSIGN

#: The list's claim filter: ``?claim=mine`` (claimed by you) or ``unclaimed``.
CLAIM_CHOICES = [
    ("", gettext_lazy("Anyone's")),
    ("mine", gettext_lazy("Assigned to me")),
    ("unclaimed", gettext_lazy("Unclaimed")),
]


def filter_by_claim(rows: QuerySet[Approval], user: Any, choice: str) -> QuerySet[Approval]:
    """*rows* claimed by *user* (``mine``), unclaimed (``unclaimed``), or all."""
    if choice == "mine":
        return rows.filter(claimed_by=user.get_username())
    if choice == "unclaimed":
        return rows.filter(claimed_by="")
    return rows


def claim_context(request: HttpRequest, approval: Approval) -> dict[str, Any]:
    """What an approval's page needs for its claim: who holds it, whether the user
    may decide it now (not while someone else holds it), and the buttons' URLs."""
    user = request.user
    pending = approval.status == Approval.Status.PENDING
    holder = approval.claimed_by
    mine = holder == user.get_username()
    decider = pending and can_decide(user, approval)
    namespace = request.resolver_match.namespace if request.resolver_match else ""

    def url(name: str) -> str:
        return reverse(f"{namespace}:{name}" if namespace else name, kwargs={"pk": approval.pk})

    return {
        "claimed_by": holder,
        "claimed_by_me": bool(holder) and mine,
        "may_decide": decider and (not holder or mine),
        "may_claim": decider and not holder,
        "may_release": pending and bool(holder) and (mine or user.has_perm(REASSIGN)),
        "claim_url": url("claim"),
        "release_url": url("release"),
    }


class ClaimView(LoginRequiredMixin, View):
    """``POST <id>/claim/`` or ``<id>/release/`` (``action``), then back to the
    approval's page with a message. 404 for an approval the user cannot see, 403
    for one they may not claim or release."""

    action = "claim"
    http_method_names = ["post"]

    def get_login_url(self) -> str:
        namespace = self.request.resolver_match.namespace if self.request.resolver_match else ""
        return reverse(f"{namespace}:login" if namespace else "login")

    def post(self, request: HttpRequest, pk: Any) -> HttpResponse:
        approval = visible_approvals(request.user).filter(pk=pk).first()
        if approval is None:
            raise Http404(_("No such approval, or not one of yours."))
        call = claim if self.action == "claim" else release
        try:
            result = call(approval.pk, request.user)
        except ApprovalPermissionError as exc:
            raise PermissionDenied(_("You may not do that with this approval.")) from exc
        except ApprovalError as exc:  # claimed by someone else, decided, expired
            messages.warning(request, _("Not done: %(why)s.") % {"why": exc})
        else:
            if not result.changed:
                text = _("Nothing changed.")
            elif self.action == "claim":
                text = _("Claimed: only you decide it until you release it.")
            else:
                text = _("Released: anyone who may decide it can claim it.")
            messages.success(request, text)
        namespace = request.resolver_match.namespace if request.resolver_match else ""
        name = f"{namespace}:approval" if namespace else "approval"
        return HttpResponseRedirect(reverse(name, kwargs={"pk": approval.pk}))
