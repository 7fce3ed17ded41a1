"""The DLQ store contract on every backend, plus what is specific to each.

Memory; ORM on SQLite, PostgreSQL and MariaDB; Redis (real server); MongoDB on
mongomock (an in-process fake of pymongo: it proves the store's queries and
documents, not a server's behaviour under concurrent writers) and, when
``FLOWWARDEN_TEST_MONGO_URL`` is set, on a live replica set.
"""

import os
import uuid
from datetime import timedelta

import mongomock
import pytest
from django.db import connections

from flowwarden_django.models import DeadLetter as DeadLetterRow
from flowwarden_django.streams.backends.memory import InMemoryDlqStore
from flowwarden_django.streams.backends.mongo import MongoDlqStore
from flowwarden_django.streams.backends.orm import OrmDlqStore
from flowwarden_django.streams.backends.redis import RedisDlqStore
from flowwarden_django.streams.dlq import (
    ACKNOWLEDGED,
    PENDING,
    REPLAYED,
    REPLAYING,
    DeadLetter,
    DlqPolicy,
    DlqStore,
    ErrorInfo,
)
from flowwarden_django.testkit import AsyncDlqStoreContract, DlqStoreContract
from flowwarden_django.testkit.checkpoint_store import now_ms
from flowwarden_django.testkit.dlq_store import DEFAULT_POLICY, full_event, make_event
from tests.streams.async_mongomock import NativeAsyncOnly, NativeOnMongomock
from tests.streams.test_contract_mongo import SerializedCollection
from tests.streams.test_contract_redis import delete_keys, redis_url
from tests.support.lanes import lane_marks, on_lane

# -- memory ----------------------------------------------------------------------------


class TestInMemoryDlqStore(DlqStoreContract):
    def make_store(self):
        return InMemoryDlqStore()


# -- ORM -------------------------------------------------------------------------------


class OrmContract(DlqStoreContract):
    alias = "default"

    def make_store(self):
        return OrmDlqStore(using=self.alias)


@pytest.mark.django_db(transaction=True)
class TestOrmDlqSqlite(OrmContract):
    alias = "default"


@on_lane("postgres", databases=["postgres"])
class TestOrmDlqPostgres(OrmContract):
    alias = "postgres"


@on_lane("mariadb", databases=["mariadb"])
class TestOrmDlqMariadb(OrmContract):
    alias = "mariadb"


ALIASES = [
    pytest.param("default", marks=pytest.mark.django_db(transaction=True), id="sqlite"),
    pytest.param("postgres", marks=lane_marks("postgres", databases=["postgres"]), id="postgres"),
    pytest.param("mariadb", marks=lane_marks("mariadb", databases=["mariadb"]), id="mariadb"),
]


class StatementLog:
    """The statements run on one database alias, seen by an execute wrapper."""

    def __init__(self, alias):
        self.connection = connections[alias]
        self.statements = []

    def __call__(self, execute, sql, params, many, context):
        self.statements.append(sql.lstrip().upper())
        return execute(sql, params, many, context)

    def __enter__(self):
        self.connection.ensure_connection()
        self._wrapper = self.connection.execute_wrapper(self)
        self._wrapper.__enter__()
        return self

    def __exit__(self, *exc):
        self._wrapper.__exit__(*exc)

    def of(self, verb):
        return [sql for sql in self.statements if sql.startswith(verb)]


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize(
    "operation",
    ["claim", "acknowledge", "replayed", "replay-failure", "missing", "wrong-status"],
)
def test_orm_status_change_is_one_update(alias, operation):
    store = OrmDlqStore(using=alias)
    now = now_ms()
    entry = full_event("e1", "s", now)
    store.save(entry, DEFAULT_POLICY)
    if operation in ("replayed", "replay-failure"):
        store.transition("e1", REPLAYING, at=now)
    calls = {
        "claim": lambda: store.transition("e1", REPLAYING, at=now),
        "acknowledge": lambda: store.transition("e1", ACKNOWLEDGED, at=now, by="a", note="n"),
        "replayed": lambda: store.transition("e1", REPLAYED, from_statuses=(REPLAYING,), at=now),
        "replay-failure": lambda: store.record_replay_failure("e1", ErrorInfo("X", "y"), at=now),
        "missing": lambda: store.transition("nope", ACKNOWLEDGED, at=now),
        "wrong-status": lambda: store.transition(
            "e1", REPLAYED, from_statuses=(REPLAYING,), at=now
        ),
    }
    with StatementLog(alias) as log:
        changed = calls[operation]()
    assert changed is (operation not in ("missing", "wrong-status"))
    assert len(log.statements) == 1, log.statements
    assert log.statements[0].startswith("UPDATE"), log.statements


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("existing", [False, True], ids=["new-id", "existing-id"])
def test_orm_save_is_one_upsert_statement(alias, existing):
    store = OrmDlqStore(using=alias)
    now = now_ms()
    if existing:
        store.save(make_event("e1", "old-stream", now, status=ACKNOWLEDGED), DEFAULT_POLICY)
    with StatementLog(alias) as log:
        store.save(full_event("e1", "s", now), DEFAULT_POLICY)
    writes = [sql for sql in log.statements if not sql.startswith(("BEGIN", "SAVEPOINT"))]
    assert len(writes) == 1, log.statements
    assert writes[0].startswith("INSERT INTO"), writes
    assert "ON CONFLICT" in writes[0] or "ON DUPLICATE KEY UPDATE" in writes[0], writes
    assert store.find_by_id("e1") == full_event("e1", "s", now)


