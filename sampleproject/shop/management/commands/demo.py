"""``manage.py demo``: the sample's whole story, on SQLite with no servers.

1. Starts a scripted MongoDB replica set (or uses ``FLOWWARDEN_MONGO_URL``) and
   stores orders that exist before the app (``--existing``; the scripted server's
   ``seed()`` writes no change events). The ``orders`` stream's first start copies
   them (its initial sync, ``COPY_EXISTING``) into the ``Order`` table, starting no
   workflow; after the copy's first batch an ``initial_sync_progress`` receiver inserts one
   order and updates an already copied one, and both are in the mirror afterwards.
   Then it writes new orders to MongoDB and runs the stream again in burst mode: the
   ``Order`` table follows, and every new order starts its ``order-approval``
   workflow run (small orders complete at once, two large ones wait for an
   approver). A third run resumes after the saved anchor and re-processes nothing; a
   redelivered insert starts no second run.
2. An approver approves one large order and rejects the other; each run resumes
   and completes. The approval has a typed decision form (an approved amount no
   larger than the order, a reason from a list): an amount over the order's total is
   refused with the form's error, then the approval goes through. Each large order's
   approval reminds its approvers every 12 hours and escalates to the ``managers``
   group after 24 (both printed). Prints the approved run's snapshot chain and the
   decision.
3. Payments: an order on invoice terms is fulfilled and its run waits for its
   payment (``wait_for``); a payment written to ``shop.payments`` goes through the
   transactional ``payments`` stream, which marks the order paid and resumes the run
   (the message, the order's row and the checkpoint in one transaction), and the
   payment delivered again sends nothing.
4. Writes checkpoints of two more streams through the public API (an idle
   ``inventory`` stream kept alive by heartbeats, a ``refunds`` stream whose
   history was lost) and lists every checkpoint.

``--serve`` leaves the second large order waiting, makes demo logins (``approver``,
not staff, who decides in the inbox at ``/approvals/``; ``admin``, a superuser) and
starts the development server, so a person can approve it in the inbox, the admin or
through the API. The
served process keeps the scripted replica set and runs the ``orders`` stream on it
(a ``StreamManager``: the admin's Streams console shows it running), and a feeder
thread writes an order every few seconds. The feeder's first two orders are refused
by the handler and parked as dead letters, to replay or discard in the admin.
"""

from __future__ import annotations

import re
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.test.utils import override_settings
from django.utils import timezone

from flowwarden_django.conf import fw_settings
from flowwarden_django.models import (
    Approval,
    DeadLetter,
    SnapshotRecord,
    StreamWorker,
    WorkflowMessage,
    WorkflowRun,
)
from flowwarden_django.streams import (
    ChangeSource,
    PymongoChangeSource,
    StreamConsumer,
    StreamManager,
    StreamSpec,
    StreamState,
    checkpoint_stores,
    max_await_ms,
    metrics,
    stream_registry,
)
from flowwarden_django.workflows import ApprovalFormError, Workflow, approve, reject

from ...forms import cents_to_amount
from ...models import Order
from ...workflows import (
    APPROVERS_GROUP,
    LEGACY_REMINDER,
    MANAGERS_GROUP,
    WORKFLOW,
    dollars,
    idempotency_key,
    record_payment,
    start_for_order,
)

#: The large orders written after the small ones: they wait for an approver.
LARGE_ORDERS = ((250_000, "acme"), (180_000, "globex"))

DB, COLLECTION, STREAM = "shop", "orders", "orders"
#: The payments stream and its collection.
PAYMENTS = "payments"
#: The order on invoice terms of the payments act, and what it costs.
INVOICED_CENTS, INVOICED_CUSTOMER = 12_500, "initech"

#: ``--serve``: seconds between two orders of the feeder, and how long its order on
#: hold is refused (a replay after that goes through).
FEED_INTERVAL = 3.0
HOLD_SECONDS = 15


def resume_token(at: datetime, counter: int) -> dict[str, str]:
    """A token shaped like MongoDB's: "82", the cluster time, its increment, then the rest."""
    return {"_data": f"82{int(at.timestamp()):08X}{counter:08X}2B022C0100296E5A1004"}


