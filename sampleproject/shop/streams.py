"""The shop's change streams (discovered at start-up: apps' ``streams`` modules are imported).

``payments`` (at the end) takes the payment provider's records from ``shop.payments``
and resumes the waiting workflow of each paid order, exactly once.

``orders`` mirrors MongoDB's ``shop.orders`` collection into the ``Order`` model and
starts each new order's approval workflow. Handlers are idempotent (upserts and
deletes by id; the workflow is started with the order's key, so at most once), as
at-least-once delivery needs.

On its first start the stream copies the orders that already exist
(``start_position="COPY_EXISTING"``, 500 a batch), then streams from the position it
captured before the copy, so an order written during the copy arrives afterwards
too. A copied order goes to ``on_snapshot``, which only upserts its ``Order`` row: it
starts no approval workflow and is not checked, because those orders predate the
app (they were taken, paid or shipped without it), and asking an approver about
historic orders would be surprising. Delivery stays at least once: an order inserted
or updated during the copy can be copied in its new version and then see its change
event too, and an insert event starts that order's workflow (it is a new order), so
every handler is an upsert and the run is keyed by the order.

An order whose status becomes ``withdrawn`` cancels its workflow runs
(``withdraw_order``): no step runs for it again and its pending approval is cancelled.

An order the handler cannot take (a negative amount, or one on hold until a later
time) raises :class:`OrderRejected`; the stream parks it in the dead-letter queue
and goes on. In the admin's Dead letters list it can be replayed (an order on hold
goes through once its hold has passed) or discarded.
"""

import time
from datetime import UTC, datetime
from typing import Any

from flowwarden_django.streams import ChangeContext, change_stream, checkpoint, dead_letter_queue

from .models import Order
from .workflows import record_payment, start_for_order, withdraw_order


class OrderRejected(ValueError):
    """An order the shop cannot take (yet): the stream parks its event as a dead letter."""


def check_order(doc: dict[str, Any]) -> None:
    """Refuse a negative amount, and an order whose ``hold_until`` (Unix seconds) is ahead."""
    cents = doc.get("total_cents", 0)
    if cents < 0:
        raise OrderRejected(f"order {doc['_id']} has a negative amount ({cents} cents)")
    hold_until = doc.get("hold_until")
    if hold_until is not None and time.time() < hold_until:
        until = datetime.fromtimestamp(hold_until, UTC)
        raise OrderRejected(
            f"order {doc['_id']} is on hold until {until:%H:%M:%S} UTC; replay it after that"
        )


@change_stream("orders", collection="orders", database="shop", full_document="updateLookup")
@checkpoint(
    save_every_n=100,
    save_interval_seconds=5,
    idle_heartbeat_interval_seconds=60,
    start_position="COPY_EXISTING",
    copy_batch_size=500,
)
@dead_letter_queue(retention_days=30)
class OrderProjection:
    """Keeps ``Order`` rows equal to the documents of ``shop.orders``."""

    def on_snapshot(self, doc: dict[str, Any]) -> None:
        # An order that existed before the stream's first start: mirror it only.
        self._upsert(doc, copied=True)

    def on_insert(self, doc: dict[str, Any]) -> None:
        check_order(doc)
        self._upsert(doc, copied=False)
        start_for_order(doc)

    def on_replace(self, doc: dict[str, Any]) -> None:
        self._upsert(doc)
        self._withdrawn(doc)

    def on_update(self, doc: dict[str, Any] | None, ctx: ChangeContext) -> None:
        if doc is not None:  # None when the order was deleted before the lookup
            self._upsert(doc)
            self._withdrawn(doc)

    def _withdrawn(self, doc: dict[str, Any]) -> None:
        # Cancelling a run that is already cancelled or finished changes nothing.
        if doc.get("status") == "withdrawn":
            withdraw_order(doc["_id"], by="shop.orders stream")

    def on_delete(self, ctx: ChangeContext) -> None:
        Order.objects.filter(order_id=ctx.document_key["_id"]).delete()

    def _upsert(self, doc: dict[str, Any], **fields: Any) -> None:
        Order.objects.update_or_create(
            order_id=doc["_id"],
            defaults={
                "customer": doc.get("customer", ""),
                "status": doc.get("status", "new"),
                "total_cents": doc.get("total_cents", 0),
                **fields,
            },
        )


@change_stream("payments", collection="payments", database="shop", transactional=True)
@checkpoint(save_every_n=1, idle_heartbeat_interval_seconds=60)
@dead_letter_queue(retention_days=30)
class PaymentsReceived:
    """A payment recorded in ``shop.payments`` (``{_id, order_id, amount_cents}``) marks
    its order paid and resumes the order's run, which waits for it on invoice terms.

    ``transactional=True``: the handler's writes (the ``Order`` row and the message to
    the run, both on the default database) and the stream's checkpoint commit in one
    transaction, and the run wakes once it committed. A crash before that commit
    rolls all of it back and the payment is delivered again; a crash after it
    delivers nothing again. So each payment resumes its run exactly once. A payment
    for an order with no run (yet) is parked as a dead letter, to replay.
    """

    def on_insert(self, doc: dict[str, Any]) -> None:
        record_payment(doc)
