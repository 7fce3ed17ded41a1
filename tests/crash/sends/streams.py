"""``crash-sends``: a transactional stream on ``app.orders`` whose handler sends one
message per insert ``{_id: n, seq: n}`` to run ``coordination_id(n)``, without an
idempotency key: the message is exactly once because it commits with the stream's
processed anchor (or, in parallel, its settled mark), in one transaction on the
``default`` database that holds the runs too.

``FLOWWARDEN_CRASH_MODE``: ``serial`` (one event at a time, every anchor written in
its event's transaction) or ``parallel`` (``PARALLELISM`` handler calls at once, the
orders keyed by ``seq % KEYS``, the anchor the window's watermark every 25 events).

``FLOWWARDEN_CRASH_GATES`` (``"37,151"``): after sending for one of these orders the
handler takes the advisory lock ``(GATE_LOCK, seq)`` in its transaction, which the
test holds: the consumer is then killed with the message sent and not committed.
"""

import os

from django.db import connection

from flowwarden_django.streams.registry import change_stream, checkpoint
from flowwarden_django.workflows import Workflow
from tests.crash.sends import (
    GATE_LOCK,
    KEYS,
    PARALLELISM,
    SENDER,
    STREAM,
    TOPIC,
    coordination_id,
)

MODE = os.environ.get("FLOWWARDEN_CRASH_MODE", "serial")
if MODE not in ("serial", "parallel"):
    raise ValueError(f"FLOWWARDEN_CRASH_MODE must be serial or parallel, not {MODE!r}")
PARALLEL = MODE == "parallel"
GATES = {int(seq) for seq in os.environ.get("FLOWWARDEN_CRASH_GATES", "").split(",") if seq}


def order_key(event):
    """The ordering key of an order event (``parallel``)."""
    return event["fullDocument"]["seq"] % KEYS


@change_stream(
    name=STREAM,
    database="app",
    collection="orders",
    transactional=True,
    parallelism=PARALLELISM if PARALLEL else 1,
    key=order_key if PARALLEL else None,
)
@checkpoint(save_every_n=25 if PARALLEL else 1, save_interval_seconds=0)
class PaidOrders:
    """One message per order, to the order's waiting run."""

    def on_insert(self, doc):
        seq = doc["seq"]
        Workflow.for_coordination(coordination_id(seq)).send(TOPIC, {"seq": seq}, sender=SENDER)
        if seq in GATES:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [GATE_LOCK, seq])
