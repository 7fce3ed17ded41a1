"""Streams with ``execution="celery"``: each event a Celery task, the window kept by
the process that reads the change stream (see ``streams.remote_events``).

The window's handler slots (threads of the threaded runtime, the pool of the
asyncio one) do not run handlers: each sends its event as the task
``flowwarden_django.handle_stream_event`` and waits for the worker's answer on the
result backend. The task is ``acks_late`` and ``reject_on_worker_lost``: a worker
killed during an event leaves its message to be delivered again, and the slot keeps
waiting for the same task's answer, so the key's next event is still not sent. A
child killed after storing its answer but before the acknowledgement leaves a
redelivery that finds that answer and returns it without running the handler again
(the key's next event may already be running).

A worker lost with the message in hand (killed between taking and acknowledging it)
leaves it with kombu's Redis transport, which delivers it again once its
``visibility_timeout`` has passed: ``FLOWWARDEN["CELERY_VISIBILITY_TIMEOUT"]`` (10 s),
renewed by the living workers for the messages they hold (``visibility``). The slot
keeps waiting for the same task's answer meanwhile.

An answer that does not come within ``FLOWWARDEN["STREAM_EVENT_TIMEOUT"]`` (10 min;
a message the broker lost, such as one a worker killed took off the queue but had not
yet recorded as unacknowledged) ends the generation like a failed event: the stream
restarts from its anchor and sends the event again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from ...common.durations import parse_duration
from ...conf import fw_settings
from ...streams.remote_events import HANDLED, SKIPPED, RemoteEventError, encode_event

EVENT_TASK = "flowwarden_django.handle_stream_event"
#: Seconds between two looks at a stop while a slot waits.
WAIT_TICK = 0.5
#: The task's state on the result backend once an attempt at its event failed (its
#: retries run in the worker): the waiting slot shows the event's key parked.
FAILING = "FW_FAILING"


def run_on_celery(
    stream_name: str,
    event: Mapping[str, Any],
    event_id: str | None,
    stopping: Callable[[], bool],
    *,
    failing: Callable[[], None] | None = None,
    app: Any = None,
) -> bool | None:
    """Send *event* to a worker and wait for its answer: ``True`` handled, ``False``
    skipped or parked, ``None`` when a stop came first (the event stays unsettled:
    the next run sends it again). Raises ``RemoteEventError`` when the worker could
    not settle it or did not answer within :func:`event_timeout`. *failing* is called
    once the worker says an attempt failed (looked at every ``WAIT_TICK`` while the
    slot waits)."""
    from celery import current_app
    from celery.exceptions import TimeoutError as ResultTimeout

    publisher = app if app is not None else current_app._get_current_object()
    result = publisher.send_task(EVENT_TASK, args=[stream_name, encode_event(event), event_id])
    timeout = event_timeout()
    deadline = time.monotonic() + timeout
    # The answer is not forgotten here: a redelivery of the same task finds it
    # (``handle_stream_event``); the backend expires it (``result_expires``).
    while True:
        try:
            answer = result.get(timeout=WAIT_TICK, propagate=True, disable_sync_subtasks=False)
        except ResultTimeout:
            if stopping():
                return None
            if failing is not None and _says_failing(result):
                failing()
                failing = None
            if time.monotonic() > deadline:
                raise RemoteEventError(
                    f"stream {stream_name!r}: no answer from a Celery worker within "
                    f"{timeout:g} s (task {result.id})"
                ) from None
            continue
        except RemoteEventError:
            raise
        except Exception as exc:  # the worker's error, re-raised by the backend
            raise RemoteEventError(f"stream {stream_name!r}: {exc}") from exc
        break
    if answer not in (HANDLED, SKIPPED):
        raise RemoteEventError(f"stream {stream_name!r}: unexpected answer {answer!r}")
    return answer == HANDLED


def event_timeout() -> float:
    """Seconds a slot waits for a worker's answer before the stream restarts:
    ``FLOWWARDEN["STREAM_EVENT_TIMEOUT"]``."""
    return parse_duration(fw_settings.STREAM_EVENT_TIMEOUT)


def _says_failing(result: Any) -> bool:
    """Whether the worker said an attempt at *result*'s event failed; a backend that
    does not answer this look says nothing (the next look, or the answer, will)."""
    try:
        return result.state == FAILING
    except Exception:
        return False
