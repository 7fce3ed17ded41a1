"""The Redis lock service and dead-letter store run their ``a…`` operations on a
``redis.asyncio`` client, one per event loop, as the Redis checkpoint store does
(``TestRedisNativeAsync`` in ``test_contract_redis``)."""

import asyncio
import logging
import threading
import uuid
from datetime import timedelta

import pytest

from flowwarden_django.streams.backends.redis import RedisDlqStore, RedisLockService
from flowwarden_django.streams.dlq import (
    ACKNOWLEDGED,
    PENDING,
    REPLAYED,
    REPLAYING,
    DlqStore,
    ErrorInfo,
)
from flowwarden_django.streams.locks import Lease, LeaseLostError, LockService
from flowwarden_django.testkit.checkpoint_store import now_ms
from flowwarden_django.testkit.dlq_store import DEFAULT_POLICY, make_event
from flowwarden_django.testkit.lock_service import A, B
from tests.streams.test_contract_redis import delete_keys, redis_url
from tests.support.lanes import on_lane


def prefix():
    return f"fwtest:{uuid.uuid4().hex[:8]}:"


def refuse_thread_path(monkeypatch, base):
    """The base class's default (the sync operation in a thread) fails the test."""

    async def refuse(self, method, /, *args, **kwargs):
        raise AssertionError(f"{method.__name__} ran through the thread-based default")

    monkeypatch.setattr(base, "_run_sync", refuse)


def unmirrorable_client():
    """A sync client whose pool the async client cannot copy (a connect callback)."""
    import redis

    return redis.Redis.from_url(
        redis_url(), redis_connect_func=lambda connection: connection.on_connect()
    )


# -- the lock service --------------------------------------------------------------------

LOCK_NATIVE_ASYNC = ("atry_acquire", "arenew", "arelease", "aowner_of", "ais_current")


@on_lane("redis")
class TestRedisLockServiceNativeAsync:
    @pytest.fixture
    def service(self):
        service = RedisLockService(url=redis_url(), key_prefix=prefix())
        yield service
        delete_keys(service)

    @pytest.fixture
    def no_thread_path(self, monkeypatch):
        refuse_thread_path(monkeypatch, LockService)

    @pytest.mark.parametrize("name", LOCK_NATIVE_ASYNC)
    def test_the_operation_is_overridden(self, name):
        assert getattr(RedisLockService, name) is not getattr(LockService, name)

    def test_every_operation_runs_on_the_loop_without_the_sync_client(
        self, service, no_thread_path
    ):
        async def scenario():
            lease = await service.atry_acquire("orders", A, 60)
            assert lease.owner == A
            assert await service.atry_acquire("orders", B, 60) is None
            again = await service.atry_acquire("orders", A, 60)
            assert again.token == lease.token  # the same tenure, refreshed
            renewed = await service.arenew(lease, 120)
            assert renewed.token == lease.token
            assert renewed.acquired_at == lease.acquired_at
            assert renewed.expires_at > lease.expires_at
            assert await service.aowner_of("orders") == renewed
            assert await service.ais_current(lease)
            async with service.aguard(lease):
                pass
            assert await service.arelease(lease)
            assert not await service.arelease(lease)
            assert await service.arenew(lease, 60) is None
            assert await service.aowner_of("orders") is None
            assert not await service.ais_current(lease)
            with pytest.raises(LeaseLostError):
                async with service.aguard(lease):
                    pass
            with pytest.raises(ValueError):
                await service.atry_acquire("orders", "", 60)
            taken = await service.atry_acquire("orders", B, 60)
            assert taken.token == lease.token + 1  # the fence outlives the release
            return taken, threading.get_ident()

        taken, ident = asyncio.run(scenario())
        assert ident == threading.get_ident()
        assert service._client is None  # the sync client was never opened
        # The same keys and fields as the sync path: the sync client reads them back.
        assert service.owner_of("orders") == taken
        assert service.client.get(service.fence_key("orders")) == str(taken.token).encode()
        assert service.try_acquire("orders", A, 60) is None
        assert service.release(taken)
        assert service.try_acquire("orders", A, 60).token == taken.token + 1

    def test_one_client_per_loop_closed_with_its_loop(self, service, no_thread_path):
        async def scenario(name, seen):
            first = await service.async_client()
            assert await service.async_client() is first
            seen.append(first.client)
            return await service.atry_acquire(name, A, 60)

        seen = []
        one = asyncio.run(scenario("one", seen))
        assert not service._async_clients  # closed and dropped when the loop ended
        two = asyncio.run(scenario("two", seen))
        assert seen[0] is not seen[1]
        assert not service._async_clients
        assert asyncio.run(service.aowner_of("one")) == one
        assert asyncio.run(service.aowner_of("two")) == two

    def test_close_drops_the_async_clients(self, service, no_thread_path):
        async def scenario():
            assert await service.aowner_of("orders") is None
            assert service._async_clients
            service.close()
            assert not service._async_clients
            assert await service.aowner_of("orders") is None  # a fresh client

        asyncio.run(scenario())

    def test_cache_alias_gets_a_native_client(self, no_thread_path):
        service = RedisLockService(cache="redis", key_prefix=prefix())

        async def scenario():
            lease = await service.atry_acquire("orders", A, 60)
            return lease, await service.aowner_of("orders")

        try:
            lease, owner = asyncio.run(scenario())
            assert owner == lease
        finally:
            delete_keys(service)

    def test_redis_errors_as_in_the_sync_path(self, no_thread_path, caplog):
        """Acquire and renew log and return ``None``; release and owner_of raise."""
        from redis.exceptions import RedisError

        service = RedisLockService(url="redis://127.0.0.1:1/0")
        now = now_ms()
        held = Lease("orders", A, 1, now, now + timedelta(seconds=60))

        async def scenario():
            assert await service.async_client() is not None
            with caplog.at_level(logging.WARNING):
                assert await service.atry_acquire("orders", A, 60) is None
            assert "acquire of the lease on 'orders' failed" in caplog.text
            with caplog.at_level(logging.WARNING):
                assert await service.arenew(held, 60) is None
            assert "renewal of the lease on 'orders' failed" in caplog.text
            with pytest.raises(RedisError):
                await service.arelease(held)
            with pytest.raises(RedisError):
                await service.aowner_of("orders")
            with pytest.raises(RedisError):
                await service.ais_current(held)

        asyncio.run(scenario())
        service.close()

    def test_a_client_that_cannot_be_mirrored_falls_back_to_a_thread(self):
        client = unmirrorable_client()
        service = RedisLockService(client=client, key_prefix=prefix())

        async def scenario():
            assert await service.async_client() is None
            lease = await service.atry_acquire("orders", A, 60)
            assert await service.ais_current(lease)
            assert await service.arelease(lease)
            return threading.get_ident()

        try:
            assert asyncio.run(scenario()) == threading.get_ident()
        finally:
            delete_keys(service)
            client.close()


