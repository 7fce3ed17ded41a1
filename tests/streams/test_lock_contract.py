"""The lock-service contract on every backend, plus backend-specific checks.

Memory; ORM on SQLite, PostgreSQL and MariaDB; Redis (real server); MongoDB on
mongomock (an in-process fake: it checks the queries and documents, not a
server's behaviour under concurrent writers) and on a live replica set when
``FLOWWARDEN_TEST_MONGO_URL`` is set.
"""

import logging
import os
import threading
import time
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import mongomock
import pytest
from django.db import OperationalError, connections

from flowwarden_django.models import StreamLease
from flowwarden_django.streams.backends.memory import InMemoryLockService
from flowwarden_django.streams.backends.mongo import MongoLockService
from flowwarden_django.streams.backends.orm import OrmLockService
from flowwarden_django.streams.backends.redis import RedisLockService
from flowwarden_django.streams.locks import LeaseLostError
from flowwarden_django.testkit import AsyncLockServiceContract, LockServiceContract
from flowwarden_django.testkit.lock_service import A, B
from tests.streams.async_mongomock import NativeAsyncOnly, NativeOnMongomock
from tests.streams.test_contract_mongo import SerializedCollection
from tests.support.lanes import lane_marks, on_lane
from tests.support.services import redis_url

# -- memory -----------------------------------------------------------------------


class TestInMemoryLockService(LockServiceContract):
    def make_service(self):
        return InMemoryLockService()


class FakeClock:
    def __init__(self):
        self.now = datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self):
        return self.now


def test_memory_service_takes_an_injected_clock():
    clock = FakeClock()
    service = InMemoryLockService(now=clock)
    lease = service.try_acquire("s", A, 60)
    assert lease.acquired_at == clock.now
    clock.now += timedelta(seconds=59)
    assert service.try_acquire("s", B, 60) is None
    clock.now += timedelta(seconds=1)
    assert service.owner_of("s") is None
    taken = service.try_acquire("s", B, 60)
    assert taken.token == lease.token + 1


# -- ORM ----------------------------------------------------------------------------


class OrmContract(LockServiceContract):
    alias = "default"

    def make_service(self):
        return OrmLockService(using=self.alias)


@pytest.mark.django_db(transaction=True)
class TestOrmLocksSqlite(OrmContract):
    alias = "default"


@on_lane("postgres", databases=["postgres"])
class TestOrmLocksPostgres(OrmContract):
    alias = "postgres"


@on_lane("mariadb", databases=["mariadb"])
class TestOrmLocksMariadb(OrmContract):
    alias = "mariadb"


class WithoutReturning(OrmLockService):
    """The MySQL path (upsert, then a read), run on MariaDB."""

    @staticmethod
    def _returning(connection):
        return False


@on_lane("mariadb", databases=["mariadb"])
class TestOrmLocksMariadbWithoutReturning(OrmContract):
    alias = "mariadb"

    def make_service(self):
        return WithoutReturning(using=self.alias)


ALIASES = [
    pytest.param("default", marks=pytest.mark.django_db(transaction=True), id="sqlite"),
    pytest.param("postgres", marks=lane_marks("postgres", databases=["postgres"]), id="postgres"),
    pytest.param("mariadb", marks=lane_marks("mariadb", databases=["mariadb"]), id="mariadb"),
]


