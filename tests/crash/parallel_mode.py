"""The ``parallel`` mode of the crash test's stream (``streams.py``), shared with the
test (``tests/streams/test_crash.py``) without importing the stream's declaration."""

#: Handler calls at once.
PARALLELISM = 8
#: The orders are keyed by ``seq % KEYS``; each row records its key as ``key-<n>``.
KEYS = 16
#: The stream's window: the default, 4 events per handler slot.
WINDOW = 4 * PARALLELISM


def order_key(event):
    """The ordering key of an order event."""
    return event["fullDocument"]["seq"] % KEYS
