"""Running declared streams: ``StreamManager`` starts, stops and restarts consumers,
each on its own thread."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connections

from ..conf import fw_settings
from .clients import mongo_clients
from .registry import StreamRegistry, stream_registry
from .runtime import StreamConsumer, StreamState
from .source import ChangeSource, PymongoChangeSource
from .spec import StreamSpec
from .stores import checkpoint_stores

logger = logging.getLogger("flowwarden_django.streams")


def pymongo_source(spec: StreamSpec) -> ChangeSource:
    """The production source of a stream: its MongoDB client alias, collection and pipeline."""
    pipeline = list(spec.pipeline()) if spec.pipeline is not None else []
    return PymongoChangeSource(
        mongo_clients[spec.client],
        spec.database,
        spec.collection,
        stream_name=spec.name,
        pipeline=pipeline,
        full_document=spec.full_document,
        full_document_before_change=spec.full_document_before_change,
        max_await_ms=int(fw_settings.STREAM_MAX_AWAIT_MS),
    )


class StreamManager:
    """Starts and stops stream consumers by name; one thread per running stream.

    ``start(name)`` builds the stream's spec afresh (a new instance of its class),
    so a restart picks up the current declaration.
    """

    def __init__(
        self,
        registry: StreamRegistry | None = None,
        source_factory: Callable[[StreamSpec], ChangeSource] = pymongo_source,
    ) -> None:
        self.registry = registry or stream_registry
        self.source_factory = source_factory
        self._consumers: dict[str, StreamConsumer] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()

    def startable(self) -> list[str]:
        """Names of the enabled, auto-started streams."""
        return [n for n, s in self.registry.specs().items() if s.enabled and s.auto_start]

    def consumer(self, name: str) -> StreamConsumer | None:
        """The consumer of a started stream."""
        return self._consumers.get(name)

    def start(self, name: str, *, burst: bool = False) -> StreamConsumer:
        """Start one stream on a new thread (no-op if it is running)."""
        with self._lock:
            thread = self._threads.get(name)
            if thread is not None and thread.is_alive():
                return self._consumers[name]
            spec = self.registry.get(name)
            if not spec.enabled:
                raise ValueError(f"stream {name!r} is disabled (enabled=False)")
            consumer = StreamConsumer(
                spec, checkpoint_stores[spec.checkpoint_store], self.source_factory
            )
            thread = threading.Thread(
                target=self._run, args=(consumer, burst), name=f"fw-stream-{name}", daemon=False
            )
            self._consumers[name], self._threads[name] = consumer, thread
            thread.start()
            return consumer

    def _run(self, consumer: StreamConsumer, burst: bool) -> None:
        try:
            consumer.run(burst=burst)
        except Exception:  # terminal: state is CRASHED and last_error says why
            logger.debug("stream %r ended", consumer.spec.name, exc_info=True)
        finally:
            connections.close_all()  # this thread's own connections

    def start_all(self, names: Iterable[str] | None = None, *, burst: bool = False) -> None:
        """Start the given streams, or every enabled auto-start stream."""
        for name in names if names is not None else self.startable():
            self.start(name, burst=burst)

    def stop(self, name: str, timeout: float | None = 30) -> None:
        """Stop one stream gracefully (its dirty anchor is flushed) and wait for it."""
        consumer, thread = self._consumers.get(name), self._threads.get(name)
        if consumer is None or thread is None:
            return
        consumer.stop()
        thread.join(timeout)

    def restart(self, name: str) -> StreamConsumer:
        """Stop then start one stream."""
        self.stop(name)
        return self.start(name)

    def stop_all(self, timeout: float | None = 30) -> None:
        """Stop every stream: ask all first, then wait for each."""
        for consumer in list(self._consumers.values()):
            consumer.stop()
        for thread in list(self._threads.values()):
            if thread.is_alive():
                thread.join(timeout)

    def any_running(self) -> bool:
        """Whether any started stream's thread is still alive."""
        return any(thread.is_alive() for thread in list(self._threads.values()))

    def wait(self, timeout: float | None = None) -> None:
        """Wait until every started stream's thread has ended."""
        for thread in list(self._threads.values()):
            thread.join(timeout)

    def status(self) -> list[dict[str, Any]]:
        """One row per declared stream: state, counts, last event, last error."""
        rows = []
        for name, spec in self.registry.specs().items():
            consumer = self._consumers.get(name)
            rows.append(
                {
                    "name": name,
                    "collection": f"{spec.database or '(default db)'}.{spec.collection}",
                    "enabled": spec.enabled,
                    "state": (consumer.state if consumer else StreamState.STOPPED).value,
                    "events": consumer.events_handled if consumer else 0,
                    "restarts": consumer.restarts if consumer else 0,
                    "last_event_at": consumer.last_event_at if consumer else None,
                    "last_error": str(consumer.last_error)
                    if consumer and consumer.last_error
                    else "",
                }
            )
        return rows
