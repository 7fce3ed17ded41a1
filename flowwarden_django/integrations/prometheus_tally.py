"""The per-event counts of one stream, kept without a lock on the event path.

Each thread that counts events of a stream gets its own :class:`ThreadCounts`, found
through a ``threading.local``: only that thread ever writes it, so its ``+=`` cannot
lose an update to another writer, and the event path takes no lock. The counts only
grow. :meth:`EventTally.fold` (the scrape, under its own lock) reads every thread's
counts, adds what grew since its last read to the Prometheus metrics, and forgets
the counts of threads that have ended once everything they counted is added.

A scrape that runs while a thread counts may see an event's ``received`` before its
``processed``, or a duration in the sum before its bucket: the next scrape sees the
rest, as with any counter read while it moves.
"""

from __future__ import annotations

import bisect
import threading
import weakref
from typing import Any

from prometheus_client import Histogram

__all__ = ["DURATION_BUCKETS", "EventTally", "has_cells"]

#: The bounds of ``flowwarden_event_duration_seconds`` (prometheus-client's defaults).
DURATION_BUCKETS = tuple(float(bound) for bound in Histogram.DEFAULT_BUCKETS)
_BUCKET_COUNT = len(DURATION_BUCKETS)
_FIRST_BOUND = DURATION_BUCKETS[0]


class _ThreadMark:
    """Kept only in a thread's ``threading.local`` slot: CPython frees it as the thread
    ends (threads started elsewhere too, whose ``threading`` stand-in never ends)."""

    __slots__ = ("__weakref__",)


class ThreadCounts:
    """What one thread counted for one stream, since it began (only it writes these)."""

    __slots__ = ("buckets", "duration_sum", "failed", "mark", "received", "succeeded")

    def __init__(self, mark: _ThreadMark) -> None:
        #: Dead once the thread that writes these has ended.
        self.mark = weakref.ref(mark)
        self.received = self.succeeded = self.failed = 0
        self.duration_sum = 0.0
        self.buckets = [0] * _BUCKET_COUNT

    @property
    def ended(self) -> bool:
        """Whether the thread that writes these has ended (nothing more comes)."""
        return self.mark() is None

    def read(self) -> tuple[int, int, int, float, list[int]]:
        """The counts as they are now (from any thread)."""
        return self.received, self.succeeded, self.failed, self.duration_sum, self.buckets[:]


