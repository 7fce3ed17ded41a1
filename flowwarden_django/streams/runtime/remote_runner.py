"""The worker's side of ``execution="celery"``: one change event handled with the
consumer's own event path (see ``streams.remote_events``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from ..remote_events import HANDLED, SKIPPED, RemoteEventError, decode_event
from ..spec import StreamSpec
from .parallel import WindowedAnchors
from .settled_marks import SettledMarks
from .threaded import StreamConsumer

logger = logging.getLogger("flowwarden_django.streams")


def handle_remote_event(
    stream_name: str,
    payload: str,
    event_id: str | None = None,
    on_failing: Callable[[], None] | None = None,
) -> str:
    """Handle one event of stream *stream_name* in this process (a Celery worker):
    ``HANDLED`` or ``SKIPPED`` (skipped by ``on_error``, or parked in the DLQ), once
    settled; ``RemoteEventError`` when it could not be. *on_failing* is called once,
    when an attempt first fails (the reader shows the event's key parked)."""
    from ..registry import stream_registry

    spec = stream_registry.get(stream_name)
    event = decode_event(payload)
    return EventRunner(spec, on_failing).run(event, event_id)


class EventRunner:
    """Runs single events of one stream with the consumer's event path (see the
    module): a ``StreamConsumer`` that never opens its change stream."""

    def __init__(self, spec: StreamSpec, on_failing: Callable[[], None] | None = None) -> None:
        from ..stores import checkpoint_stores

        self.spec = spec
        store = checkpoint_stores[spec.checkpoint_store]
        self.consumer = StreamConsumer(spec, store, _no_change_stream)
        self.marks = (
            SettledMarks(self.consumer.store.inner, spec.name, found=set())
            if spec.transactional
            else None
        )
        # Settlements go nowhere but a transactional event's mark: the anchor is
        # the reading process's.
        self.consumer.policy = WindowedAnchors(_NoAnchor(), self.marks)
        if on_failing is not None:
            self.consumer.attempt_failed = _once(on_failing)  # type: ignore[method-assign]

    def run(self, event: Mapping[str, Any], event_id: str | None = None) -> str:
        """Handle *event*; what :func:`handle_remote_event` returns."""
        if self.marks is not None and self.marks.committed(event["_id"]):
            return HANDLED  # a redelivered task whose transaction had committed
        consumer = self.consumer
        try:
            outcome = consumer._handle(event, event.get("operationType", ""), event_id)
        except Exception as exc:
            raise RemoteEventError(f"stream {self.spec.name!r}: {exc}") from exc
        if outcome is None:
            raise RemoteEventError(
                f"stream {self.spec.name!r}: the worker stopped before the event settled"
            )
        return HANDLED if outcome else SKIPPED


def _once(call: Callable[[], None]) -> Callable[[], None]:
    """*call*, made on the first call only; it only tells operators, so its own
    failure (a result backend that did not answer) is logged, never the event's."""
    called = False

    def first() -> None:
        nonlocal called
        if called:
            return
        called = True
        try:
            call()
        except Exception:
            logger.warning("could not report a failing event to the reading process", exc_info=True)

    return first


class _NoAnchor:
    """The anchor policy of a worker: it writes no anchor."""

    confirmed_token = None

    def flush(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"a worker handling single events has no anchor ({name})")


def _no_change_stream(spec: StreamSpec) -> Any:
    raise RuntimeError("a worker handling single events opens no change stream")
