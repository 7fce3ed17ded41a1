"""The snapshot store contract on both backends: memory, and the ORM store on SQLite,
PostgreSQL and MariaDB (plain and encrypting); plus what only one backend has."""

import logging
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from flowwarden_django.models import SnapshotRecord, WorkflowRun
from flowwarden_django.testkit import AsyncSnapshotStoreContract, SnapshotStoreContract
from flowwarden_django.workflows.backends.memory import InMemorySnapshotStore
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.storage.encryption import generate_key
from flowwarden_django.workflows.storage.snapshot import CheckpointQuery, Deleted, WorkflowSnapshot
from tests.support.lanes import on_lane

# -- memory -----------------------------------------------------------------------------


class TestInMemorySnapshotStore(SnapshotStoreContract):
    def make_store(self):
        return InMemorySnapshotStore()


def root(cid, state=None, **fields):
    return WorkflowSnapshot.root(cid, state, **fields)


def test_memory_cap_evicts_oldest_but_never_a_coordinations_newest(caplog):
    store = InMemorySnapshotStore(max_snapshots=4)
    deleted = []
    store.add_listener(lambda e: deleted.append(e) if isinstance(e, Deleted) else None)
    dormant = store.save(root("dormant", 0))
    busy = [store.save(root("busy", n)) for n in range(6)]
    assert len(store) == 4
    assert store.load(dormant.id) is not None, "a dormant run's only snapshot survives"
    assert [s.id for s in store.list(CheckpointQuery(coordination_id="busy"))] == [
        s.id for s in busy[-3:]
    ]
    assert [e.snapshot_id for e in deleted] == [s.id for s in busy[:3]]
    # Only newest snapshots left: the store grows past the cap and warns once.
    with caplog.at_level(logging.WARNING, logger="flowwarden_django.workflows"):
        for n in range(5):
            store.save(root(f"run-{n}", n))
    assert store.latest("dormant").id == dormant.id
    assert all(store.latest(f"run-{n}") is not None for n in range(5))
    assert len(store) == 7  # dormant, busy's newest and the five runs
    assert sum("over its cap" in r.message for r in caplog.records) == 1


def test_memory_store_copies_state_on_save_and_load():
    store = InMemorySnapshotStore()
    state = {"items": [1]}
    stored = store.save(root("copy", state))
    state["items"].append(2)
    loaded = store.load(stored.id)
    assert loaded.state == {"items": [1]}
    loaded.state["items"].append(3)
    assert store.load(stored.id).state == {"items": [1]}


def test_memory_store_refuses_what_the_serializer_cannot_write():
    store = InMemorySnapshotStore()
    with pytest.raises(TypeError, match="cannot serialize object"):
        store.save(root("bad", {"x": object()}))
    assert store.list() == []


def test_memory_prune_uses_the_protect_hook():
    waiting = set()
    store = InMemorySnapshotStore(protect=lambda: waiting)
    chain = [store.save(root("hook", 0))]
    for n in range(1, 4):
        chain.append(store.save(chain[-1].derive_with(n)))
    waiting.add(chain[0].id)
    assert store.prune(keep_last=1) == 2
    assert [s.id for s in store.list()] == [chain[0].id, chain[3].id]


@pytest.mark.parametrize("cap", [0, -1, 1.5, True])
def test_memory_cap_must_be_a_positive_integer(cap):
    with pytest.raises(ValueError):
        InMemorySnapshotStore(max_snapshots=cap)


# -- ORM --------------------------------------------------------------------------------


class OrmContract(SnapshotStoreContract):
    alias = "default"
    keys = None

    def make_store(self):
        return OrmSnapshotStore(using=self.alias, encryption_keys=self.keys)

    def mark_waiting(self, store, snapshot):
        now = timezone.now()
        WorkflowRun.objects.using(self.alias).create(
            coordination_id=snapshot.coordination_id,
            workflow_name="contract",
            status=WorkflowRun.Status.WAITING,
            head_snapshot_id=snapshot.id,
            created_at=now,
            updated_at=now,
        )
        return {}

    def make_encrypting_store(self, keys, **options):
        return OrmSnapshotStore(using=self.alias, encryption_keys=keys, **options)

    def raw_texts(self, store, snapshot_id):
        row = SnapshotRecord.objects.using(self.alias).get(pk=snapshot_id)
        return row.state, row.metadata

    def move_row(self, store, snapshot_id, coordination_id):
        rows = SnapshotRecord.objects.using(self.alias).filter(pk=snapshot_id)
        return rows.update(coordination_id=coordination_id) == 1


@pytest.mark.django_db(transaction=True)
class TestOrmSnapshotStoreSqlite(OrmContract):
    alias = "default"


@pytest.mark.django_db(transaction=True)
class TestOrmSnapshotStoreSqliteEncrypted(OrmContract):
    """Every contract test again, with state and metadata encrypted."""

    alias = "default"
    keys = [generate_key()]


