"""The inbox's forms: the list's filters and a decision."""

from __future__ import annotations

from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _

from ..common.user_input import (
    MAX_COMMENT_CHARS,
    UserJSONError,
    check_comment,
    parse_decision_payload,
)
from ..models import Approval
from .claims import CLAIM_CHOICES

STATUS_CHOICES = [("", _("Pending")), ("all", _("All")), *Approval.Status.choices]
#: The list's deadline filter: ``?due=overdue`` (pending, past its escalation time
#: or expiry: ``workflows.waiting.approvals.due``).
DUE_CHOICES = [("", _("Any time")), ("overdue", _("Overdue"))]


class InboxFilter(forms.Form):
    """``?status=&workflow=&q=&claim=&due=`` of the list (a bad value is ignored, not
    an error)."""

    status = forms.ChoiceField(choices=STATUS_CHOICES, required=False, label=_("Status"))
    claim = forms.ChoiceField(choices=CLAIM_CHOICES, required=False, label=_("Claimed"))
    due = forms.ChoiceField(choices=DUE_CHOICES, required=False, label=_("Due"))
    workflow = forms.CharField(required=False, max_length=200, label=_("Workflow"))
    q = forms.CharField(required=False, max_length=200, label=_("Search"))


class DecisionForm(forms.Form):
    """A decision's comment and JSON payload (none with *typed*: the approval's own
    form gives it); which decision is the button pressed."""

    comment = forms.CharField(
        required=False,
        max_length=MAX_COMMENT_CHARS,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        label=_("Comment"),
        help_text=_("Kept in the audit trail; the next step reads it."),
    )
    payload = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 60, "spellcheck": "false"}),
        label=_("Payload (JSON)"),
        help_text=_('Optional; a JSON object handed to the next step, e.g. {"note": "vip"}.'),
    )

    def __init__(self, *args: Any, typed: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if typed:  # the approval's own form takes the payload's place
            del self.fields["payload"]

    def clean_comment(self) -> str:
        try:
            return check_comment(self.cleaned_data["comment"])
        except UserJSONError as exc:
            raise forms.ValidationError(str(exc)) from exc

    def clean_payload(self) -> Any:
        """The payload through the one validator the API and the commands use
        (``parse_decision_payload``): a JSON object within its limits, or ``None``."""
        try:
            return parse_decision_payload(self.cleaned_data["payload"])
        except UserJSONError as exc:
            if exc.code == "json_invalid":
                raise forms.ValidationError(
                    _('%(error)s. Strings need double quotes: "text".') % {"error": exc}
                ) from exc
            raise forms.ValidationError(str(exc)) from exc