@contextmanager
def recorded_statements(alias):
    """The statements run on *alias*, seen by an execute wrapper (the kept-cursor path)."""
    connection = connections[alias]
    statements = []

    def record(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    connection.ensure_connection()
    with connection.execute_wrapper(record):
        yield statements
    assert not connection.queries_logged
    assert connection.get_autocommit(), "no explicit transaction"


def head(sql):
    return sql.lstrip().split()[0].upper()


OPERATIONS = {
    "acquire-new": lambda s, lease: s.try_acquire("other", A, 60),
    "acquire-refresh": lambda s, lease: s.try_acquire("s", A, 60),
    "acquire-refused": lambda s, lease: s.try_acquire("s", B, 60),
    "renew": lambda s, lease: s.renew(lease, 60),
    "release": lambda s, lease: s.release(lease),
}


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_each_operation_is_one_statement(alias, operation):
    service = OrmLockService(using=alias)
    lease = service.try_acquire("s", A, 60)
    with recorded_statements(alias) as statements:
        OPERATIONS[operation](service, lease)
    assert len(statements) == 1, statements
    expected = "INSERT" if operation.startswith("acquire") else "UPDATE"
    assert head(statements[0]) == expected


@on_lane("mariadb", databases=["mariadb"])
@pytest.mark.parametrize("operation", ["acquire-new", "acquire-refresh", "acquire-refused"])
def test_acquire_without_returning_is_an_upsert_then_a_read(operation):
    service = WithoutReturning(using="mariadb")
    lease = service.try_acquire("s", A, 60)
    with recorded_statements("mariadb") as statements:
        result = OPERATIONS[operation](service, lease)
    assert [head(sql) for sql in statements] == ["INSERT", "SELECT"]
    assert (result is None) == (operation == "acquire-refused")


@pytest.mark.parametrize("alias", ALIASES)
def test_release_keeps_the_row_and_its_token(alias):
    service = OrmLockService(using=alias)
    lease = service.try_acquire("s", A, 60)
    assert service.release(lease)
    row = StreamLease.objects.using(alias).get(pk="s")
    assert (row.owner, row.token, row.expires_at) == ("", lease.token, None)
    assert service.try_acquire("s", B, 60).token == lease.token + 1


@pytest.mark.parametrize("alias", ALIASES)
def test_debug_logging_still_sees_the_statements(alias):
    from django.test.utils import CaptureQueriesContext

    service = OrmLockService(using=alias)
    with CaptureQueriesContext(connections[alias]) as captured:
        lease = service.try_acquire("s", A, 60)
        service.renew(lease, 60)
        service.release(lease)
    assert lease is not None
    assert len(captured.captured_queries) == 3


@pytest.mark.parametrize("alias", ALIASES)
def test_database_errors_become_none_with_a_warning(alias, caplog):
    service = OrmLockService(using=alias)
    lease = service.try_acquire("s", A, 60)

    def fail(execute, sql, params, many, context):
        raise OperationalError("server closed the connection unexpectedly")

    with connections[alias].execute_wrapper(fail), caplog.at_level(logging.WARNING):
        assert service.try_acquire("s", A, 60) is None
        assert service.renew(lease, 60) is None
    assert len([r for r in caplog.records if "treated as not held" in r.getMessage()]) == 2
    assert service.owner_of("s") == lease
    assert service.renew(lease, 60) is not None, "the kept cursor is replaced after an error"


@pytest.mark.parametrize("alias", ALIASES)
def test_writes_survive_a_closed_connection(alias):
    service = OrmLockService(using=alias)
    lease = service.try_acquire("s", A, 60)
    connections[alias].close()
    assert service.renew(lease, 60) is not None


# -- ORM guard: a takeover waits for the guarded transaction --------------------------


def waiting_on_a_lock(alias, connection_id):
    """Whether the session *connection_id* is blocked on a row lock (server's own view)."""
    with connections[alias].cursor() as cursor:
        if connections[alias].vendor == "postgresql":
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", [connection_id]
            )
        else:
            # innodb_trx does not always list an autocommit statement that waits (it
            # is a cache refreshed at most every 100 ms, and MariaDB may register the
            # transaction late), so the session list is asked too: the contender's
            # session still executing its statement is a session blocked on the row.
            cursor.execute(
                "SELECT (SELECT count(*) FROM information_schema.innodb_trx "
                "        WHERE trx_mysql_thread_id = %s AND trx_state = 'LOCK WAIT')"
                " + (SELECT count(*) FROM information_schema.processlist "
                "    WHERE id = %s AND command = 'Query' AND info LIKE 'INSERT%%')",
                [connection_id, connection_id],
            )
        return cursor.fetchone()[0] > 0


def session_id(alias):
    connection = connections[alias]
    connection.ensure_connection()
    if connection.vendor == "postgresql":
        return connection.connection.info.backend_pid
    if connection.vendor == "mysql":
        return connection.connection.thread_id()
    return None


def wait_until_blocked(alias, contender_id, thread, taken):
    """Return once the contender is blocked on the lease row (or fail if it went through).

    PostgreSQL and MariaDB show a session waiting on a lock; SQLite does not, so
    there the contender gets a moment to go through (it must not).
    """
    if connections[alias].vendor == "sqlite":
        time.sleep(0.5)
        return
    while not waiting_on_a_lock(alias, contender_id):
        assert thread.is_alive() and not taken, "the takeover did not wait for the guard"
        time.sleep(0.01)


