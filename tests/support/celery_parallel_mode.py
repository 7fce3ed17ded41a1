"""The constants of ``tests/support/celery_parallel_streams.py``'s stream, shared with its test
without importing the declaration (the test process's stream registry stays clean)."""

STREAM_NAME = "celery-parallel-orders"
KEYS = 4
HANDLER_SECONDS = 0.03


def order_key(event):
    """The orders' key: ``seq % KEYS``."""
    return event["fullDocument"]["seq"] % KEYS


#: The stream whose event ``POISON_SEQ`` always fails: retried in the worker, then
#: parked in the dead-letter queue (``tests/support/celery_parallel_streams.py``).
POISON_STREAM = "celery-parallel-poison"
POISON_SEQ = 3
POISON_ATTEMPTS = 3
POISON_RETRY_DELAY = "700ms"


def poison_key(event):
    """The poison stream's key: ``seq % 2``."""
    return event["fullDocument"]["seq"] % 2


#: The stream whose order ``HELD_SEQ`` is held by its first attempt for
#: ``FLOWWARDEN_TEST_HELD_SECONDS`` (the worker's environment): what a worker killed,
#: or a long event, holds (``tests/integrations/test_celery_redelivery.py``).
HELD_STREAM = "celery-held-orders"
HELD_SEQ = 1
HELD_KEYS = 2


def held_key(event):
    """The held stream's key: ``seq % HELD_KEYS``."""
    return event["fullDocument"]["seq"] % HELD_KEYS
