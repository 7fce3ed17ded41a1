"""One ``SINGLE_LEADER`` stream's lease, as held by this process.

``Leadership`` takes, renews and gives up the lease; the consumer asks
``is_valid()`` before every event and writes its checkpoints inside ``fence()``.
Validity is judged on this process's monotonic clock, from the moment the
acquire or renew request was *sent*, minus a safety margin: the leader stops
believing in its lease before the lease's expiry time passes anywhere else
(hosts need clocks synchronized within that margin, like the reference).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from ...common.connections import discard_unusable_connections
from ...common.failure_log import FailureLog
from .. import metrics
from ..locks import Lease, LeaseLostError, LockService

logger = logging.getLogger("flowwarden_django.streams.runtime.leadership")


class Leadership:
    """The lease on one stream for one owner; ``role`` is ``LEADER`` or ``STANDBY``."""

    def __init__(
        self,
        stream_name: str,
        service: LockService,
        owner: str,
        *,
        ttl: float,
        renew_interval: float,
        poll_interval: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream_name = stream_name
        self.service = service
        self.owner = owner
        self.ttl = ttl
        self.renew_interval = renew_interval
        self.poll_interval = poll_interval
        self._monotonic = monotonic
        self.lease: Lease | None = None
        self._valid_until = float("-inf")
        self.next_attempt = float("-inf")
        self.failures = 0
        self.failure_log = FailureLog(logger, f"stream {stream_name!r}: the lease service")

    @property
    def margin(self) -> float:
        """Seconds before expiry at which this process stops trusting its lease."""
        return min(2.0, self.ttl * 0.1)

    @property
    def role(self) -> str:
        return "LEADER" if self.is_valid() else "STANDBY"

    def is_valid(self) -> bool:
        """Whether this process may act as the leader right now."""
        return self.lease is not None and self._monotonic() < self._valid_until

    def due(self) -> bool:
        """Whether the next acquire (standby) or renew (leader) attempt is due."""
        return self._monotonic() >= self.next_attempt

    def try_lead(self) -> bool:
        """Try to take the lease; True when this process now leads."""
        sent = self._monotonic()
        lease = self._call(self.service.try_acquire, self.stream_name, self.owner, self.ttl)
        if lease is None:
            self.next_attempt = sent + self.poll_interval
            return False
        self._hold(lease, sent)
        logger.info(
            "stream %r: %s leads (fencing token %d)", self.stream_name, self.owner, lease.token
        )
        self._announce("LEADER")
        return True

    def renew(self) -> bool:
        """Extend the lease; False (and the lease forgotten) when it is lost."""
        if self.lease is None:
            return False
        sent = self._monotonic()
        lease = self._call(self.service.renew, self.lease, self.ttl)
        if lease is None:
            logger.warning(
                "stream %r: %s lost the lease (token %d)",
                self.stream_name,
                self.owner,
                self.lease.token,
            )
            self.lose()
            return False
        self._hold(lease, sent)
        return True

    def lose(self) -> None:
        """Forget the lease at once (the consumer stops before its next event)."""
        was_leading = self.lease is not None
        self.lease = None
        self._valid_until = float("-inf")
        self.next_attempt = self._monotonic() + self.poll_interval
        if was_leading:
            self._announce("STANDBY")

    def release(self) -> None:
        """Give the lease up (graceful stop, pause, terminal crash), best effort."""
        lease = self.lease
        self.lose()
        if lease is not None:
            try:
                self.service.release(lease)
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

    def _call(self, method: Callable[..., Lease | None], *args: Any) -> Lease | None:
        # The SPI turns transient errors into None; a backend that raises anyway is
        # treated the same way (a renew that raises is a lost lease).
        try:
            lease = method(*args)
        except Exception as exc:
            self.failures += 1
            self.failure_log.failed(exc)
            discard_unusable_connections()
            return None
        self.failure_log.succeeded()
        return lease

    def _announce(self, role: str) -> None:
        metrics.emit(
            metrics.leadership_changed,
            self.stream_name,
            role=role,
            instance_id=self.owner,
            token=self.lease.token if self.lease is not None else None,
        )
