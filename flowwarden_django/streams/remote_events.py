"""One change event handled in another process: ``execution="celery"``.

A stream declared with ``execution="celery"`` (and ``parallelism`` N) reads its
change stream in its own process, as every stream does, and keeps the window there
(per-key order, the low-watermark anchor, backpressure: ``core.window``); each event
the window lets run is sent to a Celery worker instead of a local thread
(``integrations.celery.stream_events``). The worker runs the event's whole path
(``runtime.remote_runner.handle_remote_event``): the filter, the handler, its retries, the
``on_error`` handlers and the dead-letter queue, exactly as the consumer would (the
consumer's own code, with no change stream). The consumer moves the anchor once the
worker's answer arrives, and only then sends the key's next event.

Events travel as BSON (``encode_event``), so ObjectIds, timestamps and binary
values reach the handler as they left the change stream.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

#: What a worker answers for an event that it settled.
HANDLED = "handled"
SKIPPED = "skipped"

#: ``execution`` values and the function that runs one event there:
#: ``(stream name, event, event id, stopping, *, failing) -> True | False | None``
#: (``failing()``: an attempt failed in the worker; the key shows as parked).
EXECUTORS = {
    "celery": "flowwarden_django.integrations.celery.stream_events.run_on_celery",
}
#: Every ``execution`` a stream may declare ("inline": the consumer's own threads).
EXECUTIONS = ("inline", *EXECUTORS)


def remote_executor(execution: str) -> Any:
    """The function that runs one event under *execution* (``EXECUTORS``)."""
    from django.utils.module_loading import import_string

    return import_string(EXECUTORS[execution])


class RemoteEventError(RuntimeError):
    """A worker could not settle the event (no DLQ to park it, a DLQ write or the
    filter failed, or the worker stopped during a retry's backoff): it stays
    unsettled, so the stream restarts and delivers it again."""


def encode_event(event: Mapping[str, Any]) -> str:
    """*event* as text a task message carries (base64 of its BSON)."""
    import bson

    return base64.b64encode(bson.encode(event)).decode("ascii")


def decode_event(payload: str) -> dict[str, Any]:
    """The event :func:`encode_event` made *payload* of."""
    import bson

    return bson.decode(base64.b64decode(payload))
