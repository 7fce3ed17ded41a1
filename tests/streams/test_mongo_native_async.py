"""The MongoDB backends run their ``a…`` operations natively on pymongo's
``AsyncMongoClient``, one per event loop, and fall back to the thread-based default
when handed a ready sync ``client``.

The native contract suites run in the contract modules (``…NativeAsync`` twins, on
``async_mongomock`` and on the live lane); here: the per-loop clients, their closing,
what the url-made client is, and the fallback.
"""

import asyncio
import logging
from datetime import timedelta

import mongomock
import pytest

from flowwarden_django.streams.backends.mongo import (
    MongoCheckpointStore,
    MongoDlqStore,
    MongoLockService,
)
from flowwarden_django.streams.checkpoint import CheckpointStore
from flowwarden_django.streams.dlq import DlqStore
from flowwarden_django.streams.locks import Lease, LockService
from flowwarden_django.testkit.checkpoint_store import now_ms, token
from flowwarden_django.testkit.dlq_store import DEFAULT_POLICY, make_event
from flowwarden_django.testkit.lock_service import A
from tests.streams.async_mongomock import NativeOnMongomock, refuse_thread_path

UNREACHABLE = "mongodb://127.0.0.1:1/fwnative"
FAST_FAIL = {"serverSelectionTimeoutMS": 100}