# -- the dead-letter store ---------------------------------------------------------------

DLQ_NATIVE_ASYNC = (
    "asave",
    "afind_by_id",
    "afind_by_stream",
    "acount",
    "atransition",
    "arecord_replay_failure",
    "apurge_expired",
    "adelete",
)


@on_lane("redis")
class TestRedisDlqStoreNativeAsync:
    @pytest.fixture
    def store(self):
        store = RedisDlqStore(url=redis_url(), key_prefix=prefix())
        yield store
        delete_keys(store)

    @pytest.fixture
    def no_thread_path(self, monkeypatch):
        refuse_thread_path(monkeypatch, DlqStore)

    @pytest.mark.parametrize("name", DLQ_NATIVE_ASYNC)
    def test_the_operation_is_overridden(self, name):
        assert getattr(RedisDlqStore, name) is not getattr(DlqStore, name)

    def test_every_operation_runs_on_the_loop_without_the_sync_client(
        self, store, no_thread_path, monkeypatch
    ):
        from flowwarden_django.streams.backends import _redis_dlq

        monkeypatch.setattr(_redis_dlq, "READ_BATCH", 2)
        monkeypatch.setattr(_redis_dlq, "PURGE_BATCH", 2)
        now = now_ms()
        later = now + timedelta(hours=1)

        async def scenario():
            for i in range(5):
                entry = make_event(f"e{i}", "s", now + timedelta(seconds=i))
                await store.asave(entry, DEFAULT_POLICY)
            for i in range(3):
                entry = make_event(f"x{i}", "t", now, expires_at=later)
                await store.asave(entry, DEFAULT_POLICY)
            assert (await store.afind_by_id("e0")).stream_name == "s"
            assert await store.afind_by_id("missing") is None
            assert await store.afind_by_id("stream:s") is None
            with pytest.raises(ValueError):
                await store.asave(make_event("a:b", "s", now), DEFAULT_POLICY)
            listed = await store.afind_by_stream("s")
            assert [e.id for e in listed] == ["e4", "e3", "e2", "e1", "e0"]
            assert [e.id for e in await store.afind_by_stream("s", limit=3)] == ["e4", "e3", "e2"]
            assert await store.acount("s") == 5
            assert await store.atransition("e1", ACKNOWLEDGED, at=now, by="me", note="ok")
            assert not await store.atransition("e1", ACKNOWLEDGED, at=now)
            assert not await store.atransition("a:b", ACKNOWLEDGED, at=now)
            assert await store.atransition("e2", REPLAYING, at=now)
            assert await store.arecord_replay_failure("e2", ErrorInfo("Boom", "again"), at=now)
            assert await store.atransition("e3", REPLAYING, at=now)
            assert await store.atransition("e3", REPLAYED, from_statuses=(REPLAYING,), at=now)
            pending = await store.afind_by_stream("s", status=PENDING)
            assert [e.id for e in pending] == ["e4", "e2", "e0"]
            assert await store.acount("s") == 3
            settled = await store.afind_by_id("e1")
            assert (settled.status, settled.resolved_by, settled.note) == (ACKNOWLEDGED, "me", "ok")
            failed = await store.afind_by_id("e2")
            assert (failed.status, failed.error.type, failed.replay_count) == (PENDING, "Boom", 1)
            assert (await store.afind_by_id("e3")).replay_count == 1
            await store.adelete("e0")
            await store.adelete("a:b")
            assert await store.afind_by_id("e0") is None
            assert await store.apurge_expired(later + timedelta(seconds=1)) == 3
            assert await store.afind_by_stream("t") == []
            return threading.get_ident()

        assert asyncio.run(scenario()) == threading.get_ident()
        assert store._client is None  # the sync client was never opened
        # The same keys and indexes as the sync path: the sync client reads them back.
        assert [e.id for e in store.find_by_stream("s")] == ["e4", "e3", "e2", "e1"]
        assert store.count("s") == 2
        assert not store.client.exists(store.key("x0"))
        assert store.client.zcard(store.expiry_key("t")) == 0

    def test_stale_ids_are_dropped_by_the_read(self, store, no_thread_path):
        now = now_ms()
        store.save(make_event("live", "s", now), DEFAULT_POLICY)
        store.save(make_event("gone", "s", now), DEFAULT_POLICY)
        store.client.delete(store.key("gone"))

        async def scenario():
            return [e.id for e in await store.afind_by_stream("s")]

        assert asyncio.run(scenario()) == ["live"]
        assert store.client.zscore(store.stream_key("s"), "gone") is None

    def test_one_client_per_loop_closed_with_its_loop(self, store, no_thread_path):
        now = now_ms()

        async def scenario(entry_id, seen):
            first = await store.async_client()
            assert await store.async_client() is first
            seen.append(first.client)
            await store.asave(make_event(entry_id, "s", now), DEFAULT_POLICY)
            return await store.acount("s")

        seen = []
        assert asyncio.run(scenario("one", seen)) == 1
        assert not store._async_clients  # closed when the loop ended
        assert asyncio.run(scenario("two", seen)) == 2
        assert seen[0] is not seen[1]
        assert not store._async_clients

    def test_close_drops_the_async_clients(self, store, no_thread_path):
        async def scenario():
            assert await store.afind_by_id("a") is None
            assert store._async_clients
            store.close()
            assert not store._async_clients
            assert await store.afind_by_id("a") is None  # a fresh client

        asyncio.run(scenario())

    def test_cache_alias_gets_a_native_client(self, no_thread_path):
        store = RedisDlqStore(cache="redis", key_prefix=prefix())

        async def scenario():
            await store.asave(make_event("e1", "s", now_ms()), DEFAULT_POLICY)
            return await store.acount("s")

        try:
            assert asyncio.run(scenario()) == 1
        finally:
            delete_keys(store)

    def test_a_client_that_cannot_be_mirrored_falls_back_to_a_thread(self):
        client = unmirrorable_client()
        store = RedisDlqStore(client=client, key_prefix=prefix())

        async def scenario():
            assert await store.async_client() is None
            await store.asave(make_event("e1", "s", now_ms()), DEFAULT_POLICY)
            return (await store.afind_by_id("e1")).id, threading.get_ident()

        try:
            assert asyncio.run(scenario()) == ("e1", threading.get_ident())
        finally:
            delete_keys(store)
            client.close()