@pytest.mark.parametrize("alias", ALIASES)
def test_orm_writes_join_the_callers_transaction(alias):
    from django.db import transaction

    store = OrmDlqStore(using=alias)

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic(using=alias):
        store.save(make_event("e1", "s", now_ms()), DEFAULT_POLICY)
        raise Rollback
    assert store.find_by_id("e1") is None


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_orm_store_follows_the_router(settings):
    """Without ``using``, the router's db_for_write picks the database, for reads too."""
    settings.DATABASE_ROUTERS = ["tests.streams.test_dlq_contract.OtherRouter"]
    store = OrmDlqStore()
    store.save(make_event("routed", "s", now_ms()), DEFAULT_POLICY)
    assert DeadLetterRow.objects.using("other").filter(pk="routed").exists()
    assert not DeadLetterRow.objects.using("default").filter(pk="routed").exists()
    assert store.find_by_id("routed") is not None
    assert store.count("s") == 1


class OtherRouter:
    def db_for_write(self, model, **hints):
        return "other" if model is DeadLetterRow else None

    db_for_read = db_for_write


@pytest.mark.django_db(transaction=True)
def test_orm_stores_bson_bytes_and_plain_columns():
    store = OrmDlqStore(using="default")
    now = now_ms()
    store.save(full_event("e1", "s", now), DEFAULT_POLICY)
    row = DeadLetterRow.objects.get(pk="e1")
    import bson

    assert bson.decode(bytes(row.full_document)) == {"status": "NEW", "amount": 42}
    assert (row.error_type, row.error_message, row.stack_trace) == (
        "RuntimeException",
        "boom",
        "stack trace here",
    )
    assert row.status == PENDING
    assert row.metadata == {"env": "test"}


# -- Redis -----------------------------------------------------------------------------


def new_redis_store():
    return RedisDlqStore(url=redis_url(), key_prefix=f"fwtest:{uuid.uuid4().hex[:8]}:")


@on_lane("redis")
class TestRedisDlqStore(DlqStoreContract):
    def make_store(self):
        return new_redis_store()

    def teardown_store(self, store):
        delete_keys(store)


