"""The stream of ``bench/parallel_streams.py``'s Celery lane, as its worker declares it
(``CELERY_IMPORTS`` of ``bench.providers_settings``): each event's handler waits
``FLOWWARDEN_BENCH_SLEEP_MS`` milliseconds, as one doing I/O does. The benchmark's
process reads the change stream with a spec of the same name and sends each event to
this worker (``execution="celery"``)."""

import os
import time

from flowwarden_django.streams.registry import change_stream

STREAM_NAME = "bench.parallel_streams"
WAIT = float(os.environ.get("FLOWWARDEN_BENCH_SLEEP_MS", "5")) / 1000


@change_stream(name=STREAM_NAME, database="app", collection="orders", execution="celery")
class BenchOrders:
    """Waits, then returns."""

    def on_insert(self, doc):
        if WAIT:
            time.sleep(WAIT)