@pytest.mark.parametrize("alias", ALIASES)
def test_guard_holds_off_a_takeover_until_its_transaction_commits(alias):
    """The holder's lease expires inside guard(); a takeover must wait for the commit."""
    service = OrmLockService(using=alias)
    lease = service.try_acquire("s", A, 0.3)
    contender_id = []
    go = threading.Event()
    taken = []

    def contend():
        try:
            contender_id.append(session_id(alias))
            go.wait(60)
            taken.append(service.try_acquire("s", B, 60))
        finally:
            connections.close_all()

    thread = threading.Thread(target=contend, daemon=True)
    thread.start()
    with service.guard(lease):
        time.sleep(max(lease.remaining().total_seconds(), 0) + 0.05)  # the lease has expired
        go.set()
        wait_until_blocked(alias, contender_id[0], thread, taken)
        # Written while the contender waits, under the old token.
        StreamLease.objects.using(alias).create(name="written-under-guard", token=lease.token)
        assert taken == [], "the takeover went through while the guard's transaction was open"
    thread.join(60)
    new = taken[0]
    assert new is not None and new.owner == B
    assert new.token > lease.token
    assert StreamLease.objects.using(alias).filter(pk="written-under-guard").exists()
    with pytest.raises(LeaseLostError), service.guard(lease):
        pass


@pytest.mark.parametrize("alias", ALIASES)
def test_guard_rolls_back_the_block_when_it_raises(alias):
    service = OrmLockService(using=alias)
    lease = service.try_acquire("s", A, 60)
    with pytest.raises(RuntimeError), service.guard(lease):
        StreamLease.objects.using(alias).create(name="rolled-back")
        raise RuntimeError
    assert not StreamLease.objects.using(alias).filter(pk="rolled-back").exists()


# -- Redis ------------------------------------------------------------------------


def delete_keys(service):
    for key in service.client.scan_iter(match=service.key_prefix + "*"):
        service.client.delete(key)
    service.close()


@on_lane("redis")
class TestRedisLockService(LockServiceContract):
    def make_service(self):
        return RedisLockService(url=redis_url(), key_prefix=f"fwtest:{uuid.uuid4().hex[:8]}:")

    def teardown_service(self, service):
        delete_keys(service)


@on_lane("redis")
class TestRedisSpecifics:
    @pytest.fixture
    def service(self):
        service = RedisLockService(url=redis_url(), key_prefix=f"fwtest:{uuid.uuid4().hex[:8]}:")
        yield service
        delete_keys(service)

    def test_layout(self, service):
        lease = service.try_acquire("orders", A, 60)
        raw = service.client.hgetall(service.key("orders"))
        assert service.key("orders") == f"{service.key_prefix}lease:orders"
        assert service.fence_key("orders") == f"{service.key_prefix}fence:orders"
        assert raw == {
            b"owner": A.encode(),
            b"token": str(lease.token).encode(),
            b"acquiredAt": str(int(lease.acquired_at.timestamp() * 1000)).encode(),
            b"expiresAt": str(int(lease.expires_at.timestamp() * 1000)).encode(),
        }
        assert service.client.get(service.fence_key("orders")) == str(lease.token).encode()

    def test_lease_keys_expire_and_the_fence_stays(self, service):
        lease = service.try_acquire("orders", A, 0.3)
        key = service.key("orders")
        assert 0 < service.client.pttl(key) <= 300
        time.sleep(max(lease.remaining().total_seconds(), 0) + 0.1)
        assert service.client.exists(key) == 0
        assert service.client.ttl(service.fence_key("orders")) == -1, "the fence never expires"
        assert service.try_acquire("orders", B, 60).token == lease.token + 1

    def test_renew_moves_the_key_expiry(self, service):
        lease = service.try_acquire("orders", A, 0.3)
        service.renew(lease, 60)
        assert service.client.pttl(service.key("orders")) > 50_000

    def test_release_deletes_the_hash_and_keeps_the_fence(self, service):
        lease = service.try_acquire("orders", A, 60)
        service.release(lease)
        assert service.client.exists(service.key("orders")) == 0
        assert service.client.get(service.fence_key("orders")) == str(lease.token).encode()

    def test_unreachable_server_gives_none_with_a_warning(self, caplog):
        service = RedisLockService(url="redis://127.0.0.1:1/0")
        with caplog.at_level(logging.WARNING):
            assert service.try_acquire("orders", A, 60) is None
        assert "treated as not held" in caplog.text

    def test_default_prefix_and_cache_alias(self):
        service = RedisLockService(cache="redis")
        assert service.key("x") == "fw:lease:x"
        assert service.client.ping()


