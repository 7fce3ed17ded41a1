"""Helpers of the stream chaos tests (``test_stream_outages.py``): a live feed of insert
events on the in-process fake change source, a thread-safe record of deliveries, a
counter of the package's log records, and a stream consumer on its own thread.

Times are ``time.monotonic()`` stamps, like the private servers' ``outages``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from django.db import connections

from flowwarden_django.streams import metrics
from flowwarden_django.streams.runtime import StreamConsumer
from flowwarden_django.testkit.fake_source import FakeChangeSource, FakeCursor, FakeOplog


def token_position(token: Mapping[str, Any] | None) -> int:
    """The log position of a fake resume token (0 for ``None``)."""
    return 0 if token is None else int(token["_data"][2:], 16)


class AwaitingCursor:
    """A ``FakeCursor`` whose idle poll waits a little, as pymongo's ``try_next`` waits
    up to ``maxAwaitTimeMS`` on a real server (the fake returns at once, so an idle
    stream would spin and starve the feeder of the GIL)."""

    def __init__(self, inner: FakeCursor, idle_wait: float) -> None:
        self._inner = inner
        self._idle_wait = idle_wait

    @property
    def alive(self) -> bool:
        return self._inner.alive

    @property
    def resume_token(self) -> Mapping[str, Any] | None:
        return self._inner.resume_token

    def try_next(self) -> Mapping[str, Any] | None:
        event = self._inner.try_next()
        if event is None:
            time.sleep(self._idle_wait)
        return event

    def close(self) -> None:
        self._inner.close()


class AwaitingSource(FakeChangeSource):
    """A ``FakeChangeSource`` whose cursors wait ``idle_wait`` s on an idle poll."""

    def __init__(self, oplog: FakeOplog | None = None, *, idle_wait: float = 0.01) -> None:
        super().__init__(oplog)
        self.idle_wait = idle_wait

    def open(self, **kwargs: Any) -> AwaitingCursor:  # type: ignore[override]
        return AwaitingCursor(super().open(**kwargs), self.idle_wait)


class Feeder(threading.Thread):
    """Appends inserts ``{_id: n, n: n}`` for n = 1..*events* to *oplog* at *rate* per
    second (in small batches), as an application writing orders would."""

    def __init__(self, oplog: FakeOplog, events: int, rate: float, batch: int = 10) -> None:
        super().__init__(name="chaos-feeder", daemon=True)
        self.oplog, self.events, self.rate, self.batch = oplog, events, rate, batch
        #: Log position of each event id.
        self.positions: dict[int, int] = {}
        self.finished_at: float | None = None

    def run(self) -> None:
        started = time.monotonic()
        for n in range(1, self.events + 1):
            event = self.oplog.insert({"_id": n, "n": n})
            self.positions[n] = token_position(event["_id"])
            if n % self.batch == 0:
                delay = started + n / self.rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
        self.finished_at = time.monotonic()


class Deliveries:
    """Completed handlings, thread-safe: how often each id was handled, and when."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[int] = Counter()
        #: ``(time, id)`` of each completed handling, in order.
        self.log: list[tuple[float, int]] = []
        self.failed_attempts = 0

    def record(self, event_id: int) -> None:
        with self._lock:
            self.counts[event_id] += 1
            self.log.append((time.monotonic(), event_id))

    def failed(self) -> None:
        with self._lock:
            self.failed_attempts += 1

    @property
    def distinct(self) -> int:
        return len(self.counts)

    def lost(self, expected: range) -> list[int]:
        with self._lock:
            return [n for n in expected if n not in self.counts]

    def duplicates(self) -> int:
        """Handlings beyond one per id."""
        with self._lock:
            return sum(count - 1 for count in self.counts.values())

    def duplicates_between(self, start: float, end: float) -> int:
        """Handlings in ``[start, end)`` of ids already handled before."""
        seen: set[int] = set()
        repeated = 0
        with self._lock:
            for at, event_id in self.log:
                if event_id in seen and start <= at < end:
                    repeated += 1
                seen.add(event_id)
        return repeated

    def first_after(self, moment: float) -> float | None:
        """The time of the first handling after *moment*."""
        with self._lock:
            return next((at for at, _ in self.log if at > moment), None)


class CheckpointWrites:
    """The successful processed-anchor writes of one stream (the runtime's
    ``checkpoint_saved`` signal, sent after the store acknowledged the write)."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        #: ``(time, log position of the anchor)`` of each write.
        self.anchors: list[tuple[float, int]] = []
        self._lock = threading.Lock()

    def _saved(self, sender: str, anchor: str, token: Any = None, **kwargs: Any) -> None:
        if anchor == "processed":
            with self._lock:
                self.anchors.append((time.monotonic(), token_position(token)))

    def __enter__(self) -> CheckpointWrites:
        metrics.checkpoint_saved.connect(self._saved, sender=self.stream, weak=False)
        return self

    def __exit__(self, *exc_info: object) -> None:
        metrics.checkpoint_saved.disconnect(self._saved, sender=self.stream)

    def first_after(self, moment: float) -> float | None:
        """The time of the first write after *moment*."""
        with self._lock:
            return next((at for at, _ in self.anchors if at > moment), None)


class LogCounter(logging.Handler):
    """Counts the records of the ``flowwarden_django`` loggers (INFO and up, what a
    production configuration shows), with the time each was emitted."""

    def __init__(self, logger_name: str = "flowwarden_django", level: int = logging.INFO) -> None:
        super().__init__(level)
        self.logger = logging.getLogger(logger_name)
        self.records: list[tuple[float, logging.LogRecord]] = []
        self._saved_level = self.logger.level

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((time.monotonic(), record))

    def __enter__(self) -> LogCounter:
        self.logger.addHandler(self)
        if self.logger.getEffectiveLevel() > self.level:
            self.logger.setLevel(self.level)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self._saved_level)

    def between(self, start: float, end: float) -> list[logging.LogRecord]:
        return [record for at, record in list(self.records) if start <= at <= end]

    def summary(self, records: list[logging.LogRecord], limit: int = 8) -> str:
        """The first records' messages, for an assertion's message."""
        return "\n".join(record.getMessage()[:200] for record in records[:limit])


class ConsumerThread(threading.Thread):
    """Runs ``consumer.run()`` until stopped; keeps what it raised."""

    def __init__(self, consumer: StreamConsumer) -> None:
        super().__init__(name=f"chaos-stream-{consumer.spec.name}", daemon=True)
        self.consumer = consumer
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.consumer.run()
        except BaseException as exc:
            self.error = exc
        finally:
            connections.close_all()

    def stop(self, timeout: float = 20.0) -> None:
        self.consumer.stop()
        self.join(timeout)
        if self.is_alive():
            raise AssertionError(f"{self.name} did not stop within {timeout} s")


def wait_until(condition: Any, timeout: float, poll: float = 0.02) -> bool:
    """Poll *condition* until it holds (True) or *timeout* s passed (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True