class ScriptedShop:
    """Writes orders into a scripted replica set started for the demo."""

    def __init__(self) -> None:
        from flowwarden_django.testkit import ScriptedReplicaSet

        self.server = ScriptedReplicaSet().start()
        self.uri = self.server.uri

    #: How :meth:`seed` stores the existing orders, for the demo's output.
    seeded_as = "stored without change events, as orders taken before the app"

    def seed(self, docs: list[dict[str, Any]]) -> None:
        self.server.seed(DB, COLLECTION, docs)

    def documents(self, first: int, last: int) -> list[dict[str, Any]]:
        """The current documents with ``_id`` from *first* to *last*."""
        return [d for d in self.server.documents(DB, COLLECTION) if first <= d["_id"] <= last]

    def insert(self, doc: dict[str, Any], collection: str = COLLECTION) -> None:
        self.server.insert(DB, collection, doc)

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

    seeded_as = "inserted before the stream's first start"

    def seed(self, docs: list[dict[str, Any]]) -> None:
        if docs:
            self.orders.insert_many(docs)

    def documents(self, first: int, last: int) -> list[dict[str, Any]]:
        return list(self.orders.find({"_id": {"$gte": first, "$lte": last}}))

    def insert(self, doc: dict[str, Any], collection: str = COLLECTION) -> None:
        self.client[DB][collection].insert_one(doc)

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
        parser.add_argument("--orders", type=int, default=500, help="small orders to write")
        parser.add_argument(
            "--existing",
            type=int,
            default=3000,
            help="orders stored before the stream's first start (its initial sync copies them)",
        )
        parser.add_argument(
            "--serve",
            action="store_true",
            help="Leave one large order waiting, make demo logins and start the server.",
        )
        parser.add_argument(
            "--addrport",
            default="127.0.0.1:8000",
            metavar="[HOST:]PORT",
            help="Where --serve listens: [host:]port, e.g. 8001 or 127.0.0.1:8001 "
            "(default 127.0.0.1:8000; the host defaults to 127.0.0.1). The port must be "
            "free: it is checked before the story runs.",
        )

    def handle(
        self, *args: Any, orders: int, existing: int, serve: bool, addrport: str, **options: Any
    ) -> None:
        if orders < 0 or existing < 0:
            raise CommandError("--orders and --existing must be 0 or more")
        host, port = check_port(addrport) if serve else ("", 0)
        shop, first_id = self.open_shop()
        clients = {"default": {"URL": shop.uri, "OPTIONS": {"serverSelectionTimeoutMS": 5000}}}
        overrides = override_settings(FLOWWARDEN={**settings.FLOWWARDEN, "MONGO_CLIENTS": clients})
        try:
            with overrides:
                first_id = self.initial_sync_demo(shop, first_id, existing)
                large = self.stream_demo(shop, first_id, orders)
            self.approval_demo(large, leave_pending=serve)
            with overrides:
                invoiced = self.payment_demo(shop, large[-1] + 1)
            self.checkpoint_api_demo()
            call_command("flowwarden_checkpoints", "list", stdout=self.stdout)
            if serve:
                self.serve(shop, host, port, addrport, next_id=invoiced + 1)
            else:
                self.admin_instructions()
        finally:
            shop.close()

    # -- 1. the orders stream ------------------------------------------------------------

    def open_shop(self) -> tuple[ScriptedShop | MongoShop, int]:
        """The MongoDB to write orders to, and the first order id to write."""
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
            # A new scripted server has a new history: start the stream afresh (and
            # forget what the processes of an earlier demo reported and parked).
            for stream in (STREAM, PAYMENTS):
                checkpoint_stores["default"].delete(stream)
                StreamWorker.objects.filter(stream_name=stream).delete()
                DeadLetter.objects.filter(stream_name=stream).delete()
            Order.objects.all().delete()
            forget_order_runs()
            first_id = 1
        return shop, first_id

    def initial_sync_demo(self, shop: ScriptedShop | MongoShop, first_id: int, count: int) -> int:
        """Store *count* existing orders, then run the stream's first start: it copies
        them (an insert and an update are written during the copy) and streams the
        changes made since. Returns the next free order id."""
        if checkpoint_stores["default"].find(STREAM) is not None:
            # A real MongoDB the demo ran on before: the stream copied on its first start.
            self.run_burst("start: resumes after the saved position (it copied on its first start)")
            return first_id
        ids = range(first_id, first_id + count)
        shop.seed([existing_order(order_id) for order_id in ids])
        self.stdout.write(
            f"Pre-seeded {count:,} existing orders in {DB}.{COLLECTION} ({shop.seeded_as})"
        )
        inserted = first_id + count
        # An order of the copy's first batch: only its change event brings the update.
        writer = WritesDuringCopy(shop, inserted, ids[min(6, count - 1)] if count else None)
        metrics.initial_sync_progress.connect(writer, weak=False, dispatch_uid=WritesDuringCopy)
        try:
            consumer = self.run_burst("first start: copies the existing orders, then streams")
        finally:
            metrics.initial_sync_progress.disconnect(dispatch_uid=WritesDuringCopy)
        progress = checkpoint_stores["default"].find(STREAM).initial_sync or {}
        seconds = (
            datetime.fromisoformat(progress["finished_at"])
            - datetime.fromisoformat(progress["started_at"])
        ).total_seconds()
        size = stream_registry.get(STREAM).checkpoint.copy_batch_size
        self.stdout.write(
            f"  Initial sync: {counted(progress['copied'], 'document')} copied of "
            f"{progress['estimated']:,} estimated, in {seconds:.1f} s "
            f"({counted(writer.batches, 'batch')} of up to {size})"
        )
        if writer.wrote:
            read = " (the copy read it too)" if progress["copied"] > count else ""
            self.stdout.write(
                f"  During the copy, after its first batch, the demo inserted order "
                f"{inserted}{read} and updated order {writer.update_id} (already copied); "
                f"after the copy the stream delivered {consumer.events_handled} change "
                "events from the position it took before the copy"
            )
        last = inserted if writer.wrote else inserted - 1
        differ = mirror_differences(shop, first_id, last)
        same = count - len([order_id for order_id in differ if order_id in ids])
        self.stdout.write(
            f"  Order table: {Order.objects.count():,} orders; "
            + (
                f"the {count:,} pre-seeded orders equal their MongoDB documents ✓"
                if same == count
                else f"{same:,} of the {count:,} pre-seeded orders equal their MongoDB documents ✗"
            )
        )
        if writer.wrote:
            self.report_writes_during_copy(writer)
        runs = order_runs(first_id, list(ids)).count()
        self.stdout.write(
            f"  Workflow runs of the pre-seeded orders: {runs} (on_snapshot only mirrors "
            "orders that predate the app)"
            + (
                f"; order {inserted}, a new order, has its run: "
                f"{order_runs(first_id, [inserted]).count()}"
                if writer.wrote
                else ""
            )
        )
        if differ:
            more = "..." if len(differ) > 10 else ""
            raise CommandError(
                f"the Order table differs from MongoDB for orders {differ[:10]}{more}"
            )
        return last + 1

    def report_writes_during_copy(self, writer: WritesDuringCopy) -> None:
        inserted, updated = writer.insert["_id"], writer.update_id
        cents = writer.fields["total_cents"]
        row = Order.objects.filter(order_id=inserted).first()
        mirrored = list(
            Order.objects.filter(order_id=updated).values_list("total_cents", flat=True)
        )
        self.stdout.write(
            f"  order {inserted} inserted during the copy: "
            + ("in the mirror ✓" if row is not None else "not in the mirror ✗")
            + f"; order {updated} updated during the copy: "
            + (
                f"total_cents {cents:,} in the mirror ✓"
                if mirrored == [cents]
                else f"total_cents {cents:,} expected, the mirror has {mirrored} ✗"
            )
        )

    def stream_demo(self, shop: ScriptedShop | MongoShop, first_id: int, count: int) -> list[int]:
        """Write new orders and run the orders stream; the ids of the large orders."""
        ids = range(first_id, first_id + count)
        for order_id in ids:
            shop.insert(
                {
                    "_id": order_id,
                    "customer": f"c{order_id % 37}",
                    "status": "new",
                    "total_cents": 1_000 + (order_id * 3_700) % 90_000,
                }
            )
        large = list(range(first_id + count, first_id + count + len(LARGE_ORDERS)))
        for order_id, (cents, customer) in zip(large, LARGE_ORDERS, strict=True):
            shop.insert(
                {
                    "_id": order_id,
                    "customer": customer,
                    "status": "new",
                    "total_cents": cents,
                }
            )
        for order_id in ids[::5]:
            shop.update(order_id, {"status": "paid"})
        for order_id in ids[::50]:
            shop.delete(order_id)
        writes = len(ids) + len(large) + len(ids[::5]) + len(ids[::50])
        self.stdout.write(f"Wrote {writes} changes to {DB}.{COLLECTION} in MongoDB")
        handled = self.run_burst("second start: resumes after the saved position").events_handled
        new = Order.objects.filter(order_id__gte=first_id)
        self.stdout.write(
            f"  Order table: {Order.objects.count():,} orders; the new ones: {new.count()} "
            f"orders, {new.filter(status='paid').count()} paid"
        )
        self.report_runs(first_id)
        self.explain_counts(len(ids) + len(large), len(ids[::50]))
        runs_before = order_runs(first_id).count()
        again = self.run_burst("third start: resumes after the processed anchor").events_handled
        self.stdout.write(f"  re-processed {again} of the {handled} events")
        self.stdout.write(
            f"  workflow runs started by the restart: {order_runs(first_id).count() - runs_before}"
        )
        redelivered = start_for_order({"_id": large[0], "total_cents": 1})
        self.stdout.write(
            f"  the insert of order {large[0]} delivered again (as after a crash "
            f"before the checkpoint): {'started a run' if redelivered else 'no new run'}"
            f"; runs for it: {order_runs(first_id, [large[0]]).count()}"
        )
        return large

    def report_runs(self, first_id: int) -> None:
        runs = order_runs(first_id)
        by_status = {s: runs.filter(status=s).count() for s in ("completed", "waiting")}
        self.stdout.write(
            f"  Workflow {WORKFLOW!r}: {runs.count()} runs started (one per new order); "
            f"{by_status['completed']} completed without approval, "
            f"{by_status['waiting']} waiting for approval"
        )

    def explain_counts(self, inserted: int, deleted: int) -> None:
        self.stdout.write(
            f"  Why runs and orders differ: each of the {inserted} inserted orders started "
            f"one run (keyed by its order id); {deleted} of them "
            f"{'was' if deleted == 1 else 'were'} deleted afterwards, "
            "which removes the Order row but not its run. Updates and deletes start no run, "
            "and neither does an insert delivered again."
        )

    # -- 2. approvals --------------------------------------------------------------------

    def approval_demo(self, large: list[int], *, leave_pending: bool) -> None:
        approver = demo_approver()
        self.stdout.write(
            f"\nApprovals (deciding as {approver.username!r}, in {APPROVERS_GROUP!r}):"
        )
        decisions = [("approve", "Checked the customer's credit")]
        decisions.append(("leave", "") if leave_pending else ("reject", "Over budget"))
        for order_id, (verb, comment) in zip(large, decisions, strict=True):
            approval = pending_approval(order_id)
            self.stdout.write(f"  {approval.prompt}  (approval {approval.pk}, pending)")
            self.stdout.write(
                f"    its form: {approval.form.rsplit('.', 1)[-1]}; reminds every "
                f"{approval.remind_every}, escalates to {approval.escalate_to_group!r} at "
                f"{approval.escalate_at:%Y-%m-%d %H:%M} UTC"
            )
            if verb == "leave":
                self.stdout.write("    left pending for you: see below")
                continue
            payload = None
            if verb == "approve":
                payload = self.form_payload(approval, order_id, approver)
            decide = approve if verb == "approve" else reject
            result = decide(approval.pk, approver, comment=comment, payload=payload)
            run = WorkflowRun.objects.get(pk=approval.coordination_id)
            order = Order.objects.get(order_id=order_id)
            self.stdout.write(
                f"    {result.approval.status} by {approver.username}: run {run.status}, "
                f"order {order_id} approval={order.approval!r}"
            )
        approved = Approval.objects.filter(
            workflow_name=WORKFLOW, status=Approval.Status.APPROVED
        ).order_by("-decided_at")[0]
        self.print_chain(approved)

    def form_payload(self, approval: Approval, order_id: int, approver: Any) -> dict[str, str]:
        """The approval's form payload: first one over the order's total (the form
        refuses it, nothing is decided), then 80% of the order with a reason."""
        total = Order.objects.get(order_id=order_id).total_cents
        too_much = {"approved_amount": str(cents_to_amount(total + 100)), "reason": "other"}
        try:
            approve(approval.pk, approver, payload=too_much)
        except ApprovalFormError as exc:
            self.stdout.write(
                f"    approving {dollars(total + 100)}: refused by the form "
                f"({'; '.join(m for ms in exc.errors.values() for m in ms)})"
            )
        return {
            "approved_amount": str(cents_to_amount(total * 8 // 10)),
            "reason": "credit_checked",
        }

    def print_chain(self, approval: Approval) -> None:
        workflow = Workflow.for_coordination(approval.coordination_id)
        chain = workflow.history()
        seqs = {snapshot.id: snapshot.seq for snapshot in chain}
        self.stdout.write(
            f"\nRun {approval.coordination_id} ({WORKFLOW}): {workflow.status()}; "
            "its snapshot chain:"
        )
        for snapshot in chain:
            step_name = snapshot.metadata.get("workflow.lastStep") or "(seed)"
            parent = f"<- #{seqs[snapshot.parent_id]}" if snapshot.parent_id else "root"
            note = ""
            if snapshot.id == approval.snapshot_id:
                note = f"  [waited for approval {approval.pk}]"
            state = snapshot.state or {}
            summary = ", ".join(
                f"{key}={state[key]!r}"
                for key in (
                    "order_id",
                    "total_cents",
                    "review",
                    "outcome",
                    "decided_by",
                    "approved_cents",
                )
                if key in state
            )
            self.stdout.write(
                f"  #{snapshot.seq} {snapshot.id[:12]}  {step_name:<8} {parent:<6} {summary}{note}"
            )
        self.stdout.write(
            f"Decision: {approval.status} by {approval.decided_by} at "
            f"{approval.decided_at:%Y-%m-%d %H:%M:%S}, comment {approval.comment!r}, "
            f"payload {approval.payload!r}"
        )
        trail = "; ".join(f"{e.action} by {e.actor or 'system'}" for e in approval.events.all())
        self.stdout.write(f"Audit: {trail}\n")

    def run_burst(self, label: str, stream: str = STREAM, indent: str = "") -> StreamConsumer:
        manager = StreamManager()
        consumer: StreamConsumer = manager.start(stream, burst=True)
        manager.wait()
        # Ends the manager's supervisor too (it would go on publishing this process's
        # status of the stream, and reading the oplog window, after the burst).
        manager.stop_all()
        if consumer.state == StreamState.CRASHED:
            raise CommandError(f"the {stream} stream stopped: {consumer.last_error}")
        copied = consumer.documents_copied
        self.stdout.write(
            f"{indent}Stream {stream!r}, {label}: "
            + (f"{counted(copied, 'document')} copied, " if copied else "")
            + f"{consumer.events_handled} events handled"
        )
        return consumer

    # -- 3. payments ---------------------------------------------------------------------

    def payment_demo(self, shop: ScriptedShop | MongoShop, order_id: int) -> int:
        """Order *order_id*, on invoice terms, waits for its payment; a payment in
        ``shop.payments`` resumes it through the ``payments`` stream, once. Returns
        the order's id."""
        self.stdout.write(
            f"\nPayments (the {PAYMENTS!r} stream, transactional: a payment marks its order "
            "paid and resumes the order's run, in one transaction with its checkpoint):"
        )
        if checkpoint_stores["default"].find(PAYMENTS) is None:
            self.run_burst("first start: saves its position", PAYMENTS, "  ")
        order = {
            "_id": order_id,
            "customer": INVOICED_CUSTOMER,
            "status": "new",
            "total_cents": INVOICED_CENTS,
            "terms": "invoice",
        }
        shop.insert(order)
        self.run_burst("an order on invoice terms", STREAM, "  ")
        run = WorkflowRun.objects.get(idempotency_key=idempotency_key(order_id))
        self.stdout.write(
            f"  order {order_id} ({dollars(INVOICED_CENTS)}, invoice): run {run.status}, "
            f"for a message on {run.waiting_topic!r} (due in 14 days); "
            f"order payment={Order.objects.get(order_id=order_id).payment!r}"
        )
        payment = {"_id": f"pay-{order_id}", "order_id": order_id, "amount_cents": INVOICED_CENTS}
        shop.insert(payment, collection=PAYMENTS)
        self.run_burst(f"payment {payment['_id']} written to {DB}.{PAYMENTS}", PAYMENTS, "  ")
        run.refresh_from_db()
        paid = Order.objects.get(order_id=order_id)
        messages = WorkflowMessage.objects.filter(coordination_id=run.pk)
        final = Workflow.for_coordination(run.pk).current_result()
        outcome = getattr(final, "final_state", {}).get("payment")
        self.stdout.write(
            f"  order {order_id} payment={paid.payment!r} ({dollars(paid.paid_cents)}); "
            f"run {run.status} (payment={outcome!r}), "
            f"{counted(messages.filter(delivered_to__isnull=False).count(), 'message')} "
            "delivered"
        )
        record_payment(payment)
        self.stdout.write(
            "  the payment delivered again (as after a checkpoint reset): messages to the "
            f"run: {messages.count()} (its idempotency key is the payment's _id)"
        )
        return order_id

    # -- 4. the checkpoint API -----------------------------------------------------------

    def checkpoint_api_demo(self) -> None:
        store, now = checkpoint_stores["default"], timezone.now()
        certified = now - timedelta(hours=2)
        store.save_seen("inventory", resume_token(certified, 5), certified, certified)
        store.save_heartbeat("inventory", now - timedelta(minutes=5))
        self.stdout.write("\nCheckpoint API: 'inventory' is idle, its heartbeat 5 minutes old;")
        expired = now - timedelta(days=3)
        store.save_processed("refunds", resume_token(expired, 77), expired)
        dead = store.find("refunds").last_processed_token
        store.reset_after_history_lost("refunds", resume_token(now, 1), dead, now)
        self.stdout.write("'refunds' lost its history and was reset (the guarded reset).\n")

    def admin_instructions(self) -> None:
        password = demo_login("admin", superuser=True)
        python = python_hint()
        self.stdout.write(
            self.style.SUCCESS("\nSee them in the admin:")
            + f"\n  make serve   (that is: {python} manage.py runserver)"
            + "\n  http://127.0.0.1:8000/admin/flowwarden_django/streamcheckpoint/"
            + f"\n  log in as admin / {password}   (a new password each demo run)"
            + f"\n  or: {python} manage.py flowwarden_checkpoints show orders"
            + "\nand the workflow runs and approvals at /admin/flowwarden_django/workflowrun/ "
            + "and /admin/flowwarden_django/approval/;"
            + f"\n  make serve-demo   (that is: {python} manage.py demo --serve) leaves an "
            + "approval pending for you to decide in the approver's inbox (/approvals/), "
            + "and runs the stream live"
        )

    def serve(
        self, shop: ScriptedShop | MongoShop, host: str, port: int, addrport: str, next_id: int
    ) -> None:
        admin_password = demo_login("admin", superuser=True)
        approver_password = demo_login("approver")
        manager = StreamManager(source_factory=change_sources(shop.uri))
        manager.start(STREAM)
        feeder = OrderFeeder(shop, next_id)
        feeder.start()
        hold_until = datetime.fromtimestamp(feeder.hold_until, UTC)
        base = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
        self.stdout.write(
            serve_instructions(
                base,
                admin_password=admin_password,
                approver_password=approver_password,
                next_id=next_id,
                hold_until=hold_until,
                style=self.style,
            )
        )
        self.stdout.flush()
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            # No autoreloader: it would serve from a child process, without the stream.
            call_command("runserver", addrport, use_reloader=False)
        finally:
            signal.signal(signal.SIGTERM, previous)
            feeder.stop()
            manager.stop_all(timeout=10)


def serve_instructions(
    base: str,
    *,
    admin_password: str,
    approver_password: str,
    next_id: int,
    hold_until: datetime,
    style: Any,
) -> str:
    """What ``--serve`` prints before the server starts: where to click, as whom."""
    admin = f"{base}/admin/flowwarden_django"
    return (
        style.SUCCESS("\nThe site is starting. Click through the story:")
        + f"\n  {base}/approvals/   the approver's inbox: the pending approval, to decide"
        + f"\n  {admin}/approval/   the approvals in the admin, with their audit trail"
        + f"\n  {admin}/workflowrun/   runs and snapshot trees"
        + f"\n  {admin}/streamworker/   the Streams console: 'orders' runs in this "
        + "process, on the scripted replica set"
        + f"\n  {admin}/deadletter/   dead letters to replay or discard"
        + f"\n  {base}/flowwarden/health/   the health check"
        + f"\n  {base}/api/v1/approvals/mine/   the API (session or token auth)"
        + f"\n  {base}/api/v1/schema/   its OpenAPI schema"
        + f"\n  log in as approver / {approver_password}  (at /approvals/: not staff, "
        + "decides the approvals of the approvers group in the inbox and the API)"
        + f"\n  or as admin / {admin_password}  (superuser: the admin, the Streams "
        + "console, the dead letters)"
        + f"\nA new order arrives every {FEED_INTERVAL:g} s from order {next_id + 2} on "
        + f"(every {LARGE_EVERY}th waits for approval). Orders {next_id} and {next_id + 1} "
        + "were refused by the handler and parked as dead letters:"
        + f"\n  order {next_id} has a negative amount: discard it"
        + f"\n  order {next_id + 1} is on hold until {hold_until:%H:%M:%S} UTC: replay it "
        + "after that and it goes through"
        + "\n  (new passwords each run; Ctrl-C stops the server)\n"
    )


def counted(number: int, noun: str) -> str:
    """``"1 batch"``, ``"3,001 documents"``."""
    plural = noun if number == 1 else noun + ("es" if noun.endswith("ch") else "s")
    return f"{number:,} {plural}"


def existing_order(order_id: int) -> dict[str, Any]:
    """An order taken before the app: delivered, shipped or cancelled; some large."""
    return {
        "_id": order_id,
        "customer": f"c{order_id % 41}",
        "status": ("delivered", "delivered", "shipped", "cancelled")[order_id % 4],
        "total_cents": 500 + (order_id * 7_919) % 150_000,
    }


class WritesDuringCopy:
    """An ``initial_sync_progress`` receiver: once the first batch of the ``orders`` stream's
    initial sync is committed (the copy goes on), it inserts order *inserted* and
    updates order *update_id* (one that batch copied) in MongoDB. It runs on the
    stream's thread, between two batches, and counts the committed batches."""

    def __init__(
        self, shop: ScriptedShop | MongoShop, inserted: int, update_id: int | None
    ) -> None:
        self.shop = shop
        self.insert = {"_id": inserted, "customer": "c7", "status": "new", "total_cents": 4_200}
        self.update_id = update_id
        self.fields = {"total_cents": existing_order(update_id or 0)["total_cents"] + 10_000}
        #: Whether it wrote; the batches committed so far.
        self.wrote = False
        self.batches = 0

    def __call__(self, sender: Any, **kwargs: Any) -> None:
        if sender != STREAM:
            return
        self.batches += 1
        if not self.wrote and self.update_id is not None:
            self.shop.insert(self.insert)
            self.shop.update(self.update_id, self.fields)
            self.wrote = True


def mirror_fields(doc: dict[str, Any]) -> tuple[str, str, int]:
    """What the ``Order`` row keeps of a document (the handler's defaults included)."""
    return doc.get("customer", ""), doc.get("status", "new"), doc.get("total_cents", 0)


def mirror_differences(shop: ScriptedShop | MongoShop, first: int, last: int) -> list[int]:
    """The order ids from *first* to *last* whose ``Order`` row is missing, extra or
    not equal to its MongoDB document."""
    documents = {doc["_id"]: mirror_fields(doc) for doc in shop.documents(first, last)}
    rows = {
        order_id: (customer, status, cents)
        for order_id, customer, status, cents in Order.objects.filter(
            order_id__range=(first, last)
        ).values_list("order_id", "customer", "status", "total_cents")
    }
    return sorted(
        order_id
        for order_id in documents.keys() | rows.keys()
        if documents.get(order_id) != rows.get(order_id)
    )


#: ``--serve``: every this many orders of the feeder is large (waits for an approver).
LARGE_EVERY = 10


class OrderFeeder:
    """Writes an order every ``FEED_INTERVAL`` seconds into the demo's MongoDB, after
    two the handler refuses (a negative amount; an order on hold for ``HOLD_SECONDS``)."""

    def __init__(self, shop: ScriptedShop | MongoShop, next_id: int) -> None:
        self.shop = shop
        self.next_id = next_id
        self.hold_until = int(time.time()) + HOLD_SECONDS
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-order-feeder", daemon=True)

    def start(self) -> None:
        self.shop.insert(self._order(total_cents=-1_500, customer="initech"))
        self.shop.insert(self._order(total_cents=4_200, customer="hooli", hold=True))
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(FEED_INTERVAL + 1)

    def _order(self, *, total_cents: int, customer: str, hold: bool = False) -> dict[str, Any]:
        order = {
            "_id": self.next_id,
            "customer": customer,
            "status": "new",
            "total_cents": total_cents,
        }
        if hold:
            order["hold_until"] = self.hold_until
        self.next_id += 1
        return order

    def _run(self) -> None:
        fed = 0
        while not self._stop.wait(FEED_INTERVAL):
            fed += 1
            order_id = self.next_id
            large = fed % LARGE_EVERY == 0
            cents = 120_000 + order_id * 100 if large else 1_000 + (order_id * 3_700) % 90_000
            try:
                self.shop.insert(self._order(total_cents=cents, customer=f"c{order_id % 37}"))
            except Exception as exc:  # the server is going away: stop feeding
                print(f"demo: the order feeder stopped: {exc}", file=sys.stderr)
                return


def change_sources(uri: str) -> Callable[[StreamSpec], ChangeSource]:
    """A ``StreamManager`` source factory reading the demo's MongoDB at *uri* (the
    settings' ``MONGO_CLIENTS`` still name the configured server)."""
    from pymongo import MongoClient

    client = MongoClient(uri, serverSelectionTimeoutMS=5000)

    def source(spec: StreamSpec) -> ChangeSource:
        return PymongoChangeSource(
            client,
            spec.database,
            spec.collection,
            stream_name=spec.name,
            pipeline=list(spec.pipeline()) if spec.pipeline is not None else [],
            full_document=spec.full_document,
            full_document_before_change=spec.full_document_before_change,
            max_await_ms=max_await_ms(fw_settings.STREAM_MAX_AWAIT_MS),
        )

    return source


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM stops the server like Ctrl-C, so the stream stops gracefully."""
    raise KeyboardInterrupt


def check_port(addrport: str) -> tuple[str, int]:
    """``(host, port)`` of ``[host:]port``, once the port is known to be free."""
    match = re.fullmatch(r"(?:(?P<host>\[[0-9a-fA-F:.]+\]|[^:\[\]]+):)?(?P<port>\d{1,5})", addrport)
    if match is None:
        raise CommandError(
            f"--addrport {addrport!r} is not [host:]port (e.g. 8001 or 127.0.0.1:8001)"
        )
    host, port = (match["host"] or "127.0.0.1").strip("[]"), int(match["port"])
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # As the development server does: a port in TIME_WAIT counts as free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise CommandError(
                f"cannot serve on {host}:{port}: {exc.strerror or exc}. Is another server "
                f"running there? Choose another port with --addrport, e.g. "
                f"--addrport {host}:{port + 1 if port < 65535 else 8001}"
            ) from None
    return host, port


def python_hint() -> str:
    """This Python as a command to type: relative when inside the current directory
    (``.venv/bin/python``), else absolute."""
    executable = Path(sys.executable)
    try:
        return str(executable.relative_to(Path.cwd()))
    except ValueError:
        return str(executable)


def order_runs(first_id: int, order_ids: list[int] | None = None) -> Any:
    """This demo's order-approval runs (orders from *first_id* on)."""
    runs = WorkflowRun.objects.filter(workflow_name=WORKFLOW)
    if order_ids is None:
        return runs.filter(idempotency_key__in=_keys_from(first_id))
    return runs.filter(idempotency_key__in=[f"shop.orders:{i}" for i in order_ids])


def _keys_from(first_id: int) -> Any:
    last = Order.objects.order_by("-order_id").values_list("order_id", flat=True).first() or 0
    # Deleted orders keep their runs: count by key over the whole id range.
    return [f"shop.orders:{i}" for i in range(first_id, max(last, first_id) + 1)]


def forget_order_runs() -> None:
    """Delete the order-approval and reminder runs, snapshots and approvals of an
    earlier demo (a new scripted server starts order ids from 1 again)."""
    runs = WorkflowRun.objects.filter(workflow_name__in=[WORKFLOW, LEGACY_REMINDER])
    coordinations = list(runs.values_list("coordination_id", flat=True))
    SnapshotRecord.objects.filter(coordination_id__in=coordinations).delete()
    WorkflowMessage.objects.filter(coordination_id__in=coordinations).delete()
    Approval.objects.filter(coordination_id__in=coordinations).delete()
    runs.delete()


def pending_approval(order_id: int) -> Approval:
    run = WorkflowRun.objects.get(idempotency_key=f"shop.orders:{order_id}")
    try:
        return Approval.objects.get(coordination_id=run.pk, status=Approval.Status.PENDING)
    except Approval.DoesNotExist:
        raise CommandError(
            f"order {order_id} has no pending approval; its run is {run.status}"
        ) from None


def demo_approver() -> Any:
    """The ``approver`` user, in the approvers group (it decides the demo's approvals);
    the ``managers`` group, which a large order's approval escalates to, exists too."""
    Group.objects.get_or_create(name=MANAGERS_GROUP)
    group, _ = Group.objects.get_or_create(name=APPROVERS_GROUP)
    user, _ = get_user_model().objects.get_or_create(username="approver")
    user.groups.add(group)
    return user


def demo_login(username: str, *, superuser: bool = False) -> str:
    """Give *username* a new random password; return the password. A *superuser* is
    staff (the admin); the ``approver`` is not: approvers need no staff status, and
    it decides in the inbox (``/approvals/``) as a member of the approvers group."""
    password = secrets.token_urlsafe(9)
    user = demo_approver() if username == "approver" else None
    if user is None:
        user, _ = get_user_model().objects.get_or_create(username=username)
    user.is_staff = superuser
    user.is_superuser = superuser
    user.set_password(password)
    user.save()
    if not superuser:
        # An earlier demo made the approver staff with admin permissions: take them back.
        user.user_permissions.clear()
    return password
