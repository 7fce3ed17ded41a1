"""The stream the Celery worker runs in ``tests/integrations/test_celery_worker.py``.

The worker imports this module through ``CELERY_IMPORTS`` (``tests.support.celery_settings``).
Every delivered insert writes one ``Effect`` row. The processed anchor is written
at the 1000th settled event and never by age, so with fewer events only the
graceful stop's flush can write it.
"""

from flowwarden_django.streams.registry import change_stream, checkpoint
from tests.testapp.models import Effect

STREAM_NAME = "celery-orders"


@change_stream(name=STREAM_NAME, database="app", collection="orders")
@checkpoint(save_every_n=1000, save_interval_seconds=0)
class CeleryOrders:
    """One ``Effect`` row per delivered insert."""

    def on_insert(self, doc):
        Effect.objects.create(order_id=doc["seq"], stream=STREAM_NAME)
