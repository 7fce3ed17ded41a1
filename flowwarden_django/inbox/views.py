"""The inbox's pages: log in, my approvals, one approval (see the package docstring)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.mixins import LoginRequiredMixin
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views import View

from ..common.formatting import state_json
from ..common.user_input import MAX_COMMENT_CHARS
from ..models import Approval
from ..workflows.definition.registry import store_for_workflow
from ..workflows.waiting.approvals import (
    ApprovalConflictError,
    ApprovalError,
    ApprovalFormError,
    ApprovalPermissionError,
    can_decide,
    check_may_decide,
    decidable_approvals,
    decide,
    visible_approvals,
)
from ..workflows.waiting.approvals.due import due_times, overdue_q
from ..workflows.waiting.approvals.forms import (
    ApprovalFormUnavailableError,
    add_form_errors,
    json_safe,
    page_form,
    page_form_or_error,
)
from .bulk import MAX_BULK_IDS, bulk_choices, filter_query
from .claims import CLAIM_CHOICES, claim_context, filter_by_claim
from .forms import DUE_CHOICES, DecisionForm, InboxFilter

#: Approvals a page of the list shows.
PAGE_SIZE = 25
DECISIONS = {"approve": "approved", "reject": "rejected"}


def _url(request: HttpRequest, name: str, **kwargs: Any) -> str:
    """*name* in the namespace the inbox was reached by."""
    namespace = request.resolver_match.namespace if request.resolver_match else ""
    return reverse(f"{namespace}:{name}" if namespace else name, kwargs=kwargs or None)


def page_context(request: HttpRequest, title: str) -> dict[str, Any]:
    """What the admin's base template needs, for a user who need not be staff."""
    return {
        **admin.site.each_context(request),
        "title": title,
        "is_nav_sidebar_enabled": False,
        "inbox_url": _url(request, "list"),
        "logout_url": _url(request, "logout"),
    }


class InboxPage(LoginRequiredMixin, View):
    """A page for a logged-in user (else the inbox's own login page)."""

    def get_login_url(self) -> str:
        return _url(self.request, "login")


class InboxLoginView(auth_views.LoginView):
    """Django's login view, on a page that looks like the admin's."""

    template_name = "flowwarden_django/inbox/login.html"
    redirect_authenticated_user = True

    def get_default_redirect_url(self) -> str:
        return self.get_redirect_url() or _url(self.request, "list")

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        return {**page_context(self.request, _("Log in")), **super().get_context_data(**kwargs)}


class MyApprovals(InboxPage):
    """The approvals the user may decide: pending by default (``?status=all`` or a
    status for the others they may see), by workflow, by prompt or run."""

    def get(self, request: HttpRequest) -> HttpResponse:
        filters = InboxFilter(request.GET)
        chosen = filters.cleaned_data if filters.is_valid() else {}
        rows = self.rows(request.user, chosen.get("status") or "")
        if chosen.get("workflow"):
            rows = rows.filter(workflow_name=chosen["workflow"])
        rows = filter_by_claim(rows, request.user, chosen.get("claim") or "")
        if chosen.get("due") == "overdue":
            rows = rows.filter(overdue_q())
        if chosen.get("q"):
            text = chosen["q"]
            rows = rows.filter(Q(prompt__icontains=text) | Q(coordination_id__icontains=text))
        page = Paginator(rows.order_by("-requested_at", "-pk"), PAGE_SIZE).get_page(
            request.GET.get("page")
        )
        choices = bulk_choices(request.user, page.object_list)
        now = timezone.now()
        listed = [
            {
                "approval": approval,
                "due": due_times(approval, now),
                # "": a checkbox; "form": it needs its form; None: not theirs to decide now.
                "bulk": choices.get(approval.pk),
            }
            for approval in page.object_list
        ]
        workflows = sorted(
            set(self.rows(request.user, "all").values_list("workflow_name", flat=True))
        )
        context = {
            **page_context(request, _("My approvals")),
            "filters": filters,
            "page": page,
            "workflows": workflows,
            "status_choices": InboxFilter.base_fields["status"].choices,
            "claim_choices": CLAIM_CHOICES,
            "due_choices": DUE_CHOICES,
            "chosen": chosen,
            "rows": listed,
            "bulk_possible": "" in choices.values(),
            "max_bulk": MAX_BULK_IDS,
            "max_comment_chars": MAX_COMMENT_CHARS,
            # The filters again, for the pages' links and the bulk form's way back.
            "filter_query": filter_query({k: v for k, v in chosen.items() if k != "page"}),
        }
        return render(request, "flowwarden_django/inbox/list.html", context)

    @staticmethod
    def rows(user: Any, status: str) -> QuerySet[Approval]:
        if status == "":
            return decidable_approvals(user)
        mine = visible_approvals(user)
        return mine if status == "all" else mine.filter(status=status)


