"""The processed-anchor policy: when the last settled event is persisted.

One lock serializes its three writers (count threshold, age threshold, manual
save), so an older write can never land after a newer one. The count means
"settled since the last CONFIRMED write": a failed write leaves the anchor dirty
and due, and the next settlement retries it (while saves fail, at most every
``retry_pause_seconds``, so a store that is down is not hammered once per event).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from django.utils import timezone

from ..common.connections import discard_unusable_connections
from ..common.failure_log import FailureLog
from .checkpoint import CheckpointStore
from .tokens import tokens_equal

logger = logging.getLogger("flowwarden_django.streams")

#: An anchor's timestamp, or a function that returns it when the anchor is written.
At = datetime | Callable[[], datetime]


def anchor_failure_log(stream_name: str) -> FailureLog:
    """The ``FailureLog`` of a stream's processed-anchor writes."""
    return FailureLog(
        logger, f"stream {stream_name!r}: saving the processed anchor (it stays dirty)"
    )


class ProcessedAnchorPolicy:
    """Decides and performs the ``save_processed`` writes of one stream.

    ``save_every_n``: write at the N-th settled event since the last confirmed
    write. ``save_interval_seconds``: write a dirty anchor once it is that old
    (0 = never by age). Each write carries the heartbeat, in the same operation.
    """

    #: While saves fail, the seconds between two tries made by settling events (a
    #: store that is down is not hammered once per event; the anchor stays dirty).
    retry_pause_seconds = 0.5

    def __init__(
        self,
        store: CheckpointStore,
        stream_name: str,
        *,
        save_every_n: int = 1,
        save_interval_seconds: float = 5,
        confirmed_token: Mapping[str, Any] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        failure_log: FailureLog | None = None,
    ) -> None:
        self.store = store
        self.stream_name = stream_name
        self.save_every_n = save_every_n
        self.save_interval_seconds = save_interval_seconds
        self.confirmed_token = confirmed_token
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._pending: tuple[Mapping[str, Any], At] | None = None
        self._settled_since_confirmed = 0
        self._dirty_since: float | None = None
        self.writes = 0
        self.failures = 0
        self._cancelled = False
        #: The consumer passes its own, which outlives this generation's policy: a
        #: failure that ends a generation is reported once, and its recovery too.
        self._failed_at: float | None = None
        self.failure_log = failure_log or anchor_failure_log(stream_name)

    def cancel(self) -> None:
        """Refuse every later write (the stream's anchors are being replaced)."""
        with self._lock:
            self._cancelled = True
            self._pending = None

    @property
    def dirty(self) -> bool:
        """Whether a settled event is not yet persisted."""
        return self._pending is not None

    def on_settled(self, token: Mapping[str, Any], at: At, *, strict: bool = False) -> None:
        """Record a terminally settled event; persist when the count is reached.

        *at* is the anchor's timestamp, or a function returning it: called only if
        this settlement is the one written (most are replaced by the next one first).
        With ``strict`` (transactional streams) every settlement is written and a
        failed write raises, so the caller's transaction rolls back with it.
        """
        with self._lock:
            # Dict equality first: BSON-encoding both tokens on every event is costly.
            if token == self.confirmed_token and tokens_equal(token, self.confirmed_token):
                self._settled_since_confirmed = 0
                self._pending = None
                return
            self._pending = (token, at)
            self._settled_since_confirmed += 1
            if self._dirty_since is None:
                self._dirty_since = self._monotonic()
            if strict or self._settled_since_confirmed >= self.save_every_n:
                self._persist(strict=strict)

    def flush_if_due(self) -> bool:
        """Persist a dirty anchor older than ``save_interval_seconds``; ``True`` if written."""
        if self._pending is None or not self.save_interval_seconds:
            return False  # the common case, decided without the lock
        with self._lock:
            if self._pending is None:
                return False
            if self._monotonic() - (self._dirty_since or 0) < self.save_interval_seconds:
                return False
            return self._persist()

    def flush(self) -> bool:
        """Persist a dirty anchor now (graceful stop); ``True`` if nothing is left dirty."""
        with self._lock:
            return self._pending is None or self._persist(force=True)

    def save_now(self, token: Mapping[str, Any], at: At, *, strict: bool = False) -> bool:
        """Persist *token* immediately (``ctx.save_checkpoint_now()``)."""
        with self._lock:
            self._pending = (token, at)
            return self._persist(strict=strict, force=True)

    def _persist(self, *, strict: bool = False, force: bool = False) -> bool:
        if self._cancelled:
            self._pending = None
            return False
        assert self._pending is not None
        if (
            not (strict or force)
            and self._failed_at is not None
            and self._monotonic() - self._failed_at < self.retry_pause_seconds
        ):
            return False  # failing: the next settlement tries again after a pause
        token, at = self._pending
        try:
            if callable(at):
                at = at()
            self.store.save_processed(self.stream_name, token, at, heartbeat_at=timezone.now())
        except Exception as exc:
            self.failures += 1
            if strict:
                # The anchor belongs to the caller's transaction, which rolls back with
                # this error: a later flush must not persist it outside that transaction
                # (the event's effects are gone, so it has to be redelivered).
                self._pending = None
                self._settled_since_confirmed = 0
                self._dirty_since = None
                raise
            self.failure_log.failed(exc)
            self._failed_at = self._monotonic()
            discard_unusable_connections()  # outside any transaction: strict raised above
            return False
        self._failed_at = None
        self.failure_log.succeeded()
        self.writes += 1
        self.confirmed_token = token
        self._pending = None
        self._settled_since_confirmed = 0
        self._dirty_since = None
        return True
