"""Claim, release and reassign in the approval admin: buttons on an approval's page,
changelist actions, a "claimed" list filter, and the reassign page, each through
``workflows.waiting.approvals.claims`` (race-safe and audited there)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..common.formatting import NONE_TEXT, truncate
from ..common.user_input import (
    MAX_COMMENT_CHARS,
    UserJSONError,
    check_comment,
    unknown_usernames,
)
from ..models import Approval
from ..workflows.waiting.approvals import (
    ApprovalError,
    ApprovalPermissionError,
    can_decide,
    claim,
    reassign,
    release,
)
from ..workflows.waiting.approvals.claims import MAX_REASSIGN_USERS, NAME_CHARS, REASSIGN
from .approval_columns import short_prompt
from .approval_decisions import PENDING, refusal_text
from .base import age, page_context

TEMPLATES = "admin/flowwarden_django/approval"


class ClaimedFilter(admin.SimpleListFilter):
    """Claimed by me, by anyone, or unclaimed."""

    title = _("claimed")
    parameter_name = "claimed"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("me", _("By me")), ("yes", _("By anyone")), ("no", _("Unclaimed"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Approval]) -> QuerySet[Approval]:
        value = self.value()
        if value == "me":
            return queryset.filter(claimed_by=request.user.get_username())
        if value == "yes":
            return queryset.exclude(claimed_by="")
        if value == "no":
            return queryset.filter(claimed_by="")
        return queryset


class ReassignForm(forms.Form):
    """Who the approval goes to: users (by username) and/or a group."""

    to_users = forms.CharField(
        required=False,
        max_length=MAX_REASSIGN_USERS * (NAME_CHARS + 2),
        label=_("Users"),
        help_text=_("Usernames, separated by commas; they replace the assignees."),
    )
    to_group = forms.CharField(
        required=False,
        max_length=NAME_CHARS,
        label=_("Group"),
        help_text=_("A group name; it replaces the group (empty: no group)."),
    )
    comment = forms.CharField(
        required=False,
        max_length=MAX_COMMENT_CHARS,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        label=_("Comment"),
    )

    def clean_to_users(self) -> list[str]:
        names = sorted({n.strip() for n in self.cleaned_data["to_users"].split(",")} - {""})
        if len(names) > MAX_REASSIGN_USERS:
            raise forms.ValidationError(gettext("At most %d users.") % MAX_REASSIGN_USERS)
        unknown = unknown_usernames(names)
        if unknown:
            raise forms.ValidationError(
                gettext("No such user: %(names)s.") % {"names": ", ".join(unknown[:5])}
            )
        return names

    def clean_to_group(self) -> str:
        group = self.cleaned_data["to_group"].strip()
        if group and not Group.objects.filter(name=group).exists():
            raise forms.ValidationError(gettext("No such group."))
        return group

    def clean_comment(self) -> str:
        try:
            return check_comment(self.cleaned_data["comment"])
        except UserJSONError as exc:
            raise forms.ValidationError(str(exc)) from exc

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not self.errors and not data.get("to_users") and not data.get("to_group"):
            raise forms.ValidationError(gettext("Name at least one user or a group."))
        return data


class ApprovalClaimsMixin:
    """The approval admin's claim, release and reassign (see the module)."""

    # -- the list --------------------------------------------------------------------

    @admin.display(description=_("claimed by"), ordering="claimed_by")
    def claimed(self, obj: Approval) -> SafeString | str:
        if not obj.claimed_by:
            return NONE_TEXT
        return format_html(
            '<span class="flowwarden-token" title="{}">{}</span><br>{}',
            obj.claimed_by,
            truncate(obj.claimed_by, 12),
            age(obj.claimed_at),
        )

    @admin.action(permissions=["decide"], description=_("Claim selected %(verbose_name_plural)s"))
    def claim_selected(self, request: HttpRequest, queryset: QuerySet[Approval]) -> None:
        self._claim_all(request, queryset, claim, gettext("Claimed %(count)d approval(s)."))

    @admin.action(permissions=["decide"], description=_("Release selected %(verbose_name_plural)s"))
    def release_selected(self, request: HttpRequest, queryset: QuerySet[Approval]) -> None:
        self._claim_all(request, queryset, release, gettext("Released %(count)d approval(s)."))

    def _claim_all(
        self,
        request: HttpRequest,
        queryset: QuerySet[Approval],
        call: Callable[..., Any],
        done: str,
    ) -> None:
        changed = 0
        for approval in queryset:
            try:
                changed += call(approval.pk, request.user, using=approval._state.db).changed
            except ApprovalError as exc:
                text = gettext("“%(prompt)s”: %(why)s.")
                values = {"prompt": short_prompt(approval), "why": _why(exc, approval)}
                self.message_user(request, text % values, messages.WARNING)  # type: ignore[attr-defined]
        self.message_user(request, done % {"count": changed}, messages.SUCCESS)  # type: ignore[attr-defined]

    # -- an approval's page ----------------------------------------------------------

    def object_views(self) -> list[tuple[str, Callable[..., HttpResponse]]]:
        return [
            ("claim", self.claim_view),
            ("release", self.release_view),
            ("reassign", self.reassign_view),
            *super().object_views(),  # type: ignore[misc]
        ]

    def change_page_context(
        self, request: HttpRequest, approval: Approval | None
    ) -> dict[str, Any]:
        context: dict[str, Any] = {"approval_claim": None}
        if approval is not None:
            context["approval_claim"] = self._claim_buttons(request, approval)
            # While someone else holds it the decision buttons would only be refused.
            holder = approval.claimed_by
            if holder and holder != request.user.get_username():
                context["approval_decisions"] = []
        return {**super().change_page_context(request, approval), **context}  # type: ignore[misc]

    def _claim_buttons(self, request: HttpRequest, approval: Approval) -> dict[str, Any]:
        user = request.user
        pending = approval.status == PENDING
        holder = approval.claimed_by
        mine = bool(holder) and holder == user.get_username()
        return {
            "claim_url": self.object_url(approval, "claim")  # type: ignore[attr-defined]
            if pending and not holder and can_decide(user, approval)
            else "",
            "release_url": self.object_url(approval, "release")  # type: ignore[attr-defined]
            if pending and holder and (mine or user.has_perm(REASSIGN))
            else "",
            "reassign_url": self.object_url(approval, "reassign")  # type: ignore[attr-defined]
            if pending and user.has_perm(REASSIGN)
            else "",
            "claimed_by": holder,
        }

    def claim_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._claim_or_release(request, object_id, claim, gettext("Claimed “%(prompt)s”."))

    def release_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        text = gettext("Released “%(prompt)s”.")
        return self._claim_or_release(request, object_id, release, text)

    def _claim_or_release(
        self, request: HttpRequest, object_id: str, call: Callable[..., Any], done: str
    ) -> HttpResponse:
        approval = self.get_object(request, unquote(object_id))  # type: ignore[attr-defined]
        if approval is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)  # type: ignore[attr-defined]
        change_url = self.object_url(approval)  # type: ignore[attr-defined]
        if request.method != "POST":
            return HttpResponseRedirect(change_url)
        try:
            call(approval.pk, request.user, using=approval._state.db)
        except ApprovalPermissionError as exc:
            raise PermissionDenied from exc
        except ApprovalError as exc:
            text = gettext("Could not do it: %(why)s.") % {"why": _why(exc, approval)}
            self.message_user(request, text, messages.WARNING)  # type: ignore[attr-defined]
        else:
            values = {"prompt": short_prompt(approval)}
            self.message_user(request, done % values, messages.SUCCESS)  # type: ignore[attr-defined]
        return HttpResponseRedirect(change_url)

    def reassign_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The reassign page (GET), then the reassign (POST)."""
        approval = self.get_object(request, unquote(object_id))  # type: ignore[attr-defined]
        if approval is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)  # type: ignore[attr-defined]
        if not request.user.has_perm(REASSIGN):
            raise PermissionDenied
        change_url = self.object_url(approval)  # type: ignore[attr-defined]
        if approval.status != PENDING:
            text = gettext("This approval is %(status)s: there is nothing to reassign.")
            values = {"status": approval.get_status_display()}
            self.message_user(request, text % values, messages.WARNING)  # type: ignore[attr-defined]
            return HttpResponseRedirect(change_url)
        if request.method == "POST":
            form = ReassignForm(request.POST)
        else:
            initial = {"to_users": ", ".join(approval.assignees), "to_group": approval.group}
            form = ReassignForm(initial=initial)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                reassign(
                    approval.pk,
                    by=request.user,
                    to_users=data["to_users"],
                    to_group=data["to_group"],
                    comment=data["comment"],
                    using=approval._state.db,
                )
            except ApprovalError as exc:
                form.add_error(None, _why(exc, approval))
            else:
                text = gettext("Reassigned “%(prompt)s”.") % {"prompt": short_prompt(approval)}
                self.message_user(request, text, messages.SUCCESS)  # type: ignore[attr-defined]
                return HttpResponseRedirect(change_url)
        context = page_context(
            self,
            request,
            gettext("Reassign"),
            approval=approval,
            prompt=short_prompt(approval),
            form=form,
            change_url=change_url,
            media=self.media + form.media,  # type: ignore[attr-defined]
        )
        return TemplateResponse(request, f"{TEMPLATES}/reassign.html", context)


def _why(error: ApprovalError, approval: Approval) -> str:
    return refusal_text(error)
