"""The constants of ``tests/celery_parallel_streams.py``'s stream, shared with its test
without importing the declaration (the test process's stream registry stays clean)."""

STREAM_NAME = "celery-parallel-orders"
KEYS = 4
HANDLER_SECONDS = 0.03


def order_key(event):
    """The orders' key: ``seq % KEYS``."""
    return event["fullDocument"]["seq"] % KEYS
