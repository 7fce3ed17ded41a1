"""``manage.py demo``: checkpoints written through the public API, then shown.

Plays what a change-stream consumer does to its checkpoint store, with no MongoDB:
an ``orders`` stream bootstraps, settles events and saves its processed anchor
every 100 events; an idle ``inventory`` stream is kept alive by heartbeats; a
``payments`` stream loses its history and is reset with the guarded reset.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.utils import timezone

from flowwarden_django.streams import Checkpoint, checkpoint_stores


def resume_token(at: datetime, counter: int) -> dict[str, str]:
    """A token shaped like MongoDB's: "82", the cluster time, its increment, then the rest."""
    return {"_data": f"82{int(at.timestamp()):08X}{counter:08X}2B022C0100296E5A1004"}


class Command(BaseCommand):
    """Writes demo checkpoints, lists them and prints how to open the admin page."""

    help = "Write demo checkpoints through the public API and show where to see them."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--events", type=int, default=1000, help="orders events to settle")
        parser.add_argument("--save-every", type=int, default=100, help="the save_every_n policy")

    def handle(self, *args: Any, events: int, save_every: int, **options: Any) -> None:
        store = checkpoint_stores["default"]
        now = timezone.now()
        self.stdout.write(f"Checkpoint store 'default': {type(store).__name__}\n")

        # orders: bootstrap from the server's position, then settle events.
        start = now - timedelta(minutes=20)
        store.save(Checkpoint("orders", "demo-host:shop:8000", metadata={"collection": "orders"}))
        store.save_seen("orders", resume_token(start, 0), start, heartbeat_at=start)
        settled = 0
        for event in range(1, events + 1):
            at = start + timedelta(seconds=event)
            if event % save_every == 0:
                store.save_processed("orders", resume_token(at, event), at, heartbeat_at=at)
                settled = event
        self.stdout.write(
            f"  orders: {events} events settled, processed anchor at event {settled} "
            f"(save_every_n={save_every})"
        )

        # inventory: idle; the heartbeat certifies a seen position and re-confirms it.
        certified = now - timedelta(hours=2)
        store.save_seen("inventory", resume_token(certified, 5), certified, certified)
        store.save_heartbeat("inventory", now - timedelta(minutes=5))
        self.stdout.write("  inventory: idle, seen anchor certified, heartbeat 5 minutes ago")

        # payments: the processed token fell off the oplog; recover from "now".
        expired = now - timedelta(days=3)
        store.save_processed("payments", resume_token(expired, 77), expired)
        dead = store.find("payments").last_processed_token
        store.reset_after_history_lost("payments", resume_token(now, 1), dead, now)
        self.stdout.write("  payments: history lost, reset to a fresh position (guarded reset)\n")

        call_command("flowwarden_checkpoints", "list", stdout=self.stdout)

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
