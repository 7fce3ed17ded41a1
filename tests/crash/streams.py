"""The stream the crash test's consumer runs: ``crash-orders`` on ``app.orders``.

Every delivery of an insert writes one ``Effect`` row. The mode comes from the
environment (see ``settings.py``):

* ``count`` (default): non-transactional, the processed anchor is written every
  ``FLOWWARDEN_CRASH_SAVE_EVERY_N`` settled events and never by age. Each row is
  autocommitted on its own, so a re-delivered event leaves a second row.
* ``transactional``: the row and the processed anchor are written in one
  transaction on the ``default`` database (the ORM store is on it too).
* ``leader``: transactional and ``SINGLE_LEADER`` (the ORM lease is on the same
  database, so each anchor write is fenced inside that transaction); each row
  records which instance handled the event (``Effect.stream``).
* ``parallel``: ``count`` with ``parallelism=PARALLELISM`` and the orders keyed by
  ``seq % KEYS`` (each row records its key in ``Effect.stream``); the anchor is the
  window's low watermark.
* ``parallel-transactional``: ``parallel`` and transactional: each row commits with
  its event's settled mark.
"""

import os

from flowwarden_django.streams.registry import change_stream, checkpoint
from tests.crash.parallel_mode import KEYS, PARALLELISM, order_key
from tests.testapp.models import Effect

STREAM_NAME = "crash-orders"
MODE = os.environ.get("FLOWWARDEN_CRASH_MODE", "count")
SAVE_EVERY_N = int(os.environ.get("FLOWWARDEN_CRASH_SAVE_EVERY_N", "50"))

MODES = ("count", "transactional", "leader", "parallel", "parallel-transactional")
if MODE not in MODES:
    raise ValueError(f"FLOWWARDEN_CRASH_MODE must be one of {', '.join(MODES)}, not {MODE!r}")
#: What each row records: the instance in leader mode, else the stream.
HANDLER_LABEL = (
    os.environ.get("FLOWWARDEN_CRASH_INSTANCE", STREAM_NAME) if MODE == "leader" else STREAM_NAME
)
TRANSACTIONAL = MODE in ("transactional", "leader", "parallel-transactional")
LEADER = MODE == "leader"
PARALLEL = MODE.startswith("parallel")


@change_stream(
    name=STREAM_NAME,
    database="app",
    collection="orders",
    transactional=TRANSACTIONAL,
    deployment_mode="SINGLE_LEADER" if LEADER else "ALL_INSTANCES",
    parallelism=PARALLELISM if PARALLEL else 1,
    key=order_key if PARALLEL else None,
)
@checkpoint(
    # A transactional stream writes every anchor with its event (save_every_n is moot),
    # unless it is handled in parallel (its anchor is the window's watermark).
    save_every_n=1 if TRANSACTIONAL and not PARALLEL else SAVE_EVERY_N,
    # Only the count policy writes: the bound under test is exactly save_every_n.
    save_interval_seconds=0,
)
class CrashOrders:
    """One ``Effect`` row per delivered insert."""

    def on_insert(self, doc):
        label = f"key-{doc['seq'] % KEYS}" if PARALLEL else HANDLER_LABEL
        Effect.objects.create(order_id=doc["seq"], stream=label)
