"""The typed decision form the approval tests use: a refund's amount (at most the
order's total, from the form's initial data) and a reason from a list."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms


class RefundDecisionForm(forms.Form):
    """Approving a refund: how much (no more than ``initial["order_total"]``) and why."""

    REASONS = [("damaged", "Damaged"), ("late", "Arrived late"), ("goodwill", "Goodwill")]

    amount = forms.DecimalField(min_value=Decimal("0.01"), decimal_places=2, max_digits=10)
    reason = forms.ChoiceField(choices=REASONS, help_text="Why the refund is granted.")
    refund_on = forms.DateField(required=False, label="Refund date")

    def clean_amount(self) -> Any:
        amount = self.cleaned_data["amount"]
        total = self.initial.get("order_total")
        if total is not None and amount > Decimal(str(total)):
            raise forms.ValidationError(f"At most the order's total, {total}.")
        return amount


class NotAForm:
    """A class that is not a Django form (a form path pointing here is refused)."""


class NeedsAnOrderForm(forms.Form):
    """A form that cannot be made with data and initial data alone (refused)."""

    note = forms.CharField()

    def __init__(self, order: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
