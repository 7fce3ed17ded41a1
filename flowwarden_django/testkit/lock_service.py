"""The ``LockService`` contract: the reference's 13 tests plus what they lacked.

Beyond the reference (which never lets a lease expire): expiry and takeover,
renewal and release after a takeover, fencing tokens across owners and
releases, ``is_current``/``guard`` after a takeover, argument checks, exact
names, and two races made to happen with real threads: many owners taking turns
on one name (never two holders at once, every token bigger than the last) and
many owners racing for one expired lease (exactly one winner).

Expiry tests use leases of ``short_ttl`` (0.3 s) and sleep past them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from ..streams.locks import Lease, LeaseLostError, LockService
from ._async_driven import async_driven
from ._harness import ThreadedContract, UniqueNameContract

A = "host-a:app:8080"
B = "host-b:app:8080"


class LockServiceContract(UniqueNameContract, ThreadedContract):
    """Behaviour every ``LockService`` must have. Subclass it and implement
    :meth:`make_service`; override :meth:`teardown_service` to wipe the backend.

    Each test uses lease names of its own, so a shared backend needs no cleanup.
    The race tests run real threads; :meth:`thread_finished` closes the Django
    connections each thread opened.
    """

    #: The TTL of leases that must not expire during a test (the reference's 60 s).
    ttl: timedelta = timedelta(seconds=60)
    #: The TTL of leases a test lets expire.
    short_ttl: timedelta = timedelta(seconds=0.3)
    #: Threads in the race tests, and turns each must win in the take-turns race.
    race_threads: int = 8
    race_turns: int = 5

    def make_service(self) -> LockService:
        """Return the service under test."""
        raise NotImplementedError("Subclasses return the service under test")

    def teardown_service(self, service: LockService) -> None:
        """Release or wipe the service after each test (``service.close()`` by default)."""
        service.close()

    @pytest.fixture
    def service(self) -> Iterator[LockService]:
        service = self.make_service()
        yield service
        self.teardown_service(service)

    name_prefix = "lease-"

    def acquire(self, service: LockService, name: str, owner: str = A, ttl=None) -> Lease:
        """``try_acquire`` that must succeed."""
        lease = service.try_acquire(name, owner, self.ttl if ttl is None else ttl)
        assert lease is not None, f"{owner} could not acquire {name!r}"
        return lease

    def before_expiry(
        self, service: LockService, name: str, act: Callable[[Lease], Any]
    ) -> tuple[Lease, Any]:
        """Acquire a ``short_ttl`` lease on *name* for ``A`` and return it with
        ``act(lease)``, called before the lease expires. A loaded machine may let the
        short lease run out before *act* is done: the scenario is then repeated on a
        fresh name with a TTL four times longer (up to 5 times), so the test checks
        the case it means to, however slow the backend is."""
        ttl = self.short_ttl
        for round_ in range(5):
            started = time.monotonic()
            lease = self.acquire(service, f"{name}-{round_}" if round_ else name, A, ttl)
            result = act(lease)
            if time.monotonic() - started < ttl.total_seconds():
                return lease, result
            ttl *= 4
        pytest.fail(f"acting on a lease took longer than {ttl / 4} five times in a row")

    def wait_until_expired(self, lease: Lease) -> None:
        """Sleep until *lease* has expired, by this process's clock."""
        time.sleep(max(lease.remaining().total_seconds(), 0) + 0.05)

    def expired_lease(self, service: LockService, name: str, owner: str = A) -> Lease:
        """A ``short_ttl`` lease on *name* for *owner*, returned once it has expired."""
        lease = self.acquire(service, name, owner, self.short_ttl)
        self.wait_until_expired(lease)
        return lease

    # -- the reference's 13 ------------------------------------------------------

    def test_acquire_succeeds_on_a_free_lease(self, service: LockService, name: str) -> None:
        before = timezone.now()
        lease = service.try_acquire(name, A, self.ttl)
        assert lease is not None
        assert (lease.name, lease.owner) == (name, A)
        assert lease.token >= 1
        assert lease.acquired_at >= before - timedelta(seconds=1)
        assert lease.expires_at > lease.acquired_at

    def test_acquire_fails_if_held_by_another_owner(self, service: LockService, name: str) -> None:
        self.acquire(service, name, A)
        assert service.try_acquire(name, B, self.ttl) is None
        assert service.owner_of(name).owner == A

    def test_acquire_again_by_the_holder_keeps_the_token_and_refreshes(
        self, service: LockService, name: str
    ) -> None:
        first, again = self.before_expiry(
            service, name, lambda lease: self.acquire(service, lease.name, A, self.ttl)
        )
        assert again.token == first.token
        assert again.acquired_at == first.acquired_at
        assert again.expires_at > first.expires_at
        self.wait_until_expired(first)
        assert service.owner_of(first.name) == again

    def test_renew_succeeds_for_the_owner(self, service: LockService, name: str) -> None:
        lease, renewed = self.before_expiry(
            service, name, lambda lease: service.renew(lease, self.ttl)
        )
        assert renewed is not None
        assert (renewed.name, renewed.owner, renewed.token) == (lease.name, A, lease.token)
        assert renewed.acquired_at == lease.acquired_at
        assert renewed.expires_at > lease.expires_at
        self.wait_until_expired(lease)
        assert service.owner_of(name) == renewed

    def test_renew_fails_for_another_owner(self, service: LockService, name: str) -> None:
        lease = self.acquire(service, name, A)
        assert service.renew(dataclasses.replace(lease, owner=B), self.ttl) is None
        assert service.owner_of(name) == lease

    def test_renew_fails_if_no_lease_exists(self, service: LockService, name: str) -> None:
        now = timezone.now()
        assert service.renew(Lease(name, A, 1, now, now + self.ttl), self.ttl) is None
        assert service.owner_of(name) is None

    def test_release_frees_the_lease_for_another_owner(
        self, service: LockService, name: str
    ) -> None:
        lease = self.acquire(service, name, A)
        assert service.release(lease) is True
        assert service.try_acquire(name, B, self.ttl) is not None

    def test_release_by_another_owner_is_a_no_op(self, service: LockService, name: str) -> None:
        lease = self.acquire(service, name, A)
        assert service.release(dataclasses.replace(lease, owner=B)) is False
        assert service.renew(lease, self.ttl) is not None

    def test_owner_of_returns_the_current_lease(self, service: LockService, name: str) -> None:
        before = timezone.now()
        lease = self.acquire(service, name, A)
        found = service.owner_of(name)
        assert found == lease
        assert (found.name, found.owner) == (name, A)
        assert found.acquired_at >= before - timedelta(seconds=1)
        assert found.expires_at > found.acquired_at

    def test_owner_of_is_none_without_a_lease(self, service: LockService, name: str) -> None:
        assert service.owner_of(name) is None

    def test_owner_of_names_the_leader(self, service: LockService, name: str) -> None:
        self.acquire(service, name, A)
        assert service.owner_of(name).owner == A

    def test_no_leader_without_a_lease(self, service: LockService, name: str) -> None:
        assert service.owner_of(f"{name}-never") is None

    def test_leases_on_different_names_are_independent(
        self, service: LockService, name: str
    ) -> None:
        one = self.acquire(service, f"{name}-1", A)
        two = self.acquire(service, f"{name}-2", B)
        assert service.owner_of(f"{name}-1") == one
        assert service.owner_of(f"{name}-2") == two
        assert service.owner_of(f"{name}-1").owner == A
        assert service.owner_of(f"{name}-2").owner == B

    # -- expiry and takeover -----------------------------------------------------

    def test_expired_lease_can_be_taken_by_another_owner(
        self, service: LockService, name: str
    ) -> None:
        old = self.expired_lease(service, name)
        new = service.try_acquire(name, B, self.ttl)
        assert new is not None
        assert new.owner == B
        assert new.token > old.token
        assert new.acquired_at > old.acquired_at
        assert service.owner_of(name) == new

    def test_expired_lease_taken_back_by_its_owner_is_a_new_tenure(
        self, service: LockService, name: str
    ) -> None:
        old = self.expired_lease(service, name)
        new = self.acquire(service, name, A)
        assert new.token > old.token
        assert not service.is_current(old)
        assert service.is_current(new)

    def test_renew_after_a_takeover_fails(self, service: LockService, name: str) -> None:
        old = self.expired_lease(service, name)
        new = self.acquire(service, name, B)
        assert service.renew(old, self.ttl) is None
        assert service.owner_of(name) == new

    def test_renew_of_an_expired_lease_fails(self, service: LockService, name: str) -> None:
        lease = self.expired_lease(service, name)
        assert service.renew(lease, self.ttl) is None
        assert service.owner_of(name) is None

    def test_owner_of_is_none_after_expiry(self, service: LockService, name: str) -> None:
        lease = self.expired_lease(service, name)
        assert service.owner_of(name) is None
        assert not service.is_current(lease)

    def test_owner_of_is_none_after_release(self, service: LockService, name: str) -> None:
        lease = self.acquire(service, name, A)
        assert service.release(lease)
        assert service.owner_of(name) is None
        assert not service.is_current(lease)
        assert service.release(lease) is False, "a second release must be a no-op"

    def test_old_owners_release_after_a_takeover_is_a_no_op(
        self, service: LockService, name: str
    ) -> None:
        old = self.expired_lease(service, name)
        new = self.acquire(service, name, B)
        assert service.release(old) is False
        assert service.owner_of(name) == new
        assert service.try_acquire(name, A, self.ttl) is None

    def test_stale_lease_of_the_same_owner_cannot_release_or_renew(
        self, service: LockService, name: str
    ) -> None:
        old = self.expired_lease(service, name)
        new = self.acquire(service, name, A)
        assert service.renew(old, self.ttl) is None
        assert service.release(old) is False
        assert service.owner_of(name) == new

    # -- fencing tokens ----------------------------------------------------------

    def test_tokens_increase_across_owners(self, service: LockService, name: str) -> None:
        tokens = []
        for owner in (A, B, A):
            lease = self.acquire(service, name, owner, self.short_ttl)
            tokens.append(lease.token)
            self.wait_until_expired(lease)
        assert tokens == sorted(set(tokens)), tokens

    def test_tokens_increase_across_release_and_reacquire(
        self, service: LockService, name: str
    ) -> None:
        tokens = []
        for owner in (A, A, B, A):
            lease = self.acquire(service, name, owner)
            tokens.append(lease.token)
            assert service.release(lease)
        assert tokens == sorted(set(tokens)), tokens

    def test_renewal_keeps_the_token(self, service: LockService, name: str) -> None:
        lease = self.acquire(service, name, A)
        for _ in range(3):
            lease = service.renew(lease, self.ttl)
            assert lease is not None
        assert service.owner_of(name).token == lease.token

    # -- is_current and guard ----------------------------------------------------

    def test_is_current_and_guard_while_held(self, service: LockService, name: str) -> None:
        lease = self.acquire(service, name, A)
        assert service.is_current(lease)
        ran = []
        with service.guard(lease):
            ran.append(True)
        assert ran == [True]

    def test_guard_lets_the_blocks_error_through(self, service: LockService, name: str) -> None:
        lease = self.acquire(service, name, A)

        class Boom(Exception):
            pass

        with pytest.raises(Boom), service.guard(lease):
            raise Boom
        assert service.is_current(lease)

    def test_is_current_and_guard_fail_after_a_takeover(
        self, service: LockService, name: str
    ) -> None:
        old = self.expired_lease(service, name)
        new = self.acquire(service, name, B)
        assert not service.is_current(old)
        assert service.is_current(new)
        ran = []
        with pytest.raises(LeaseLostError), service.guard(old):
            ran.append(True)
        assert ran == []

    def test_guard_fails_after_release(self, service: LockService, name: str) -> None:
        lease = self.acquire(service, name, A)
        service.release(lease)
        with pytest.raises(LeaseLostError), service.guard(lease):
            pass

    # -- arguments and names -----------------------------------------------------

    @pytest.mark.parametrize("ttl", [0, -1, 0.0, timedelta(0), timedelta(seconds=-5)])
    def test_ttl_must_be_positive(self, service: LockService, name: str, ttl) -> None:
        with pytest.raises(ValueError):
            service.try_acquire(name, A, ttl)
        assert service.owner_of(name) is None
        lease = self.acquire(service, name, A)
        with pytest.raises(ValueError):
            service.renew(lease, ttl)
        assert service.owner_of(name) == lease

    def test_ttl_may_be_seconds(self, service: LockService, name: str) -> None:
        lease = service.try_acquire(name, A, 60)
        assert lease is not None
        assert timedelta(seconds=59) < lease.expires_at - lease.acquired_at
        assert lease.expires_at - lease.acquired_at <= timedelta(seconds=61)
        renewed = service.renew(lease, 30.5)
        assert renewed is not None
        assert renewed.remaining() <= timedelta(seconds=30.5)

    def test_owner_must_not_be_empty(self, service: LockService, name: str) -> None:
        with pytest.raises(ValueError):
            service.try_acquire(name, "", self.ttl)

    def test_names_are_compared_exactly(self, service: LockService, name: str) -> None:
        variants = [f"{name}-orders", f"{name}-Orders", f"{name}-orders "]
        owners = [A, B, "host-c:app:8080"]
        leases = [self.acquire(service, v, o) for v, o in zip(variants, owners, strict=True)]
        for variant, lease in zip(variants, leases, strict=True):
            assert service.owner_of(variant) == lease

    def test_owners_are_compared_exactly(self, service: LockService, name: str) -> None:
        self.acquire(service, name, A)
        assert service.try_acquire(name, A.upper(), self.ttl) is None
        assert service.try_acquire(name, A + " ", self.ttl) is None
        assert service.owner_of(name).owner == A

    # -- races, made to happen ---------------------------------------------------

    def test_racing_owners_never_hold_the_lease_together(
        self, service: LockService, name: str
    ) -> None:
        """Owners take turns on one name: never two holders, every token bigger."""
        lock = threading.Lock()
        holders = [0]
        tokens: list[int] = []

        def take_turns(owner: str) -> None:
            turns = 0
            while turns < self.race_turns:
                lease = service.try_acquire(name, owner, self.ttl)
                if lease is None:
                    time.sleep(0.001)
                    continue
                with lock:
                    holders[0] += 1
                    tokens.append(lease.token)
                    assert holders[0] == 1, f"{holders[0]} owners hold {name!r} at once"
                time.sleep(0.001)
                with lock:
                    holders[0] -= 1
                assert service.release(lease), f"{owner} lost {name!r} while holding it"
                turns += 1

        owners = [f"host-{i}:app:8080" for i in range(self.race_threads)]
        self.run_threads(*[lambda owner=owner: take_turns(owner) for owner in owners])
        assert len(tokens) == self.race_threads * self.race_turns
        assert tokens == sorted(set(tokens)), "fencing tokens must strictly increase"

    def test_racing_for_a_new_name_has_one_winner(self, service: LockService, name: str) -> None:
        self._race_once(service, name, previous_token=0)

    def test_racing_for_an_expired_lease_has_one_winner(
        self, service: LockService, name: str
    ) -> None:
        old = self.expired_lease(service, name)
        self._race_once(service, name, previous_token=old.token)

    def _race_once(self, service: LockService, name: str, previous_token: int) -> None:
        start = threading.Barrier(self.race_threads)
        winners: list[Lease] = []
        lock = threading.Lock()

        def contend(owner: str) -> None:
            start.wait()
            lease = service.try_acquire(name, owner, self.ttl)
            if lease is not None:
                with lock:
                    winners.append(lease)

        owners = [f"host-{i}:app:8080" for i in range(self.race_threads)]
        self.run_threads(*[lambda owner=owner: contend(owner) for owner in owners])
        assert len(winners) == 1, f"{len(winners)} winners: {winners}"
        assert winners[0].token > previous_token
        assert service.owner_of(name) == winners[0]