# -- MongoDB ----------------------------------------------------------------------


class MongomockLocks(MongoLockService):
    def _open(self):
        return SerializedCollection(super()._open())


class TestMongoLockServiceOnMongomock(LockServiceContract):
    """Reported as mongomock: a fake, not a MongoDB server."""

    def make_service(self):
        return MongomockLocks(client=mongomock.MongoClient(), database="fwtest")


@on_lane("mongo_live")
class TestMongoLockServiceLive(LockServiceContract):
    def make_service(self):
        return MongoLockService(
            url=os.environ["FLOWWARDEN_TEST_MONGO_URL"],
            database="fwtest",
            collection=f"_fw_locks_{uuid.uuid4().hex[:8]}",
        )

    def teardown_service(self, service):
        service.collection.drop()
        service.close()


class TestMongoSpecifics:
    """On mongomock."""

    @pytest.fixture
    def service(self):
        return MongoLockService(client=mongomock.MongoClient(), database="fwtest")

    def test_layout(self, service):
        lease = service.try_acquire("orders", A, 60)
        assert service.collection.name == "_fw_locks"
        document = service.collection.find_one({"_id": "orders"})
        assert set(document) == {"_id", "instanceId", "token", "acquiredAt", "expiresAt"}
        assert (document["instanceId"], document["token"]) == (A, lease.token)

    def test_release_keeps_the_document_and_its_token(self, service):
        lease = service.try_acquire("orders", A, 60)
        assert service.release(lease)
        document = service.collection.find_one({"_id": "orders"})
        assert "instanceId" not in document
        assert document["token"] == lease.token
        assert document["expiresAt"].replace(tzinfo=UTC) == datetime(1970, 1, 1, tzinfo=UTC)

    def test_unreachable_server_gives_none_with_a_warning(self, caplog):
        service = MongoLockService(
            url="mongodb://127.0.0.1:1/", client_options={"serverSelectionTimeoutMS": 100}
        )
        with caplog.at_level(logging.WARNING):
            assert service.try_acquire("orders", A, 60) is None
        assert "treated as not held" in caplog.text
        service.close()

    def test_needs_exactly_one_connection(self):
        with pytest.raises(TypeError):
            MongoLockService()
        with pytest.raises(TypeError):
            MongoLockService(url="mongodb://x", client=mongomock.MongoClient())


# -- the contract through the async API, on every backend ------------------------------


class TestInMemoryLockServiceAsync(AsyncLockServiceContract, TestInMemoryLockService):
    pass


class TestOrmLocksSqliteAsync(AsyncLockServiceContract, TestOrmLocksSqlite):
    pass


class TestOrmLocksPostgresAsync(AsyncLockServiceContract, TestOrmLocksPostgres):
    pass


class TestOrmLocksMariadbAsync(AsyncLockServiceContract, TestOrmLocksMariadb):
    pass


class TestOrmLocksMariadbWithoutReturningAsync(
    AsyncLockServiceContract, TestOrmLocksMariadbWithoutReturning
):
    pass


class TestRedisLockServiceAsync(AsyncLockServiceContract, TestRedisLockService):
    pass


class TestMongoLockServiceOnMongomockAsync(
    AsyncLockServiceContract, TestMongoLockServiceOnMongomock
):
    """A ready (mongomock) ``client``: the thread-based fallback. Reported as mongomock:
    a fake, not a MongoDB server."""


class NativeMongomockLocks(NativeOnMongomock, MongomockLocks):
    pass


class TestMongoLockServiceOnMongomockNativeAsync(
    NativeAsyncOnly, AsyncLockServiceContract, TestMongoLockServiceOnMongomock
):
    """The native path, on mongomock behind the async API (``async_mongomock``)."""

    def make_service(self):
        return NativeMongomockLocks(client=mongomock.MongoClient(), database="fwtest")


class TestMongoLockServiceLiveAsync(
    NativeAsyncOnly, AsyncLockServiceContract, TestMongoLockServiceLive
):
    """The native path (an ``AsyncMongoClient`` from the url) on a live server."""
