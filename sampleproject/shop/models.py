"""The shop's read model, kept up to date by the ``orders`` change stream (and its
payments by the ``payments`` stream)."""

from django.db import models


class Order(models.Model):
    """An order as the Django side sees it: a projection of MongoDB's ``shop.orders``."""

    order_id = models.IntegerField(unique=True)
    customer = models.CharField(max_length=100, default="")
    status = models.CharField(max_length=20, default="new")
    total_cents = models.IntegerField(default=0)
    #: Set by the order-approval workflow: "not needed", "waiting", "approved",
    #: "rejected" or "expired" ("" before its first step).
    approval = models.CharField(max_length=20, blank=True, default="")
    #: Mirrored by the stream's initial sync: the order predates the app, and starts
    #: no approval workflow (an insert event of the order clears it: a new order).
    copied = models.BooleanField(default=False)
    #: An order on invoice terms: "due" while its run waits for the payment, "paid"
    #: once the ``payments`` stream took it (with ``paid_cents``), "overdue" when none
    #: came in time; "" for an order paid when it was placed.
    payment = models.CharField(max_length=20, blank=True, default="")
    paid_cents = models.IntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["order_id"]
        permissions = [("start_order_workflow", "Can start an order's approval workflow")]

    def __str__(self) -> str:
        return f"order {self.order_id} ({self.status})"
