"""What the squashed migrations build on each database besides the models' tables:
MySQL/MariaDB compare the identifying text columns byte for byte, PostgreSQL has the
trigram indexes of the admin's searches; and a 0.1.0 database (its four migrations
recorded, not the squashed one) migrates to the same schema."""

from __future__ import annotations

import re
from importlib import import_module

import pytest
from django.core.management import call_command
from django.db import connections
from django.db.migrations.recorder import MigrationRecorder

from flowwarden_django.checks.migrations import APP_LABEL, squashed_migrations
from tests.support.lanes import lane_marks

RELEASED = "0001_squashed_0004_approvals"
#: (model, column, varchar length, nullability) of the byte-exact columns.
EXACT_COLUMNS = import_module(f"flowwarden_django.migrations.{RELEASED}").EXACT_COLUMNS
SEARCH_INDEXES = import_module("flowwarden_django.migrations.0017_search_indexes").SEARCH_INDEXES

DATABASES = [
    pytest.param("default", marks=pytest.mark.django_db(transaction=True, databases=["default"])),
    pytest.param("postgres", marks=lane_marks("postgres", databases=["postgres"])),
    pytest.param("mariadb", marks=lane_marks("mariadb", databases=["mariadb"])),
]


def recorded(db: str) -> set[str]:
    return {
        name
        for app, name in MigrationRecorder(connections[db]).applied_migrations()
        if app == APP_LABEL
    }


@pytest.mark.parametrize("db", [DATABASES[2]])
def test_the_identifying_text_columns_compare_byte_for_byte_on_mariadb(db: str) -> None:
    from django.apps import apps

    with connections[db].cursor() as cursor:
        cursor.execute(
            "SELECT TABLE_NAME, COLUMN_NAME, COLLATION_NAME, COLUMN_TYPE, IS_NULLABLE "
            "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()"
        )
        columns = {(table, column): rest for table, column, *rest in cursor.fetchall()}
    assert len(EXACT_COLUMNS) == 18
    for model, column, length, nullability in EXACT_COLUMNS:
        table = apps.get_model(APP_LABEL, model)._meta.db_table
        collation, column_type, nullable = columns[table, column]
        assert (collation, column_type) == ("utf8mb4_nopad_bin", f"varchar({length})")
        assert (nullable == "YES") == (nullability == "NULL"), (table, column)


@pytest.mark.parametrize("db", [DATABASES[2]])
def test_stream_names_differing_in_case_or_a_trailing_space_are_three_leases(db: str) -> None:
    from flowwarden_django.models import StreamLease

    for name in ("orders", "Orders", "orders "):
        StreamLease.objects.using(db).create(name=name)
    assert StreamLease.objects.using(db).filter(name="orders").count() == 1
    assert StreamLease.objects.using(db).count() == 3


@pytest.mark.parametrize("db", [DATABASES[1]])
def test_the_admin_searches_have_their_trigram_indexes_on_postgresql(db: str) -> None:
    with connections[db].cursor() as cursor:
        cursor.execute("SELECT indexname, tablename, indexdef FROM pg_indexes")
        indexes = {name: (table, definition) for name, table, definition in cursor.fetchall()}
    for name, table, column in SEARCH_INDEXES:
        found_table, definition = indexes[name]
        assert found_table == table
        assert "USING gin" in definition and "gin_trgm_ops" in definition, definition
        # On the expression Django's icontains searches: UPPER("column"::text).
        assert re.search(rf"\(upper\(\(?{column}\)?(::text)?\) gin_trgm_ops\)", definition)


@pytest.mark.parametrize("db", DATABASES)
def test_every_squashed_migration_and_what_it_replaces_is_recorded(db: str) -> None:
    squashed = squashed_migrations()
    assert list(squashed) == [
        RELEASED, "0005_squashed_0016_defined_workflows", "0017_search_indexes"
    ]  # fmt: skip
    replaced = [name for names in squashed.values() for name in names]
    assert [name[:4] for name in replaced] == [f"{n:04d}" for n in range(1, 17) if n != 9] + [
        "0009"
    ]
    assert recorded(db) == set(squashed) | set(replaced)


@pytest.mark.slow
@pytest.mark.parametrize("db", DATABASES)
def test_a_database_of_release_0_1_0_migrates_to_the_same_schema(db: str) -> None:
    """Back to the 0.1.0 tables, with only the four old migrations recorded (as 0.1.0
    left them), then ``migrate``: the squashed migration of 0.1.0 counts as applied,
    the others apply, and the schema is the fresh one."""
    connection = connections[db]
    before = schema(db)
    try:
        call_command("migrate", APP_LABEL, RELEASED, database=db, verbosity=0)
        MigrationRecorder(connection).record_unapplied(APP_LABEL, RELEASED)
        assert recorded(db) == set(squashed_migrations()[RELEASED])
        assert "flowwarden_django_workflowqueueslot" not in connection.introspection.table_names()
        call_command("migrate", APP_LABEL, database=db, verbosity=0, skip_checks=False)
    finally:
        call_command("migrate", APP_LABEL, database=db, verbosity=0)
    assert recorded(db) == set(squashed_migrations()) | {
        name for names in squashed_migrations().values() for name in names
    }
    assert schema(db) == before


def schema(db: str) -> dict[str, object]:
    """The app's tables: each column's description and each constraint and index."""
    connection = connections[db]
    tables: dict[str, object] = {}
    with connection.cursor() as cursor:
        introspection = connection.introspection
        for table in sorted(introspection.table_names(cursor)):
            if not table.startswith(f"{APP_LABEL}_"):
                continue
            columns = [
                (c.name, c.type_code, c.internal_size, c.null_ok, c.default, c.collation)
                for c in introspection.get_table_description(cursor, table)
            ]
            constraints = {
                name: sorted((k, str(v)) for k, v in details.items())
                for name, details in introspection.get_constraints(cursor, table).items()
                if not name.startswith("sqlite_autoindex")
            }
            tables[table] = (columns, constraints)
    return tables
