"""The contract suite on the ORM store: SQLite, PostgreSQL and MariaDB."""

import pytest

from flowwarden_django.streams.backends.orm import OrmCheckpointStore
from flowwarden_django.testkit import AsyncCheckpointStoreContract, CheckpointStoreContract
from tests.support.lanes import on_lane


class OrmContract(CheckpointStoreContract):
    alias = "default"

    def make_store(self):
        return OrmCheckpointStore(using=self.alias)


@pytest.mark.django_db(transaction=True)
class TestOrmSqlite(OrmContract):
    alias = "default"
    race_writes = 1000


@on_lane("postgres", databases=["postgres"])
class TestOrmPostgres(OrmContract):
    alias = "postgres"


@on_lane("mariadb", databases=["mariadb"])
class TestOrmMariadb(OrmContract):
    alias = "mariadb"


# -- the same through the async API (thread-sensitive: the test's own connection) ------


class TestOrmSqliteAsync(AsyncCheckpointStoreContract, TestOrmSqlite):
    pass


class TestOrmPostgresAsync(AsyncCheckpointStoreContract, TestOrmPostgres):
    pass


class TestOrmMariadbAsync(AsyncCheckpointStoreContract, TestOrmMariadb):
    pass
