"""Logging a failure that repeats: once when it starts, summaries while it lasts,
once when it ends.

A retry loop that logs one line (and a traceback) per attempt floods the log during
an outage: a Redis store that is down for ten seconds under load wrote 263,000
lines. ``FailureLog`` writes a warning when the failure starts (or when the error
changes to another class), with its traceback (at DEBUG when it is an outage: a
server that does not answer), a summary at most every ``summary_seconds`` while it
goes on ("still failing: 4,700 attempts in 10 s"), and an info line when an attempt
succeeds again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

from .outages import is_outage, short_message


@dataclass(eq=False)
class FailureLog:
    """The log of one repeating operation, ``what`` (for example ``"stream 'orders':
    saving the processed anchor"``). Thread-safe. Call ``failed(exc)`` after each
    failed attempt and ``succeeded()`` after each successful one."""

    logger: logging.Logger
    what: str
    _: KW_ONLY
    summary_seconds: float = 10.0
    level: int = logging.WARNING
    clock: Callable[[], float] = time.monotonic
    #: Failed attempts since the failure started (0: not failing).
    attempts: int = field(default=0, init=False)
    _since: float = field(default=0.0, init=False, repr=False)
    _last_summary: float = field(default=0.0, init=False, repr=False)
    _summarised: int = field(default=0, init=False, repr=False)
    _error_class: type[BaseException] | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def failing(self) -> bool:
        """Whether the last attempt failed."""
        return self.attempts > 0

    def failed(self, exc: BaseException) -> None:
        """Record a failed attempt; log it when it starts or changes, else now and
        then a summary."""
        with self._lock:
            now = self.clock()
            self.attempts += 1
            if self.attempts == 1 or type(exc) is not self._error_class:
                first = self.attempts == 1
                if first:
                    self._since = now
                self._error_class = type(exc)
                self._last_summary, self._summarised = now, self.attempts
                message = "%s failed: %s: %s" if first else "%s now fails with %s: %s"
                # A server that does not answer needs no traceback to be understood:
                # that one goes to DEBUG; a bug's goes with the warning.
                outage = is_outage(exc)
                self.logger.log(
                    self.level,
                    message,
                    self.what,
                    type(exc).__name__,
                    short_message(exc),
                    exc_info=None if outage else exc,
                )
                if outage:
                    self.logger.debug("%s: the traceback", self.what, exc_info=exc)
                return
            if now - self._last_summary >= self.summary_seconds:
                self.logger.log(
                    self.level,
                    "%s still failing: %d attempts in %.0f s (%d since the last report); "
                    "last error %s: %s",
                    self.what,
                    self.attempts,
                    now - self._since,
                    self.attempts - self._summarised,
                    type(exc).__name__,
                    short_message(exc),
                )
                self._last_summary, self._summarised = now, self.attempts

    def succeeded(self) -> None:
        """Record a successful attempt; log the recovery when it was failing."""
        if not self.attempts:  # the common case, without the lock
            return
        with self._lock:
            if not self.attempts:
                return
            self.logger.info(
                "%s works again after %d failed attempts in %.1f s",
                self.what,
                self.attempts,
                self.clock() - self._since,
            )
            self.attempts = 0
            self._error_class = None
