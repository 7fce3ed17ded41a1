"""The shop's change streams (discovered at start-up: apps' ``streams`` modules are imported).

``orders`` mirrors MongoDB's ``shop.orders`` collection into the ``Order`` model and
starts each new order's approval workflow. Handlers are idempotent (upserts and
deletes by id; the workflow is started with the order's key, so at most once), as
at-least-once delivery needs.
"""

from typing import Any

from flowwarden_django.streams.context import ChangeContext
from flowwarden_django.streams.registry import change_stream, checkpoint

from .models import Order
from .workflows import start_for_order


@change_stream("orders", collection="orders", database="shop", full_document="updateLookup")
@checkpoint(save_every_n=100, save_interval_seconds=5, idle_heartbeat_interval_seconds=60)
class OrderProjection:
    """Keeps ``Order`` rows equal to the documents of ``shop.orders``."""

    def on_insert(self, doc: dict[str, Any]) -> None:
        self._upsert(doc)
        start_for_order(doc)

    def on_replace(self, doc: dict[str, Any]) -> None:
        self._upsert(doc)

    def on_update(self, doc: dict[str, Any] | None, ctx: ChangeContext) -> None:
        if doc is not None:  # None when the order was deleted before the lookup
            self._upsert(doc)

    def on_delete(self, ctx: ChangeContext) -> None:
        Order.objects.filter(order_id=ctx.document_key["_id"]).delete()

    def _upsert(self, doc: dict[str, Any]) -> None:
        Order.objects.update_or_create(
            order_id=doc["_id"],
            defaults={
                "customer": doc.get("customer", ""),
                "status": doc.get("status", "new"),
                "total_cents": doc.get("total_cents", 0),
            },
        )
