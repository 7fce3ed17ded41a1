"""One ``SINGLE_LEADER`` stream's lease, as held by this process.

``Leadership`` takes, renews and gives up the lease; the consumer asks
``is_valid()`` before every event and writes its checkpoints inside ``fence()``.
Validity is judged on this process's monotonic clock, from the moment the
acquire or renew request was *sent*, minus a safety margin: the leader stops
believing in its lease before the lease's expiry time passes anywhere else
(hosts need clocks synchronized within that margin, like the reference).

A process that lost its lease stands by again: it keeps trying to take it. While
the lock service does not answer (an error, raised or noted by the backend through
``locks.note_unavailable``), it retries with backoff, from ``RETRY_FIRST_SECONDS``
doubling up to the standby poll interval, and ``outage`` holds the error (the
status rows report it); a lease held by another owner is polled at the standby
poll interval.

The calls run on a thread of their own (``LeaseCalls``): the supervisor waits for one
at most ``call_timeout``, then carries on; a call still unanswered stays pending and
its answer is taken on a later pass, trusted from the moment the call was sent. A
renewal that does not answer does not extend the lease: the leader stops trusting it
when it would have anyway, and stands by.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ...common.connections import discard_unusable_connections
from ...common.failure_log import FailureLog
from .. import metrics
from ..locks import Lease, LeaseLostError, LockService, unavailable_error
from .lease_calls import LeaseCalls

logger = logging.getLogger("flowwarden_django.streams.runtime.leadership")

#: Seconds before the first retry after the lock service failed; the delay doubles
#: with each failure, up to the standby poll interval.
RETRY_FIRST_SECONDS = 0.5
#: The longest a supervisor pass waits for one call, in any case.
CALL_WAIT_MAX_SECONDS = 5.0
#: What ``_outcome`` answers while a call is pending.
_PENDING: Any = object()


@dataclasses.dataclass(eq=False, repr=False)
class Leadership:
    """The lease on one stream for one owner; ``role`` is ``LEADER`` or ``STANDBY``."""

    stream_name: str
    service: LockService
    owner: str
    ttl: float = dataclasses.field(kw_only=True)
    renew_interval: float = dataclasses.field(kw_only=True)
    poll_interval: float = dataclasses.field(kw_only=True)
    monotonic: Callable[[], float] = dataclasses.field(default=time.monotonic, kw_only=True)
    lease: Lease | None = dataclasses.field(default=None, init=False)
    _valid_until: float = dataclasses.field(default=float("-inf"), init=False)
    next_attempt: float = dataclasses.field(default=float("-inf"), init=False)
    failures: int = dataclasses.field(default=0, init=False)
    #: The lock service's last error while it fails (``None`` once it answers).
    outage: BaseException | None = dataclasses.field(default=None, init=False)
    #: Consecutive failed calls (the backoff's exponent).
    outage_attempts: int = dataclasses.field(default=0, init=False)
    #: The call in progress: (kind, its future, when it was sent).
    _pending: tuple[str, Any, float] | None = dataclasses.field(default=None, init=False)
    _outcome_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        self.failure_log = FailureLog(logger, f"stream {self.stream_name!r}: the lease service")
        self._calls = LeaseCalls(self.stream_name)

    @property
    def call_timeout(self) -> float:
        """How long a supervisor pass waits for a lock-service call to answer."""
        return max(0.05, min(CALL_WAIT_MAX_SECONDS, self.renew_interval, self.poll_interval))

    @property
    def margin(self) -> float:
        """Seconds before expiry at which this process stops trusting its lease."""
        return min(2.0, self.ttl * 0.1)

    @property
    def role(self) -> str:
        return "LEADER" if self.is_valid() else "STANDBY"

    def is_valid(self) -> bool:
        """Whether this process may act as the leader right now."""
        return self.lease is not None and self.monotonic() < self._valid_until

    def due(self) -> bool:
        """Whether the next acquire (standby) or renew (leader) attempt is due, or the
        answer of a pending one is to be looked at."""
        return self._pending is not None or self.monotonic() >= self.next_attempt

    def try_lead(self) -> bool:
        """Try to take the lease; True when this process now leads (False while the
        call is pending: a later call takes its answer)."""
        outcome = self._outcome(
            "acquire", self.service.try_acquire, self.stream_name, self.owner, self.ttl
        )
        if outcome is _PENDING:
            return False
        lease, sent = outcome
        if lease is None:
            self.next_attempt = sent + self._wait_before_retry()
            return False
        if self.monotonic() >= sent + self.ttl - self.margin:
            # Answered too late to be trusted: it expires on its own; ask again.
            self.next_attempt = self.monotonic()
            return False
        self._hold(lease, sent)
        logger.info(
            "stream %r: %s leads (fencing token %d)", self.stream_name, self.owner, lease.token
        )
        self._announce("LEADER")
        return True

    def renew(self) -> bool:
        """Extend the lease; False (and the lease forgotten) when it is lost."""
        held = self.lease
        if held is None:
            return False
        outcome = self._outcome("renew", self.service.renew, held, self.ttl)
        if outcome is _PENDING:
            if self.is_valid():
                return True
            logger.warning(
                "stream %r: %s lost the lease (token %d): its renewal has not answered "
                "and the lease is no longer trusted; standing by",
                self.stream_name,
                self.owner,
                held.token,
            )
            self.lose()
            return False
        lease, sent = outcome
        if self.lease is not held:
            return self.is_valid()  # forgotten meanwhile (the fence): the answer is moot
        if lease is None:
            # (The consumer's fence may have forgotten the lease meanwhile: log *held*.)
            logger.warning(
                "stream %r: %s lost the lease (token %d); standing by",
                self.stream_name,
                self.owner,
                held.token,
            )
            self.lose()
            return False
        self._hold(lease, sent)
        return True

    def lose(self) -> None:
        """Forget the lease at once (the consumer stops before its next event); this
        process stands by again, its next attempt to lead after a poll (or a retry's
        backoff while the lock service fails)."""
        was_leading = self.lease is not None
        self.lease = None
        self._valid_until = float("-inf")
        self.next_attempt = self.monotonic() + self._wait_before_retry()
        if was_leading:
            self._announce("STANDBY")

    def release(self) -> None:
        """Give the lease up (graceful stop, pause, terminal crash), best effort."""
        lease = self.lease
        self.lose()
        if lease is None:
            return
        # On the calls' thread (behind a pending call, if any), waited for a moment: a
        # silent lock service must not hold a graceful stop; the lease then expires.
        released = self._calls.submit(self.service.release, lease)
        try:
            released.result(timeout=self.call_timeout)
        except TimeoutError:
            logger.warning(
                "stream %r: releasing the lease did not answer within %.1f s; it expires",
                self.stream_name,
                self.call_timeout,
            )
        except Exception:
            logger.warning("stream %r: releasing the lease failed", self.stream_name)

    @contextlib.contextmanager
    def fence(self) -> Iterator[None]:
        """The guard a checkpoint write runs in: refused unless the lease is current.

        A refusal from the lock service means another process took the lease over:
        this process forgets it at once, so its consumer stops before its next
        event and the supervisor does not start it again.
        """
        lease = self.lease
        if lease is None or not self.is_valid():
            raise LeaseLostError(f"stream {self.stream_name!r}: {self.owner} holds no valid lease")
        try:
            with self.service.guard(lease):
                yield
        except LeaseLostError:
            if self.lease is lease:
                logger.warning(
                    "stream %r: the lock service refused token %d; %s no longer leads",
                    self.stream_name,
                    lease.token,
                    self.owner,
                )
                self.lose()
            raise

    def _hold(self, lease: Lease, sent: float) -> None:
        self.lease = lease
        self._valid_until = sent + self.ttl - self.margin
        self.next_attempt = sent + self.renew_interval

    def retry_delay(self) -> float:
        """The backoff before the next attempt after ``outage_attempts`` failures."""
        if not self.outage_attempts:
            return self.poll_interval
        delay = RETRY_FIRST_SECONDS * 2 ** min(self.outage_attempts - 1, 30)
        return min(self.poll_interval, delay) * random.uniform(0.8, 1.0)

    def _wait_before_retry(self) -> float:
        return self.retry_delay() if self.outage is not None else self.poll_interval

    def _outcome(self, kind: str, method: Callable[..., Lease | None], *args: Any) -> Any:
        """``(answer, sent)`` of a *kind* call of *method*, or ``_PENDING``: the call is
        made on the calls' thread and waited for ``call_timeout`` (a pending one, of
        any kind, is only looked at; the answer of another kind is dropped)."""
        with self._outcome_lock:  # start() and the supervisor may ask at once
            return self._outcome_locked(kind, method, *args)

    def _outcome_locked(self, kind: str, method: Callable[..., Lease | None], *args: Any) -> Any:
        wait = 0.0
        if self._pending is None:
            sent = self.monotonic()
            future = self._calls.submit(self._call, method, *args)
            self._pending = (kind, future, sent)
            wait = self.call_timeout
        pending_kind, future, sent = self._pending
        try:
            answer = future.result(timeout=wait)
        except TimeoutError:
            return _PENDING
        self._pending = None
        if pending_kind != kind:
            return _PENDING
        return answer, sent

    def _call(self, method: Callable[..., Lease | None], *args: Any) -> Lease | None:
        # The SPI turns transient errors into None (and notes them: unavailable_error);
        # a backend that raises anyway is treated the same way (a renew that raises is a
        # lost lease).
        unavailable_error()  # forget what an earlier call on this thread noted
        try:
            lease = method(*args)
        except Exception as exc:
            discard_unusable_connections()
            self._failed(exc)
            return None
        error = unavailable_error()
        if error is not None:
            self._failed(error)
            return lease
        self.failure_log.succeeded()
        self.outage, self.outage_attempts = None, 0
        return lease

    def _failed(self, error: BaseException) -> None:
        self.failures += 1
        self.outage_attempts += 1
        self.outage = error
        self.failure_log.failed(error)

    def _announce(self, role: str) -> None:
        metrics.emit(
            metrics.leadership_changed,
            self.stream_name,
            role=role,
            instance_id=self.owner,
            token=self.lease.token if self.lease is not None else None,
        )
