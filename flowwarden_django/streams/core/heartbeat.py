"""The idle heartbeat: the only writer of the seen anchor, once for both runtimes.

A write happens when the stream has been idle for the interval, at most once per
interval: the seen pair and the heartbeat when the position moved, the heartbeat
alone when it did not. After an oplog-start replay the first certification goes
through the guarded reset instead (even with the periodic heartbeat off: until then
the dead anchors stay as the "recovery due" marker).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django.utils import timezone

from .. import metrics
from ..tokens import tokens_equal
from .driving import Decision
from .effects import DiscardUnusableConnections, ResetAfterHistoryLost, SaveHeartbeat, SaveSeen


class Heartbeat:
    """One generation's heartbeat: its clock and what it certified. *monotonic* is
    the consumer's clock; *failure_log* logs a failing write once, and its recovery."""

    def __init__(
        self,
        stream_name: str,
        interval: float,
        monotonic: Callable[[], float],
        failure_log: Any,
        *,
        certified: Mapping[str, Any] | None = None,
        recovery_expected: tuple[Mapping[str, Any] | None] | None = None,
    ) -> None:
        self.stream_name = stream_name
        self.interval = float(interval)
        self.monotonic = monotonic
        self.failure_log = failure_log
        self.certified = certified
        self.recovery_expected = recovery_expected
        now = monotonic()
        #: When the stream last handled an event (the drivers set it).
        self.last_activity = now
        self.last_write = now
        self.writes = 0
        self.failures = 0

    @classmethod
    def of_generation(
        cls, spec: Any, opened: Any, monotonic: Callable[[], float], failure_log: Any
    ) -> Heartbeat:
        """The heartbeat of a generation of *spec*'s stream, opened as *opened* said."""
        return cls(
            spec.name,
            spec.checkpoint.idle_heartbeat_interval_seconds,
            monotonic,
            failure_log,
            certified=opened.certified,
            recovery_expected=opened.recovery_expected,
        )

    def on_idle(self, position: Mapping[str, Any] | None) -> Decision[None]:
        """The stream polled and found nothing; *position* is the server-certified
        position of the cursor (its postBatchResumeToken), ``None`` if unknown."""
        if position is None or (not self.interval and self.recovery_expected is None):
            return
        now = self.monotonic()
        due = self.recovery_expected is not None or (
            now - self.last_activity >= self.interval and now - self.last_write >= self.interval
        )
        if not due:
            return
        at = timezone.now()
        try:
            if self.recovery_expected is not None:
                yield ResetAfterHistoryLost(position, self.recovery_expected[0], at)
                self.recovery_expected = None
            elif tokens_equal(position, self.certified):
                yield SaveHeartbeat(at)
            else:
                yield SaveSeen(position, at)
        except Exception as exc:
            self.failures += 1
            metrics.emit(metrics.heartbeat_failed, self.stream_name, error=exc)
            self.failure_log.failed(exc)
            yield DiscardUnusableConnections()
            return
        self.failure_log.succeeded()
        self.writes += 1
        self.certified = position
        self.last_write = now