class RecordingStore(NativeOnMongomock, MongoCheckpointStore):
    """Native on mongomock; keeps every async client it made."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.made = []

    def async_client_factory(self):
        make = super().async_client_factory()

        def recorded():
            client = make()
            self.made.append(client)
            return client

        return recorded


class NativeDlqStore(NativeOnMongomock, MongoDlqStore):
    pass


@pytest.fixture
def store():
    return RecordingStore(client=mongomock.MongoClient(), database="fwtest")


@pytest.fixture
def no_thread_path(monkeypatch):
    refuse_thread_path(monkeypatch)


@pytest.mark.parametrize(
    ("backend", "base", "names"),
    [
        (
            MongoCheckpointStore,
            CheckpointStore,
            "asave afind adelete alist_checkpoints asave_seen asave_processed "
            "asave_heartbeat areset_after_history_lost asave_initial_sync",
        ),
        (
            MongoDlqStore,
            DlqStore,
            "asave afind_by_id afind_by_stream acount atransition arecord_replay_failure "
            "apurge_expired adelete",
        ),
        (MongoLockService, LockService, "atry_acquire arenew arelease aowner_of ais_current"),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else "",
)
def test_every_async_operation_is_overridden(backend, base, names):
    for name in names.split():
        assert getattr(backend, name) is not getattr(base, name), name
    assert backend.async_thread_sensitive is False


# -- one client per loop, closed with it -------------------------------------------------


def test_one_client_per_loop_closed_with_its_loop(store, no_thread_path):
    async def scenario(name):
        made = len(store.made)
        await store.async_collection()
        await store.async_collection()
        assert len(store.made) == made + 1  # one client on this loop
        await store.asave_processed(name, token(name), now_ms())
        return await store.afind(name)

    assert asyncio.run(scenario("one")).last_processed_token == token("one")
    assert len(store.made) == 1 and store.made[0].closed
    assert not store._async_clients._loops  # dropped when the loop ended
    assert asyncio.run(scenario("two")).last_processed_token == token("two")
    assert len(store.made) == 2 and store.made[1].closed
    assert not store._async_clients._loops
    # What the native path wrote, the sync path reads.
    assert [cp.stream_name for cp in store.list_checkpoints()] == ["one", "two"]


def test_aclose_closes_the_loops_client(store, no_thread_path):
    async def scenario():
        assert await store.afind("s") is None
        await store.aclose()
        assert store.made[0].closed
        assert await store.afind("s") is None  # a new client
        assert len(store.made) == 2 and not store.made[1].closed

    asyncio.run(scenario())
    assert store.made[1].closed


def test_close_drops_the_async_clients(store, no_thread_path):
    async def scenario():
        assert await store.afind("s") is None
        store.close()
        assert not store._async_clients._loops
        for _ in range(20):  # the old client is closed on its loop, soon
            if store.made[0].closed:
                break
            await asyncio.sleep(0)
        assert store.made[0].closed
        assert await store.afind("s") is None  # a new client
        assert len(store.made) == 2

    asyncio.run(scenario())


def test_dlq_indexes_are_created_once_on_the_async_path(no_thread_path):
    store = NativeDlqStore(client=mongomock.MongoClient(), database="fwtest")
    calls = []
    real = MongoDlqStore.acreate_indexes

    async def counted(collection):
        calls.append(collection)
        await real(collection)

    store.acreate_indexes = counted

    async def scenario(entry_id):
        await store.asave(make_event(entry_id, "s", now_ms()), DEFAULT_POLICY)
        return await store.acount("s")

    assert asyncio.run(scenario("e1")) == 1
    assert asyncio.run(scenario("e2")) == 2  # another loop, another client: no new indexes
    assert len(calls) == 1
    keys = [i["key"] for i in store.collection.index_information().values()]
    assert [("expiresAt", 1)] in keys and [("streamName", 1), ("status", 1)] in keys


# -- the client made from the url -------------------------------------------------------


def test_the_url_makes_an_async_client_per_loop_with_the_same_settings(no_thread_path):
    from pymongo import AsyncMongoClient
    from pymongo.asynchronous.collection import AsyncCollection

    store = MongoCheckpointStore(url=UNREACHABLE, client_options=FAST_FAIL, write_concern=1)

    async def scenario():
        collection = await store.async_collection()
        assert isinstance(collection, AsyncCollection)
        assert (collection.database.name, collection.name) == ("fwnative", "_fw_checkpoints")
        assert collection.write_concern.document == {"w": 1}
        client = collection.database.client
        assert isinstance(client, AsyncMongoClient)
        assert client.options.server_selection_timeout == 0.1
        assert (await store.async_collection()).database.client is client
        return client

    one, two = asyncio.run(scenario()), asyncio.run(scenario())
    assert one is not two
    assert not store._async_clients._loops
    assert store._client is None  # the sync client was never made


@pytest.mark.parametrize(
    ("operation", "warning"),
    [
        (lambda service, lease: service.atry_acquire("orders", A, 60), "acquire"),
        (lambda service, lease: service.arenew(lease, 60), "renewal"),
        (lambda service, lease: service.arelease(lease), None),
        (lambda service, lease: service.aowner_of("orders"), None),
        (lambda service, lease: service.ais_current(lease), None),
    ],
    ids=["acquire", "renew", "release", "owner_of", "is_current"],
)
def test_lock_errors_as_in_the_sync_path(operation, warning, no_thread_path, caplog):
    """An unreachable server: acquire and renew log and give ``None``, the rest raise."""
    from pymongo.errors import PyMongoError

    service = MongoLockService(url=UNREACHABLE, client_options=FAST_FAIL)
    now = now_ms()
    lease = Lease("orders", A, 1, now, now + timedelta(seconds=60))

    async def scenario():
        if warning is None:
            with pytest.raises(PyMongoError):
                await operation(service, lease)
            return
        with caplog.at_level(logging.WARNING):
            assert await operation(service, lease) is None
        assert f"{warning} of the lease on 'orders' failed" in caplog.text

    asyncio.run(scenario())
    service.close()


def test_an_empty_owner_is_refused_before_any_io(no_thread_path):
    service = MongoLockService(url=UNREACHABLE, client_options=FAST_FAIL)
    with pytest.raises(ValueError):
        asyncio.run(service.atry_acquire("orders", "", 60))


# -- the fallback: a ready sync client ---------------------------------------------------


@pytest.mark.parametrize("backend", [MongoCheckpointStore, MongoDlqStore, MongoLockService])
def test_a_ready_client_has_no_async_client(backend):
    made = backend(client=mongomock.MongoClient(), database="fwtest")
    assert made.async_client_factory() is None
    assert asyncio.run(made.async_collection()) is None


def test_a_ready_client_falls_back_to_the_thread_based_default(monkeypatch):
    """Every operation goes through the base class's ``_run_sync`` (the sync operation
    on the default executor) and gives the sync answers."""
    ran = []

    def spy(base):
        default = base._run_sync

        async def recorded(self, method, /, *args, **kwargs):
            ran.append(method.__name__)
            return await default(self, method, *args, **kwargs)

        monkeypatch.setattr(base, "_run_sync", recorded)

    for base in (CheckpointStore, DlqStore, LockService):
        spy(base)
    client = mongomock.MongoClient()
    checkpoints = MongoCheckpointStore(client=client, database="fwtest")
    dlq = MongoDlqStore(client=client, database="fwtest")
    locks = MongoLockService(client=client, database="fwtest")

    async def scenario():
        await checkpoints.asave_seen("s", token("a"), now_ms())
        await dlq.asave(make_event("e1", "s", now_ms()), DEFAULT_POLICY)
        lease = await locks.atry_acquire("orders", A, 60)
        return (
            (await checkpoints.afind("s")).last_seen_token,
            await dlq.acount("s"),
            await locks.ais_current(lease),
        )

    assert asyncio.run(scenario()) == (token("a"), 1, True)
    assert ran == [
        "save_seen",
        "save",
        "try_acquire",
        "find",
        "count",
        "is_current",
    ]