class ApprovalPage(InboxPage):
    """One approval: what it asks, the run's state, and the decision form for a user
    who may decide it (a POST from anyone else is 403). An approval with a typed form
    (``await_approval(form=...)``) shows that form's fields instead of the JSON
    payload: approving validates them (errors shown, entries kept) and hands the
    cleaned data on; rejecting needs no form."""

    def get(self, request: HttpRequest, pk: Any) -> HttpResponse:
        approval = self.approval(request, pk)
        return self.render(request, approval, DecisionForm(typed=bool(approval.form)))

    def post(self, request: HttpRequest, pk: Any) -> HttpResponse:
        approval = self.approval(request, pk)
        decision = next((DECISIONS[k] for k in DECISIONS if k in request.POST), None)
        try:  # refused (and audited, as the API and the admin do) before the form is judged
            check_may_decide(approval, decision or "approved", request.user)
        except ApprovalPermissionError as exc:
            raise PermissionDenied(_("You may not decide this approval.")) from exc
        form = DecisionForm(request.POST, typed=bool(approval.form))
        typed = None
        if decision == "approved" and approval.form:
            try:
                typed = page_form(approval, request.POST)
            except ApprovalFormUnavailableError:
                return self.render(request, approval, form, status=400)
        valid = form.is_valid() and (typed is None or typed.is_valid())
        if decision is None or not valid:
            if decision is None:
                form.add_error(None, _("Choose Approve or Reject."))
            return self.render(request, approval, form, status=400, typed=typed)
        payload = form.cleaned_data.get("payload")
        if typed is not None:
            payload = json_safe(typed.cleaned_data)
        try:
            result = decide(
                approval.pk,
                decision,
                request.user,
                comment=form.cleaned_data["comment"],
                payload=payload,
            )
        except ApprovalConflictError as exc:  # decided meanwhile, or cancelled
            messages.warning(request, str(exc))
            return HttpResponseRedirect(_url(request, "approval", pk=approval.pk))
        except ApprovalFormError as exc:  # the form changed since it was shown, say
            if typed is not None:
                add_form_errors(typed, exc)
            else:
                form.add_error(None, str(exc))
            return self.render(request, approval, form, status=400, typed=typed)
        except (ApprovalError, ValueError) as exc:
            form.add_error(None, str(exc))
            return self.render(request, approval, form, status=400, typed=typed)
        verb = _("Approved") if decision == "approved" else _("Rejected")
        messages.success(
            request, _("%(verb)s: %(prompt)s") % {"verb": verb, "prompt": approval.prompt}
        )
        if result.warning:  # this process does not define the run's workflow
            messages.warning(request, result.warning)
        return HttpResponseRedirect(_url(request, "list"))

    @staticmethod
    def approval(request: HttpRequest, pk: Any) -> Approval:
        approval = visible_approvals(request.user).filter(pk=pk).first()
        if approval is None:
            raise Http404(_("No such approval, or not one of yours."))
        return approval

    def render(
        self,
        request: HttpRequest,
        approval: Approval,
        form: DecisionForm,
        status: int = 200,
        typed: Any = None,
    ) -> HttpResponse:
        state, unreadable = _state_of(approval)
        pending = approval.status == Approval.Status.PENDING
        typed_error = ""
        if typed is None and pending:
            typed, typed_error = page_form_or_error(approval)
        context = {
            **page_context(request, approval.prompt or _("Approval")),
            "approval": approval,
            "state": state,
            "state_unreadable": unreadable,
            # The decision's payload, as the next step reads it (escaped by the template).
            "payload": None if approval.payload is None else state_json(approval.payload),
            "form": form,
            "typed_form": typed,
            "typed_form_error": typed_error,
            "may_decide": pending and can_decide(request.user, approval),
            # The claim's buttons; may_decide again: not while someone else holds it.
            **claim_context(request, approval),
            "events": approval.events.order_by("at", "pk"),
            "due": due_times(approval),
            "assignees": approval.assignees,
        }
        return render(request, "flowwarden_django/inbox/approval.html", context, status=status)


def _state_of(approval: Approval) -> tuple[str, str]:
    """The paused snapshot's state as indented JSON, or why it cannot be shown."""
    try:
        snapshot = store_for_workflow(approval.workflow_name).load(approval.snapshot_id)
    except Exception as exc:  # a wrong key, a store that is down: the page still works
        return "", _("The run's state cannot be read (%(error)s).") % {"error": type(exc).__name__}
    if snapshot is None:
        return "", _("The paused snapshot is gone (pruned).")
    return state_json(snapshot.state), ""