@on_lane("redis")
class TestRedisDlqSpecifics:
    @pytest.fixture
    def store(self):
        store = new_redis_store()
        yield store
        delete_keys(store)

    def test_entry_key_expires_at_expires_at(self, store):
        now = now_ms()
        expires = now + timedelta(days=7)
        store.save(make_event("e1", "s", now, expires_at=expires), DEFAULT_POLICY)
        store.save(make_event("e2", "s", now), DlqPolicy(retention_days=0))
        expire_time = store.client.pexpiretime(store.key("e1"))
        assert expire_time == int(expires.timestamp() * 1000)
        assert store.client.pttl(store.key("e2")) == -1, "no retention: no TTL"

    def test_layout(self, store):
        now = now_ms()
        store.save(full_event("e1", "orders", now), DEFAULT_POLICY)
        raw = store.client.hgetall(store.key("e1"))
        assert store.key("e1") == f"{store.key_prefix}dlq:e1"
        assert raw[b"streamName"] == b"orders"
        assert raw[b"createdAt"] == str(int(now.timestamp() * 1000)).encode()
        assert b"expiresAt" not in raw
        assert store.client.zscore(store.stream_key("orders"), "e1") == int(now.timestamp() * 1000)
        assert store.client.zscore(store.pending_key("orders"), "e1") == float("inf")
        store.transition("e1", ACKNOWLEDGED, at=now)
        assert store.client.zscore(store.pending_key("orders"), "e1") is None
        assert store.client.zscore(store.stream_key("orders"), "e1") is not None

    def test_an_entry_redis_expired_is_skipped_and_cleaned(self, store):
        now = now_ms()
        store.save(make_event("live", "s", now), DEFAULT_POLICY)
        store.save(
            make_event("gone", "s", now, expires_at=now - timedelta(seconds=1)), DEFAULT_POLICY
        )
        assert not store.client.exists(store.key("gone")), "expiry in the past deletes at once"
        assert store.count("s") == 1
        assert store.client.zscore(store.pending_key("s"), "gone") is None, "cleaned by count"
        assert [e.id for e in store.find_by_stream("s")] == ["live"]
        assert store.client.zscore(store.stream_key("s"), "gone") is None, "cleaned by the read"
        assert not store.transition("gone", ACKNOWLEDGED, at=now)
        assert store.purge_expired(now) == 1, "the purge reports what Redis expired"
        assert store.client.zcard(store.expiry_key("s")) == 0

    def test_a_ttl_set_by_redis_itself_is_honoured(self, store):
        """An entry whose hash vanished (TTL, eviction) leaves every read at once."""
        now = now_ms()
        store.save(make_event("e1", "s", now, expires_at=now + timedelta(days=1)), DEFAULT_POLICY)
        store.client.delete(store.key("e1"))
        assert store.find_by_id("e1") is None
        assert store.find_by_stream("s") == []

    def test_ids_with_a_colon_are_refused(self, store):
        with pytest.raises(ValueError):
            store.save(make_event("a:b", "s", now_ms()), DEFAULT_POLICY)
        assert store.find_by_id("stream:s") is None

    def test_purge_works_in_batches(self, store, monkeypatch):
        from flowwarden_django.streams.backends import _redis_dlq

        monkeypatch.setattr(_redis_dlq, "PURGE_BATCH", 3)
        now = now_ms()
        for i in range(8):
            entry = make_event(f"e{i}", f"s{i % 2}", now, expires_at=now + timedelta(hours=1))
            store.save(entry, DEFAULT_POLICY)
        store.save(make_event("keep", "s0", now), DEFAULT_POLICY)
        assert store.purge_expired(now + timedelta(hours=2)) == 8
        assert [e.id for e in store.find_by_stream("s0")] == ["keep"]
        assert store.client.sismember(store.streams_key(), "s0")
        assert not store.client.sismember(store.streams_key(), "s1")

    def test_default_prefix_and_cache_alias(self):
        store = RedisDlqStore(cache="redis")
        assert store.key_prefix == "fw:"
        assert store.client.ping()

    def test_only_one_connection_option(self):
        with pytest.raises(TypeError):
            RedisDlqStore(url="redis://x", cache="redis")


# -- MongoDB ---------------------------------------------------------------------------


class MongomockDlqStore(MongoDlqStore):
    def _open(self):
        return SerializedCollection(super()._open())


class TestMongoDlqStoreOnMongomock(DlqStoreContract):
    """Reported as mongomock: a fake, not a MongoDB server (it emulates the TTL index)."""

    native_expiry = True

    def make_store(self):
        return MongomockDlqStore(client=mongomock.MongoClient(), database="fwtest")


@on_lane("mongo_live")
class TestMongoDlqStoreLive(DlqStoreContract):
    native_expiry = True

    def make_store(self):
        return MongoDlqStore(
            url=os.environ["FLOWWARDEN_TEST_MONGO_URL"],
            database="fwtest",
            collection=f"_fw_dlq_{uuid.uuid4().hex[:8]}",
        )

    def teardown_store(self, store):
        store.collection.drop()
        store.close()


