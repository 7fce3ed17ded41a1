"""The stream the crash test's consumer runs: ``crash-orders`` on ``app.orders``.

Every delivery of an insert writes one ``Effect`` row. The mode comes from the
environment (see ``settings.py``):

* ``count`` (default): non-transactional, the processed anchor is written every
  ``FLOWWARDEN_CRASH_SAVE_EVERY_N`` settled events and never by age. Each row is
  autocommitted on its own, so a re-delivered event leaves a second row.
* ``transactional``: the row and the processed anchor are written in one
  transaction on the ``default`` database (the ORM store is on it too).
"""

import os

from flowwarden_django.streams.registry import change_stream, checkpoint
from tests.testapp.models import Effect

STREAM_NAME = "crash-orders"
MODE = os.environ.get("FLOWWARDEN_CRASH_MODE", "count")
SAVE_EVERY_N = int(os.environ.get("FLOWWARDEN_CRASH_SAVE_EVERY_N", "50"))

if MODE not in ("count", "transactional"):
    raise ValueError(f"FLOWWARDEN_CRASH_MODE must be 'count' or 'transactional', not {MODE!r}")
TRANSACTIONAL = MODE == "transactional"


@change_stream(name=STREAM_NAME, database="app", collection="orders", transactional=TRANSACTIONAL)
@checkpoint(
    # A transactional stream writes every anchor with its event (save_every_n is moot).
    save_every_n=1 if TRANSACTIONAL else SAVE_EVERY_N,
    # Only the count policy writes: the bound under test is exactly save_every_n.
    save_interval_seconds=0,
)
class CrashOrders:
    """One ``Effect`` row per delivered insert."""

    def on_insert(self, doc):
        Effect.objects.create(order_id=doc["seq"], stream=STREAM_NAME)