class EventTally:
    """One stream's ``event_received``/``event_processed`` counts not yet added to the
    Prometheus metrics by :meth:`fold`.

    The labelled children are made on first use, as ``labels()`` would make them (a
    stream's ``success="false"`` series starts with its first failure, say).
    """

    def __init__(self, metrics: Any, stream: str) -> None:
        self.metrics = metrics
        self.stream = stream
        self._local = threading.local()
        #: Serializes folds and the list of counts (never taken on the event path).
        self._lock = threading.Lock()
        #: Each thread's counts, with what the last fold read of them.
        self._counts: dict[ThreadCounts, tuple[int, int, int, float, list[int]]] = {}
        self.received_child: Any = None
        self.succeeded_child: Any = None
        self.failed_child: Any = None
        self.histogram: Any = None
        #: Whether the histogram has the value cells fold() adds to (else each
        #: duration is observed as it comes).
        self.cells = False

    def _thread_counts(self) -> ThreadCounts:
        mark = _ThreadMark()
        counts = ThreadCounts(mark)
        with self._lock:
            self._counts[counts] = (0, 0, 0, 0.0, [0] * _BUCKET_COUNT)
            # Threads come and go (a parallel stream's, at each restart): what the
            # ended ones counted is added now, even in a process nobody scrapes.
            self._fold(ended_only=True)
        self._local.mark, self._local.counts = mark, counts
        return counts

    def count_received(self, cluster_time: Any) -> None:
        """``on_event_received``'s work, called by the runtime directly (its fast path)."""
        try:
            counts = self._local.counts
        except AttributeError:
            counts = self._thread_counts()
        counts.received += 1
        metrics = self.metrics
        if type(cluster_time) in metrics.time_types:  # else a call to find out
            metrics.last_cluster[self.stream] = cluster_time
        else:
            metrics.keep_cluster_time(self.stream, cluster_time)

    def received_one(self) -> None:
        """Count one received event (the signal receiver's path)."""
        if self.received_child is None:
            self.received_child = self.metrics.events_received.labels(self.stream)
        try:
            counts = self._local.counts
        except AttributeError:
            counts = self._thread_counts()
        counts.received += 1

    def processed(self, success: Any, duration: float) -> None:
        """Count one event whose handling ended (the signal receiver's path)."""
        if self.histogram is None:
            self._first_processed()
        if success:
            if self.succeeded_child is None:
                self.succeeded_child = self.metrics.events_processed.labels(self.stream, "true")
        elif self.failed_child is None:
            self.failed_child = self.metrics.events_processed.labels(self.stream, "false")
        if not self.cells:
            self.histogram.observe(duration)
        self.count_processed(success, duration)

    def count_processed(self, success: Any, duration: float) -> None:
        """``processed`` once the histogram has its cells (the runtime's fast path):
        the labelled children are made when :meth:`fold` first adds to them."""
        try:
            counts = self._local.counts
        except AttributeError:
            counts = self._thread_counts()
        if success:
            counts.succeeded += 1
        else:
            counts.failed += 1
        counts.duration_sum += duration
        # Histogram.observe()'s rule: the first bound at or above the duration (NaN is
        # in no bucket, only in the sum). Most events end within the first bound.
        if duration <= _FIRST_BOUND:
            counts.buckets[0] += 1
            return
        bucket = bisect.bisect_left(DURATION_BUCKETS, duration)
        if bucket < _BUCKET_COUNT and duration <= DURATION_BUCKETS[bucket]:
            counts.buckets[bucket] += 1

    def fast_processed(self) -> Any:
        """The callable the runtime calls as each event ends: ``(success, duration)``."""
        if self.histogram is None:
            self._first_processed()
        return self.count_processed if self.cells else self.processed

    def _first_processed(self) -> None:
        histogram = self.metrics.event_duration.labels(self.stream)
        self.cells = has_cells(histogram)
        self.histogram = histogram

    def fold(self) -> None:
        """Add what every thread counted since the last fold to the metrics."""
        with self._lock:
            self._fold(ended_only=False)

    def _fold(self, *, ended_only: bool) -> None:
        received = succeeded = failed = 0
        duration_sum = 0.0
        buckets = [0] * _BUCKET_COUNT
        read: dict[ThreadCounts, tuple[int, int, int, float, list[int]] | None] = {}
        for counts, last in list(self._counts.items()):
            ended = counts.ended  # asked first: then nothing comes after the read
            if ended_only and not ended:
                continue
            now = counts.read()
            received += now[0] - last[0]
            succeeded += now[1] - last[1]
            failed += now[2] - last[2]
            duration_sum += now[3] - last[3]
            for index, (count, before) in enumerate(zip(now[4], last[4], strict=True)):
                buckets[index] += count - before
            read[counts] = None if ended else now
        # Added before what was read is marked folded: a failure leaves it to the next.
        self._add(received, succeeded, failed, duration_sum, buckets)
        for counts, now in read.items():
            if now is None:
                del self._counts[counts]
            else:
                self._counts[counts] = now

    def _add(
        self, received: int, succeeded: int, failed: int, duration_sum: float, buckets: list[int]
    ) -> None:
        metrics = self.metrics
        if received:
            if self.received_child is None:
                self.received_child = metrics.events_received.labels(self.stream)
            self.received_child.inc(received)
        if succeeded:
            if self.succeeded_child is None:
                self.succeeded_child = metrics.events_processed.labels(self.stream, "true")
            self.succeeded_child.inc(succeeded)
        if failed:
            if self.failed_child is None:
                self.failed_child = metrics.events_processed.labels(self.stream, "false")
            self.failed_child.inc(failed)
        if (succeeded or failed) and self.cells:
            self.histogram._sum.inc(duration_sum)
            for index, count in enumerate(buckets):
                if count:
                    self.histogram._buckets[index].inc(count)


def has_cells(histogram: Any) -> bool:
    """Whether a labelled ``Histogram`` has the value cells ``observe()`` adds to: its
    sum and one per bucket (every prometheus-client so far)."""
    cells = getattr(histogram, "_buckets", None)
    return (
        hasattr(getattr(histogram, "_sum", None), "inc")
        and isinstance(cells, list)
        and len(cells) == len(DURATION_BUCKETS)
        and all(hasattr(cell, "inc") for cell in cells)
    )