#: The operations :class:`AsyncLockServiceContract` drives through their ``a…`` twins.
LOCK_OPERATIONS = LockService._thread_twinned


class AsyncLockServiceContract(LockServiceContract):
    """The same contract through the async API (``atry_acquire``, ``aguard``…).

    Every test of :class:`LockServiceContract` runs against a stand-in whose sync
    operations await the service's ``a…`` variants on an event loop, and whose
    ``guard`` enters ``aguard`` with ``async with`` (``testkit/_async_driven.py``).
    Then a test of its own: many coroutines racing for one lease. Subclass it like
    the sync contract, or put it first in front of an existing sync test class.
    """

    @pytest.fixture
    def service(self) -> Iterator[LockService]:
        service = self.make_service()
        yield async_driven(service, LOCK_OPERATIONS, context_managers=("guard",))
        self.teardown_service(service)

    def test_async_variants_are_coroutine_functions(self, service: Any) -> None:
        for operation in LOCK_OPERATIONS:
            variant = getattr(service.driven, f"a{operation}")
            assert inspect.iscoroutinefunction(variant), operation

    def test_gathered_acquires_have_one_winner(self, service: Any, name: str) -> None:
        real: LockService = service.driven
        owners = [f"host-{i}:app:8080" for i in range(self.race_threads)]

        async def scenario() -> list[Lease | None]:
            leases = await asyncio.gather(*(real.atry_acquire(name, o, self.ttl) for o in owners))
            (winner,) = [lease for lease in leases if lease is not None]
            async with real.aguard(winner):
                assert await real.aowner_of(name) == winner
            assert await real.arelease(winner)
            with pytest.raises(LeaseLostError):
                async with real.aguard(winner):
                    pass
            return list(leases)

        leases = async_to_sync(scenario)()
        assert sum(lease is not None for lease in leases) == 1
