"""Leases: the ``LockService`` SPI behind ``deployment_mode="SINGLE_LEADER"``.

A lease is held by one owner until it expires; every time a lease changes hands
(acquired while free, expired or held by someone else) it gets a **fencing token**
greater than every token issued for that name before, even after a release.
A holder proves it is still the leader with ``guard(lease)``: the block runs only
while the lease is current, and a holder whose lease was taken over gets
``LeaseLostError`` instead of writing.

The service is stateless: callers pass the owner and the TTL on every call.
``try_acquire`` and ``renew`` turn transient backend errors into ``None`` (a
failed renewal is treated as a lost lease) and log a warning; they do not raise.
Caller mistakes still raise: a TTL that is not positive or an empty owner is a
``ValueError``.

Rules every backend follows (``flowwarden_django.testkit.LockServiceContract``
checks them):

* A lease is valid while ``now < expires_at``; at ``expires_at`` it has expired.
* Names and owners are compared exactly (case and trailing spaces count).
* Tokens start at 1 and never restart for a name, even after a release.
* A new tenure gets a new token: acquiring a free or expired lease, including
  one whose lapsed holder is the same owner. Only re-acquiring a lease the owner
  still validly holds keeps the token (and its ``acquired_at``) and moves
  ``expires_at``.
* Expiry is judged by the clock of the process making the call (the stores
  keep absolute expiry times), so hosts sharing a lease need synchronized clocks
  (NTP), and the TTL must be much larger than their skew.

A backend that turns a transient error into ``None`` also calls
:func:`note_unavailable` (the built-in ones do, through their warning): the caller
can then tell "the lock service did not answer" from "another owner holds it"
(:func:`unavailable_error`), and back off while the outage lasts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from ._twins import RunsSync

_unavailable = threading.local()


def note_unavailable(error: BaseException) -> None:
    """Record, for this thread, that the lock-service call in progress failed with
    *error* and will answer ``None`` (a backend calls it where it swallows the error)."""
    _unavailable.error = error


def unavailable_error() -> BaseException | None:
    """The error :func:`note_unavailable` recorded on this thread since the last call
    of this function, if any; the record is cleared."""
    error = getattr(_unavailable, "error", None)
    _unavailable.error = None
    return error


class LeaseLostError(RuntimeError):
    """The caller's lease expired or was taken over: it must stop acting as leader."""


@dataclasses.dataclass(frozen=True)
class Lease:
    """A held lease: who holds *name*, since when, until when, under which token."""

    name: str
    owner: str
    token: int
    acquired_at: datetime
    expires_at: datetime

    def remaining(self, now: datetime | None = None) -> timedelta:
        """Time left before it expires (negative once expired)."""
        return self.expires_at - (now or timezone.now())


def ttl_delta(ttl: timedelta | float) -> timedelta:
    """*ttl* as a ``timedelta`` (a number is seconds); must be positive."""
    delta = ttl if isinstance(ttl, timedelta) else timedelta(seconds=float(ttl))
    if delta <= timedelta(0):
        raise ValueError(f"ttl must be positive, not {ttl!r}")
    return delta


class LockService(RunsSync, ABC):
    """Time-limited, fenced, exclusive leases by name.

    * ``try_acquire(name, owner, ttl)``: the lease when *name* is free, expired or
      already held by *owner* (re-acquiring refreshes the expiry and keeps the
      token); else ``None``. Atomic against concurrent callers.
    * ``renew(lease, ttl)``: extend a lease still held under the same token and not
      expired; ``None`` otherwise.
    * ``release(lease)``: give it up if still held under that token (else a no-op).
    * ``owner_of(name)``: the current, unexpired lease, or ``None``.

    Async API: ``atry_acquire``, ``arenew``, ``arelease``, ``aowner_of`` and
    ``ais_current`` have the semantics and errors of their sync twins. The defaults
    run the sync method through
    ``asgiref.sync.sync_to_async(thread_sensitive=async_thread_sensitive)``: ``True``
    here and on the ORM service (Django's connections belong to the thread-sensitive
    executor), ``False`` on the memory, Redis and MongoDB services, which never touch
    the Django database, so their calls run in parallel on the default executor. One
    class attribute decides for every operation; a backend with a native async client
    overrides the ``a…`` methods themselves.

    ``async with service.aguard(lease):`` checks ``ais_current`` and then runs the
    block, raising ``LeaseLostError`` like ``guard``; it is the default ``guard``'s
    check-then-run on every backend. The ORM service's ``guard`` holds the lease row
    locked in the caller's transaction, which an async block cannot hold across
    awaits: to fence ORM writes made from async code, run the guarded write in one
    sync function (``with service.guard(lease): ...``) through ``sync_to_async``.
    """

    @abstractmethod
    def try_acquire(self, name: str, owner: str, ttl: timedelta | float) -> Lease | None:
        """Take or refresh the lease on *name* for *owner*."""

    @abstractmethod
    def renew(self, lease: Lease, ttl: timedelta | float) -> Lease | None:
        """Extend *lease* by *ttl* from now, if it is still the current one."""

    @abstractmethod
    def release(self, lease: Lease) -> bool:
        """Give *lease* up; True if it was still held."""

    @abstractmethod
    def owner_of(self, name: str) -> Lease | None:
        """The unexpired lease on *name*, or ``None``."""

    def is_current(self, lease: Lease) -> bool:
        """Whether *lease* is still held (same owner and token, not expired)."""
        current = self.owner_of(lease.name)
        return current is not None and current.owner == lease.owner and current.token == lease.token

    @contextlib.contextmanager
    def guard(self, lease: Lease) -> Iterator[None]:
        """Run the block only while *lease* is current, else raise ``LeaseLostError``.

        The default checks, then runs the block: a takeover in between is possible.
        The ORM service closes that gap for writes to the same database by holding
        the lease row locked until the caller's transaction ends.
        """
        if not self.is_current(lease):
            raise LeaseLostError(
                f"the lease on {lease.name!r} (token {lease.token}) is no longer held by "
                f"{lease.owner!r}"
            )
        yield

    def close(self) -> None:
        """Release connections (called when settings change)."""

    # -- the async API: the sync operations run through ``sync_to_async`` ------------

    _thread_twinned = ("try_acquire", "renew", "release", "owner_of", "is_current")

    def aguard(self, lease: Lease) -> AbstractAsyncContextManager[None]:
        """Run the ``async with`` block only while *lease* is current, else raise
        ``LeaseLostError``: a check, then the block (see the class docstring)."""
        return _AsyncGuard(self, lease)

    @classmethod
    def check_options(cls, alias: str, options: Mapping[str, Any]) -> list[Any]:
        """System-check messages about this backend's ``OPTIONS`` (none by default)."""
        return []


class _AsyncGuard:
    """``LockService.aguard``: checks ``ais_current`` on entry, nothing on exit."""

    def __init__(self, service: LockService, lease: Lease) -> None:
        self.service = service
        self.lease = lease

    async def __aenter__(self) -> None:
        if not await self.service.ais_current(self.lease):
            lease = self.lease
            raise LeaseLostError(
                f"the lease on {lease.name!r} (token {lease.token}) is no longer held by "
                f"{lease.owner!r}"
            )

    async def __aexit__(self, *exc_info: object) -> None:
        return None
