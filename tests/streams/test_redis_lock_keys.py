"""Lease names that look like another key's name stay separate leases.

The Redis lock service kept lease ``orders`` at ``lock:orders`` and its fencing
counter at ``lock:orders:fence``: the lease named ``orders:fence`` was that
counter, and failed with ``WRONGTYPE`` for good (the counter never expires). The
tricky names run on every backend; the upgrade from the old layout on Redis.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from flowwarden_django.streams.backends.memory import InMemoryLockService
from flowwarden_django.streams.backends.orm import OrmLockService
from flowwarden_django.streams.backends.redis import RedisLockService
from flowwarden_django.streams.locks import LockService
from tests.support.lanes import lane_marks, on_lane
from tests.support.services import redis_url

#: Names that are, or were, another lease's keys, or look like a key kind.
TRICKY = [
    "orders",
    "orders:fence",
    "orders:fence:fence",
    "fence:orders",
    "lease:orders",
    "lock:orders",
    "lock:orders:fence",
    "orders:lease",
    ":",
    "orders:",
    "{orders}",
]

OWNERS = [f"host-{i}:app:8080" for i in range(len(TRICKY))]


def redis_service() -> RedisLockService:
    return RedisLockService(url=redis_url(), key_prefix=f"fwtest:{uuid.uuid4().hex[:8]}:")


def wipe_redis(service: RedisLockService) -> None:
    for key in service.client.scan_iter(match=service.key_prefix + "*"):
        service.client.delete(key)
    service.close()


BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("default", marks=pytest.mark.django_db(transaction=True), id="orm-sqlite"),
    pytest.param(
        "postgres", marks=lane_marks("postgres", databases=["postgres"]), id="orm-postgres"
    ),
    pytest.param("redis", marks=lane_marks("redis"), id="redis"),
]


@pytest.fixture
def service(request: pytest.FixtureRequest) -> Iterator[LockService]:
    backend = request.param
    if backend == "memory":
        made: LockService = InMemoryLockService()
    elif backend == "redis":
        made = redis_service()
    else:
        made = OrmLockService(using=backend)
    yield made
    if isinstance(made, RedisLockService):
        wipe_redis(made)
    else:
        made.close()


@pytest.mark.parametrize("service", BACKENDS, indirect=True)
def test_tricky_names_are_separate_leases(service: LockService) -> None:
    leases = [service.try_acquire(n, o, 60) for n, o in zip(TRICKY, OWNERS, strict=True)]
    assert all(leases), dict(zip(TRICKY, leases, strict=True))
    for name, lease in zip(TRICKY, leases, strict=True):
        assert service.owner_of(name) == lease
        assert service.renew(lease, 60) is not None
    for name, lease in zip(TRICKY, leases, strict=True):
        assert service.release(lease)
        again = service.try_acquire(name, "host-z:app:8080", 60)
        assert again is not None and again.token > lease.token, name


@pytest.mark.parametrize("service", BACKENDS, indirect=True)
@pytest.mark.parametrize("first", ["orders", "orders:fence"])
def test_either_order_of_a_name_and_its_old_counters_name(service: LockService, first) -> None:
    second = "orders:fence" if first == "orders" else "orders"
    held = service.try_acquire(first, OWNERS[0], 60)
    other = service.try_acquire(second, OWNERS[1], 60)
    assert held is not None and other is not None
    assert service.try_acquire(first, OWNERS[1], 60) is None, "still held"
    assert service.owner_of(second).owner == OWNERS[1]


@on_lane("redis")
class TestRedisUpgrade:
    """Counters of the old layout (``lock:{name}:fence``) carry over to ``fence:{name}``."""

    @pytest.fixture
    def redis(self) -> Iterator[RedisLockService]:
        service = redis_service()
        yield service
        wipe_redis(service)

    def test_key_kinds_have_their_own_namespaces(self, redis: RedisLockService) -> None:
        prefix = redis.key_prefix
        assert redis.key("orders") == f"{prefix}lease:orders"
        assert redis.fence_key("orders") == f"{prefix}fence:orders"
        keys = {redis.key(n) for n in TRICKY} | {redis.fence_key(n) for n in TRICKY}
        assert len(keys) == 2 * len(TRICKY)

    def test_the_first_token_starts_above_the_old_counter(self, redis: RedisLockService) -> None:
        redis.client.set(redis.legacy_fence_key("orders"), 41)
        lease = redis.try_acquire("orders", OWNERS[0], 60)
        assert lease.token == 42
        assert redis.client.get(redis.fence_key("orders")) == b"42"
        redis.release(lease)
        redis.client.set(redis.legacy_fence_key("orders"), 1000)  # read once only
        assert redis.try_acquire("orders", OWNERS[1], 60).token == 43

    def test_an_old_lease_hash_is_not_taken_for_a_counter(self, redis: RedisLockService) -> None:
        # Under the old layout, lock:orders:fence was also the hash of lease "orders:fence".
        redis.client.hset(redis.legacy_fence_key("orders"), mapping={"owner": "x", "token": 7})
        assert redis.try_acquire("orders", OWNERS[0], 60).token == 1

    def test_a_new_name_starts_at_one(self, redis: RedisLockService) -> None:
        assert redis.try_acquire("orders:fence", OWNERS[0], 60).token == 1
