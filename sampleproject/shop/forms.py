"""The shop's typed decision form: what approving a large order takes.

``review`` asks for the approval with ``await_approval(..., form=OrderDecisionForm,
initial=decision_initial(total_cents))``: the inbox, the admin and the REST API show
the form and validate an approval's payload with it (a rejection needs none), and
``fulfil`` reads its cleaned data from ``ctx.decision.payload``.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms

#: Why an approver lets a large order through.
REASONS = [
    ("credit_checked", "Checked the customer's credit"),
    ("known_customer", "A known customer"),
    ("deposit_paid", "A deposit was paid"),
    ("other", "Other (see the comment)"),
]
#: The ``initial`` key holding the order's total: the most that may be approved.
ORDER_TOTAL = "order_total"


def cents_to_amount(cents: int) -> Decimal:
    """An amount in cents as dollars with two decimals."""
    return (Decimal(cents) / 100).quantize(Decimal("0.01"))


def decision_initial(total_cents: int) -> dict[str, Any]:
    """The form's initial data for an order of *total_cents*: the whole order approved
    (the approver may lower it), and the order's total, the upper bound."""
    total = str(cents_to_amount(total_cents))
    return {"approved_amount": total, ORDER_TOTAL: total}


class OrderDecisionForm(forms.Form):
    """Approving a large order: the amount approved (more than zero, at most the
    order's total) and a reason from a list."""

    approved_amount = forms.DecimalField(
        label="Approved amount ($)",
        max_digits=12,
        decimal_places=2,
        min_value=Decimal("0.01"),
        help_text="At most the order's total.",
    )
    reason = forms.ChoiceField(label="Reason", choices=REASONS)

    def clean_approved_amount(self) -> Decimal:
        amount = self.cleaned_data["approved_amount"]
        total = self.initial.get(ORDER_TOTAL)
        if total is not None and amount > Decimal(str(total)):
            raise forms.ValidationError(
                "At most the order's total, $%(total)s.", params={"total": total}, code="max_value"
            )
        return amount
