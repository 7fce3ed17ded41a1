"""``manage.py demo``: the ``orders`` stream end to end, then the checkpoint API.

1. Starts a scripted MongoDB replica set (or uses ``FLOWWARDEN_MONGO_URL``), runs
   the ``orders`` stream once to bootstrap its position, writes orders to
   MongoDB, and runs the stream again in burst mode: the ``Order`` table follows.
   A third run resumes after the saved anchor and re-processes nothing.
2. Writes checkpoints of two more streams through the public API (an idle
   ``inventory`` stream kept alive by heartbeats, a ``payments`` stream whose
   history was lost), lists every checkpoint and says where the admin shows them.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.test.utils import override_settings
from django.utils import timezone

from flowwarden_django.streams import checkpoint_stores
from flowwarden_django.streams.manager import StreamManager
from flowwarden_django.streams.runtime import StreamConsumer, StreamState

from ...models import Order

DB, COLLECTION, STREAM = "shop", "orders", "orders"


def resume_token(at: datetime, counter: int) -> dict[str, str]:
    """A token shaped like MongoDB's: "82", the cluster time, its increment, then the rest."""
    return {"_data": f"82{int(at.timestamp()):08X}{counter:08X}2B022C0100296E5A1004"}


class ScriptedShop:
    """Writes orders into a scripted replica set started for the demo."""

    def __init__(self) -> None:
        from flowwarden_django.testkit.scripted_mongo import ScriptedReplicaSet

        self.server = ScriptedReplicaSet().start()
        self.uri = self.server.uri

    def insert(self, doc: dict[str, Any]) -> None:
        self.server.insert(DB, COLLECTION, doc)

    def update(self, order_id: int, fields: dict[str, Any]) -> None:
        self.server.update(DB, COLLECTION, order_id, set_fields=fields)

    def delete(self, order_id: int) -> None:
        self.server.delete(DB, COLLECTION, order_id)

    def close(self) -> None:
        self.server.stop()


class MongoShop:
    """Writes orders into a real replica set (``FLOWWARDEN_MONGO_URL``)."""

    def __init__(self, uri: str) -> None:
        from pymongo import MongoClient

        self.uri = uri
        self.client = MongoClient(uri, serverSelectionTimeoutMS=5000)
        self.orders = self.client[DB][COLLECTION]

    def insert(self, doc: dict[str, Any]) -> None:
        self.orders.insert_one(doc)

    def update(self, order_id: int, fields: dict[str, Any]) -> None:
        self.orders.update_one({"_id": order_id}, {"$set": fields})

    def delete(self, order_id: int) -> None:
        self.orders.delete_one({"_id": order_id})

    def close(self) -> None:
        self.client.close()


class Command(BaseCommand):
    """Runs the sample's ``orders`` stream and shows the checkpoints it keeps."""

    help = "Run the orders stream against a scripted (or real) MongoDB, then show checkpoints."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--orders", type=int, default=500, help="orders to write")

    def handle(self, *args: Any, orders: int, **options: Any) -> None:
        self.stream_demo(orders)
        self.checkpoint_api_demo()
        call_command("flowwarden_checkpoints", "list", stdout=self.stdout)
        self.admin_instructions()

    # -- 1. the orders stream ------------------------------------------------------------

    def stream_demo(self, count: int) -> None:
        url = settings.MONGO_URL
        if url:
            shop: ScriptedShop | MongoShop = MongoShop(url)
            self.stdout.write(f"MongoDB: {url} (FLOWWARDEN_MONGO_URL)")
            first_id = (
                Order.objects.order_by("-order_id").values_list("order_id", flat=True).first() or 0
            ) + 1
        else:
            shop = ScriptedShop()
            self.stdout.write(
                f"MongoDB: a scripted replica set at {shop.uri} (no server needed; it answers "
                "the real pymongo driver like a replica-set primary). Set FLOWWARDEN_MONGO_URL "
                "to use a real one."
            )
            # A new scripted server has a new history: start the stream afresh.
            checkpoint_stores["default"].delete(STREAM)
            Order.objects.all().delete()
            first_id = 1
        clients = {"default": {"URL": shop.uri, "OPTIONS": {"serverSelectionTimeoutMS": 5000}}}
        try:
            with override_settings(FLOWWARDEN={**settings.FLOWWARDEN, "MONGO_CLIENTS": clients}):
                self.run_burst("first start: the stream saves its position, nothing to read yet")
                ids = range(first_id, first_id + count)
                for order_id in ids:
                    shop.insert(
                        {
                            "_id": order_id,
                            "customer": f"c{order_id % 37}",
                            "status": "new",
                            "total_cents": 100 * order_id,
                        }
                    )
                for order_id in ids[::5]:
                    shop.update(order_id, {"status": "paid"})
                for order_id in ids[::50]:
                    shop.delete(order_id)
                writes = len(ids) + len(ids[::5]) + len(ids[::50])
                self.stdout.write(f"Wrote {writes} changes to {DB}.{COLLECTION} in MongoDB")
                handled = self.run_burst("second start: resumes after the saved position")
                self.stdout.write(
                    f"  Order table: {Order.objects.count()} orders, "
                    f"{Order.objects.filter(status='paid').count()} paid"
                )
                again = self.run_burst("third start: resumes after the processed anchor")
                self.stdout.write(f"  re-processed {again} of the {handled} events")
        finally:
            shop.close()

    def run_burst(self, label: str) -> int:
        manager = StreamManager()
        consumer: StreamConsumer = manager.start(STREAM, burst=True)
        manager.wait()
        if consumer.state == StreamState.CRASHED:
            raise CommandError(f"the orders stream stopped: {consumer.last_error}")
        self.stdout.write(f"Stream {STREAM!r}, {label}: {consumer.events_handled} events handled")
        return consumer.events_handled

    # -- 2. the checkpoint API -----------------------------------------------------------

    def checkpoint_api_demo(self) -> None:
        store, now = checkpoint_stores["default"], timezone.now()
        certified = now - timedelta(hours=2)
        store.save_seen("inventory", resume_token(certified, 5), certified, certified)
        store.save_heartbeat("inventory", now - timedelta(minutes=5))
        self.stdout.write("\nCheckpoint API: 'inventory' is idle, its heartbeat 5 minutes old;")
        expired = now - timedelta(days=3)
        store.save_processed("payments", resume_token(expired, 77), expired)
        dead = store.find("payments").last_processed_token
        store.reset_after_history_lost("payments", resume_token(now, 1), dead, now)
        self.stdout.write("'payments' lost its history and was reset (the guarded reset).\n")

    def admin_instructions(self) -> None:
        password = secrets.token_urlsafe(9)
        user, _ = get_user_model().objects.get_or_create(
            username="admin", defaults={"is_staff": True, "is_superuser": True}
        )
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        self.stdout.write(
            self.style.SUCCESS("\nSee them in the admin:")
            + "\n  make serve   (that is: .venv/bin/python manage.py runserver)"
            + "\n  http://127.0.0.1:8000/admin/flowwarden_django/streamcheckpoint/"
            + f"\n  log in as admin / {password}   (a new password each demo run)"
            + "\n  or: python manage.py flowwarden_checkpoints show orders"
        )
