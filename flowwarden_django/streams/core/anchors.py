"""The processed anchor's decisions, once for both runtimes: when the last settled
event is owed a write, and what a write's outcome changes.

``AnchorLedger`` counts "settled since the last CONFIRMED write": a failed write
leaves the anchor dirty and due, and the next settlement tries it again (while
writes fail, at most every ``retry_pause_seconds``, so a store that is down is not
hammered once per event). It does no I/O and takes no lock: the policies of
``streams.policy`` serialize their writers (a thread lock, an ``asyncio.Lock``) and
perform the write.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from django.utils import timezone

try:
    from bson import Timestamp
except ImportError:  # pymongo is optional: no event then carries one

    class Timestamp:  # type: ignore[no-redef]
        """Stands in for ``bson.Timestamp`` without pymongo (never instantiated)."""

        def as_datetime(self) -> datetime:
            raise NotImplementedError


from ..context import aware_datetime
from ..spec import LIFECYCLE_OPERATIONS
from ..tokens import tokens_equal

logger = logging.getLogger("flowwarden_django.streams")

#: An anchor's timestamp, or a function that returns it when the anchor is written.
#: An anchor's timestamp: an aware datetime, a function returning one, or an event's
#: ``bson.Timestamp`` cluster time (converted when written).
At = datetime | Callable[[], datetime] | Timestamp


def event_anchor_at(event: Mapping[str, Any]) -> At:
    """The processed anchor's timestamp of *event*: its cluster time, else now.

    The cluster time is converted when the anchor is written (once per
    ``save_every_n`` events), not for every event.
    """
    cluster_time = event.get("clusterTime")
    if cluster_time is None:
        return timezone.now()
    if type(cluster_time) is Timestamp:
        return cluster_time  # converted by resolve_at (no bound method made per event)
    as_datetime = getattr(cluster_time, "as_datetime", None)
    if as_datetime is not None:
        return as_datetime  # a Timestamp-like: its aware UTC datetime, when called
    return functools.partial(_cluster_anchor_at, cluster_time)


def _cluster_anchor_at(cluster_time: Any) -> datetime:
    return aware_datetime(cluster_time) or timezone.now()


def refuses_manual_save(stream_name: str, ctx: Any, policy: Any) -> bool:
    """Whether ``ctx.save_checkpoint_now()`` is ignored (logged): a lifecycle event has
    no anchor to save, and neither has a generation without a policy yet."""
    if ctx.operation_type in LIFECYCLE_OPERATIONS or policy is None:
        logger.warning(
            "stream %r: save_checkpoint_now() ignored for a %s event",
            stream_name,
            ctx.operation_type,
        )
        return True
    return False


def resolve_at(at: At) -> datetime:
    """The timestamp *at* stands for."""
    if type(at) is Timestamp:
        return at.as_datetime()
    return at() if callable(at) else at  # type: ignore[return-value]


class AnchorLedger:
    """What one stream's processed anchor is owed.

    ``save_every_n``: a write at the N-th settled event since the last confirmed
    write. ``save_interval_seconds``: a write once a dirty anchor is that old (0 =
    never by age).
    """

    #: While writes fail, the seconds between two tries made by settling events.
    retry_pause_seconds = 0.5

    def __init__(
        self,
        stream_name: str,
        *,
        save_every_n: int,
        save_interval_seconds: float,
        confirmed_token: Mapping[str, Any] | None,
        monotonic: Callable[[], float],
        failure_log: Any,
    ) -> None:
        self.stream_name = stream_name
        self.save_every_n = max(1, save_every_n)
        self.save_interval_seconds = save_interval_seconds
        self.confirmed_token = confirmed_token
        self._monotonic = monotonic
        #: The consumer's, which outlives this generation's policy: a failure that ends
        #: a generation is reported once, and its recovery too.
        self.failure_log = failure_log
        self._pending: tuple[Mapping[str, Any], At] | None = None
        self._settled_since_confirmed = 0
        self._dirty_since: float | None = None
        self._failed_at: float | None = None
        self._cancelled = False
        self.writes = 0
        self.failures = 0

    @property
    def dirty(self) -> bool:
        """Whether a settled event is not yet persisted."""
        return self._pending is not None

    def _cancel(self) -> None:
        self._cancelled = True
        self._pending = None

    def _settled(self, token: Mapping[str, Any], at: At, strict: bool) -> bool:
        """Record a terminally settled event; True when it is to be written now."""
        # Dict equality first: BSON-encoding both tokens on every event is costly.
        if token == self.confirmed_token and tokens_equal(token, self.confirmed_token):
            self._settled_since_confirmed = 0
            self._pending = None
            return False
        self._pending = (token, at)
        self._settled_since_confirmed += 1
        if self._dirty_since is None:
            self._dirty_since = self._monotonic()
        return strict or self._settled_since_confirmed >= self.save_every_n

    def age_flush_ruled_out(self) -> bool:
        """Whether no write by age can be due now, decided without the lock: nothing
        dirty, no age threshold, or a dirty anchor younger than it. Asked after every
        event of a stream with an age threshold; a stale read only leaves the flush to
        the next look (the next event, the flusher's next tick)."""
        since = self._dirty_since
        # A dirty anchor without a time (a failed manual save) is due, as _aged() says.
        return (
            self._pending is None
            or not self.save_interval_seconds
            or (since is not None and self._monotonic() - since < self.save_interval_seconds)
        )

    def _aged(self) -> bool:
        """Whether the dirty anchor is older than ``save_interval_seconds``."""
        return self._pending is not None and (
            self._monotonic() - (self._dirty_since or 0) >= self.save_interval_seconds
        )

    def _to_write(self, *, force: bool) -> tuple[Mapping[str, Any], At] | None:
        """The pending anchor, unless writes are refused or pausing after a failure."""
        if self._cancelled:
            self._pending = None
            return None
        if (
            not force
            and self._failed_at is not None
            and self._monotonic() - self._failed_at < self.retry_pause_seconds
        ):
            return None  # failing: the next settlement tries again after a pause
        return self._pending

    def _written(self, written: tuple[Mapping[str, Any], At]) -> None:
        self._failed_at = None
        self.failure_log.succeeded()
        self.writes += 1
        self.confirmed_token = written[0]
        if self._pending is written:  # else an event settled during the write: still dirty
            self._pending, self._settled_since_confirmed, self._dirty_since = None, 0, None

    def _write_failed(self, exc: Exception, *, strict: bool) -> None:
        self.failures += 1
        if strict:
            # The anchor belongs to the caller's transaction, which rolls back with this
            # error: a later flush must not persist it outside that transaction (the
            # event's effects are gone, so it has to be redelivered).
            self._pending, self._settled_since_confirmed, self._dirty_since = None, 0, None
            return
        self.failure_log.failed(exc)
        self._failed_at = self._monotonic()
