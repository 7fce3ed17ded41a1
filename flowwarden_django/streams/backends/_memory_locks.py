"""In-process lock service, for tests and single-process deployments."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta

from django.utils import timezone

from ..locks import Lease, LockService, ttl_delta
from ._lock_common import check_owner


class InMemoryLockService(LockService):
    """Leases in a dict guarded by one lock; every operation is atomic under it.

    Fencing counters live apart from the leases and are never dropped, so tokens
    never restart for a name. ``now`` replaces ``django.utils.timezone.now`` as the
    clock (tests pass a fake one to expire leases without sleeping).
    """

    #: The async API runs on the default executor, in parallel: this never touches
    #: the Django database.
    async_thread_sensitive = False

    def __init__(self, now: Callable[[], datetime] | None = None) -> None:
        self._now = now or timezone.now
        self._leases: dict[str, Lease] = {}
        self._fences: dict[str, int] = {}
        self._lock = threading.Lock()

    def _valid(self, name: str, now: datetime) -> Lease | None:
        lease = self._leases.get(name)
        return lease if lease is not None and now < lease.expires_at else None

    def try_acquire(self, name: str, owner: str, ttl: timedelta | float) -> Lease | None:
        check_owner(owner)
        delta = ttl_delta(ttl)
        with self._lock:
            now = self._now()
            current = self._valid(name, now)
            if current is not None and current.owner != owner:
                return None
            if current is not None:  # still ours: refresh, same tenure
                lease = Lease(name, owner, current.token, current.acquired_at, now + delta)
            else:
                token = self._fences.get(name, 0) + 1
                self._fences[name] = token
                lease = Lease(name, owner, token, now, now + delta)
            self._leases[name] = lease
            return lease

    def renew(self, lease: Lease, ttl: timedelta | float) -> Lease | None:
        delta = ttl_delta(ttl)
        with self._lock:
            now = self._now()
            current = self._valid(lease.name, now)
            if current is None or (current.owner, current.token) != (lease.owner, lease.token):
                return None
            renewed = Lease(lease.name, lease.owner, lease.token, current.acquired_at, now + delta)
            self._leases[lease.name] = renewed
            return renewed

    def release(self, lease: Lease) -> bool:
        with self._lock:
            current = self._valid(lease.name, self._now())
            if current is None or (current.owner, current.token) != (lease.owner, lease.token):
                return False
            del self._leases[lease.name]
            return True

    def owner_of(self, name: str) -> Lease | None:
        with self._lock:
            return self._valid(name, self._now())

    def clear(self) -> None:
        """Drop every lease and fencing counter."""
        with self._lock:
            self._leases.clear()
            self._fences.clear()
