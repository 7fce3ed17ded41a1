"""The stream whose events the Celery worker of
``tests/integrations/test_celery_parallel_streams.py`` handles (``execution="celery"``).

The worker imports this module through ``CELERY_IMPORTS``
(``tests.support.celery_workflow_settings``); the test's own process reads the change stream
with a spec of the same name and never imports this module (its registry stays
clean). Each event takes ``HANDLER_SECONDS`` and writes one ``Effect`` row labelled
with its key and the process that handled it. The held stream's first delivery of one
order waits (``tests/integrations/test_celery_redelivery.py``).
"""

import os
import time

from flowwarden_django.streams import change_stream, dead_letter_queue, retry_policy
from tests.support.celery_parallel_mode import (
    HANDLER_SECONDS,
    HELD_SEQ,
    HELD_STREAM,
    KEYS,
    POISON_ATTEMPTS,
    POISON_RETRY_DELAY,
    POISON_SEQ,
    POISON_STREAM,
    STREAM_NAME,
    held_key,
    order_key,
    poison_key,
)
from tests.testapp.models import Effect


@change_stream(
    name=STREAM_NAME,
    database="app",
    collection="orders",
    parallelism=8,
    key=order_key,
    execution="celery",
)
class CeleryParallelOrders:
    """One ``Effect`` row per delivery: ``stream`` is ``key-<k>:<pid>``."""

    def on_insert(self, doc):
        time.sleep(HANDLER_SECONDS)
        Effect.objects.create(order_id=doc["seq"], stream=f"key-{doc['seq'] % KEYS}:{os.getpid()}")


@change_stream(
    name=POISON_STREAM,
    database="app",
    collection="orders",
    parallelism=4,
    key=poison_key,
    execution="celery",
)
@retry_policy(max_attempts=POISON_ATTEMPTS, initial_delay=POISON_RETRY_DELAY, jitter=False)
@dead_letter_queue()
class CeleryPoisonOrders:
    """Order ``POISON_SEQ`` always fails; the others write an ``Effect`` row."""

    def on_insert(self, doc):
        if doc["seq"] == POISON_SEQ:
            raise ConnectionError("poison")
        Effect.objects.create(order_id=doc["seq"], stream=POISON_STREAM)


@change_stream(
    name=HELD_STREAM,
    database="app",
    collection="orders",
    parallelism=4,
    key=held_key,
    execution="celery",
)
class CeleryHeldOrders:
    """Two ``Effect`` rows per delivery, ``began:<pid>`` and ``done:<pid>`` (in
    ``stream``); the first delivery of order ``HELD_SEQ`` waits
    ``FLOWWARDEN_TEST_HELD_SECONDS`` between them."""

    def on_insert(self, doc):
        seq, pid = doc["seq"], os.getpid()
        rows = Effect.objects.filter(order_id=seq, stream__startswith=f"{HELD_STREAM}:began")
        first = not rows.exists()
        Effect.objects.create(order_id=seq, stream=f"{HELD_STREAM}:began:{pid}")
        if seq == HELD_SEQ and first:
            time.sleep(float(os.environ.get("FLOWWARDEN_TEST_HELD_SECONDS", "0")))
        Effect.objects.create(order_id=seq, stream=f"{HELD_STREAM}:done:{pid}")