# On the servers, the tests that start threads commit for real (the threads need to
# see each other's rows); the others run in a transaction rolled back at the end,
# which is faster than emptying every table after each test, and also covers the
# store joining a caller's transaction (its writes become savepoints).
THREADED = (
    "test_concurrent_saves_get_distinct_seqs",
    "test_keyset_paging_while_rows_are_appended",
    "test_two_runners_at_one_seq_one_wins",
)


def without_threads(cls):
    for name in THREADED:
        setattr(cls, name, None)
    return cls


def only_threads(cls):
    for name in dir(cls):
        if name.startswith("test_") and name not in THREADED:
            setattr(cls, name, None)
    return cls


@on_lane("postgres", databases=["postgres"], transaction=False)
@without_threads
class TestOrmSnapshotStorePostgres(OrmContract):
    alias = "postgres"


@on_lane("postgres", databases=["postgres"])
@only_threads
class TestOrmSnapshotStorePostgresThreads(OrmContract):
    alias = "postgres"


@on_lane("mariadb", databases=["mariadb"], transaction=False)
@without_threads
class TestOrmSnapshotStoreMariadb(OrmContract):
    alias = "mariadb"


@on_lane("mariadb", databases=["mariadb"])
@only_threads
class TestOrmSnapshotStoreMariadbThreads(OrmContract):
    alias = "mariadb"


@pytest.mark.django_db(transaction=True)
def test_orm_store_follows_the_router_and_joins_the_callers_transaction():
    from django.db import transaction

    store = OrmSnapshotStore()
    cid = f"tx-{uuid.uuid4().hex[:8]}"
    with pytest.raises(RuntimeError), transaction.atomic():
        store.save(root(cid, 1))
        raise RuntimeError("roll back")
    assert store.latest(cid) is None
    with transaction.atomic():
        first = store.save(root(cid, 1))
        second = store.save(root(cid, 2))
    assert (first.seq, second.seq) == (1, 2)


@pytest.mark.django_db(transaction=True)
def test_orm_prune_only_protects_runs_that_wait():
    store = OrmSnapshotStore()
    cid = f"runs-{uuid.uuid4().hex[:8]}"
    chain = [store.save(root(cid, 0))]
    for n in range(1, 3):
        chain.append(store.save(chain[-1].derive_with(n)))
    now = timezone.now()
    WorkflowRun.objects.create(
        coordination_id=cid,
        workflow_name="w",
        status=WorkflowRun.Status.HIBERNATED,
        head_snapshot_id=chain[0].id,
        created_at=now,
        updated_at=now,
    )
    assert store.prune(keep_last=1) == 2


@pytest.mark.django_db(transaction=True)
def test_orm_stored_state_type_names_the_top_level_type():
    store = OrmSnapshotStore()
    stored = store.save(root(f"label-{uuid.uuid4().hex[:8]}", {"a": 1}))
    row = SnapshotRecord.objects.get(pk=stored.id)
    assert row.state_type == "dict"
    assert row.state == '{"a":1}'
    assert row.metadata == "{}"


def test_orm_store_encrypts_at_rest_only_with_keys():
    assert not OrmSnapshotStore().encrypts_at_rest
    assert OrmSnapshotStore(encryption_keys=generate_key()).encrypts_at_rest
    with pytest.raises(ValueError, match="no encryption key"):
        OrmSnapshotStore(encryption_keys=[])


@pytest.mark.django_db(transaction=True)
def test_orm_prune_visits_every_page_of_coordinations(monkeypatch):
    from flowwarden_django.workflows.backends import orm

    monkeypatch.setattr(orm, "_CHUNK", 2)
    store = OrmSnapshotStore()
    cids = [f"page-{n}-{uuid.uuid4().hex[:6]}" for n in range(5)]
    for cid in cids:
        first = store.save(root(cid, 0))
        store.save(first.derive_with(1, created_at=first.created_at + timedelta(seconds=1)))
    assert store.prune(keep_last=1) == 5
    assert all(len(store.list(CheckpointQuery(coordination_id=c))) == 1 for c in cids)


# -- the contract through the async API, on every backend ------------------------------


class TestInMemorySnapshotStoreAsync(AsyncSnapshotStoreContract, TestInMemorySnapshotStore):
    pass


class TestOrmSnapshotStoreSqliteAsync(AsyncSnapshotStoreContract, TestOrmSnapshotStoreSqlite):
    pass


class TestOrmSnapshotStoreSqliteEncryptedAsync(
    AsyncSnapshotStoreContract, TestOrmSnapshotStoreSqliteEncrypted
):
    pass


@without_threads
class TestOrmSnapshotStorePostgresAsync(AsyncSnapshotStoreContract, TestOrmSnapshotStorePostgres):
    pass


@only_threads
class TestOrmSnapshotStorePostgresThreadsAsync(
    AsyncSnapshotStoreContract, TestOrmSnapshotStorePostgresThreads
):
    pass


@without_threads
class TestOrmSnapshotStoreMariadbAsync(AsyncSnapshotStoreContract, TestOrmSnapshotStoreMariadb):
    pass


@only_threads
class TestOrmSnapshotStoreMariadbThreadsAsync(
    AsyncSnapshotStoreContract, TestOrmSnapshotStoreMariadbThreads
):
    pass