class TestMongoDlqSpecifics:
    """On mongomock."""

    @pytest.fixture
    def store(self):
        return MongoDlqStore(client=mongomock.MongoClient(), database="fwtest")

    def test_indexes_are_created_once_on_first_use(self, store):
        store.save(make_event("e1", "s", now_ms()), DEFAULT_POLICY)
        indexes = store.collection.index_information()
        ttl = [i for i in indexes.values() if i["key"] == [("expiresAt", 1)]]
        assert len(ttl) == 1 and ttl[0]["expireAfterSeconds"] == 0
        assert any(i["key"] == [("streamName", 1), ("status", 1)] for i in indexes.values())
        calls = []
        store.create_indexes = lambda collection: calls.append(collection)
        store.count("s")
        store.find_by_id("e1")
        assert calls == [], "indexes are created once, not on every call"

    def test_layout_matches_the_reference(self, store):
        now = now_ms()
        store.save(full_event("e1", "orders", now), DEFAULT_POLICY)
        document = store.collection.find_one({"_id": "e1"})
        assert store.collection.name == "_fw_dlq"
        assert set(document) == {
            "_id",
            "streamName",
            "operationType",
            "documentKey",
            "fullDocument",
            "resumeToken",
            "error",
            "attempts",
            "status",
            "firstAttemptAt",
            "lastAttemptAt",
            "createdAt",
            "expiresAt",
            "metadata",
            "replayCount",
            "lastReplayedAt",
            "resolvedAt",
            "resolvedBy",
            "note",
        }
        assert document["error"] == {
            "type": "RuntimeException",
            "message": "boom",
            "stackTrace": "stack trace here",
        }
        assert document["fullDocument"] == {"status": "NEW", "amount": 42}
        assert document["documentKey"] == {"_id": "doc-w1"}

    def test_status_change_is_filtered_on_status(self, store):
        """The compare-and-set is in the update's filter: one round trip, no read."""
        now = now_ms()
        store.save(make_event("e1", "s", now), DEFAULT_POLICY)
        seen = []
        real = store.collection.update_one

        def update_one(query, update, *args, **kwargs):
            seen.append(query)
            return real(query, update, *args, **kwargs)

        store.collection.update_one = update_one
        assert store.transition("e1", REPLAYING, at=now)
        assert not store.transition("e1", REPLAYING, at=now)
        assert seen == [{"_id": "e1", "status": {"$in": [PENDING]}}] * 2

    def test_purge_deletes_what_the_ttl_monitor_has_not_yet(self, store):
        """The server's TTL monitor runs once a minute; the purge does not wait for it."""
        store.create_indexes = lambda collection: None  # mongomock applies TTL indexes at once
        now = now_ms()
        store.save(make_event("old", "s", now, expires_at=now - timedelta(hours=1)), DEFAULT_POLICY)
        store.save(make_event("new", "s", now, expires_at=now + timedelta(hours=1)), DEFAULT_POLICY)
        assert store.purge_expired(now) == 1
        assert store.find_by_id("old") is None
        assert store.find_by_id("new") is not None

    def test_url_needs_exactly_one_connection(self):
        with pytest.raises(TypeError):
            MongoDlqStore()
        with pytest.raises(TypeError):
            MongoDlqStore(url="mongodb://x", client=mongomock.MongoClient())


# -- registry ----------------------------------------------------------------------------


def test_default_alias_is_the_orm_store(settings):
    from flowwarden_django.streams.stores import dlq_stores

    dlq_stores.reset()
    try:
        assert isinstance(dlq_stores["default"], OrmDlqStore)
    finally:
        dlq_stores.reset()


@pytest.mark.parametrize(
    "store", [InMemoryDlqStore, OrmDlqStore, RedisDlqStore, MongoDlqStore], ids=lambda c: c.__name__
)
def test_every_backend_is_a_full_dlq_store(store):
    assert issubclass(store, DlqStore)
    assert store.supports_replay and store.supports_count
    assert isinstance(make_event("x", "s", now_ms()), DeadLetter)


# -- the contract through the async API, on every backend ------------------------------


class TestInMemoryDlqStoreAsync(AsyncDlqStoreContract, TestInMemoryDlqStore):
    pass


class TestOrmDlqSqliteAsync(AsyncDlqStoreContract, TestOrmDlqSqlite):
    pass


class TestOrmDlqPostgresAsync(AsyncDlqStoreContract, TestOrmDlqPostgres):
    pass


class TestOrmDlqMariadbAsync(AsyncDlqStoreContract, TestOrmDlqMariadb):
    pass


class TestRedisDlqStoreAsync(AsyncDlqStoreContract, TestRedisDlqStore):
    pass


class TestMongoDlqStoreOnMongomockAsync(AsyncDlqStoreContract, TestMongoDlqStoreOnMongomock):
    """A ready (mongomock) ``client``: the thread-based fallback. Reported as mongomock:
    a fake, not a MongoDB server."""


class NativeMongomockDlqStore(NativeOnMongomock, MongomockDlqStore):
    pass


class TestMongoDlqStoreOnMongomockNativeAsync(
    NativeAsyncOnly, AsyncDlqStoreContract, TestMongoDlqStoreOnMongomock
):
    """The native path, on mongomock behind the async API (``async_mongomock``)."""

    def make_store(self):
        return NativeMongomockDlqStore(client=mongomock.MongoClient(), database="fwtest")


class TestMongoDlqStoreLiveAsync(NativeAsyncOnly, AsyncDlqStoreContract, TestMongoDlqStoreLive):
    """The native path (an ``AsyncMongoClient`` from the url) on a live server."""
