"""E016: a database that recorded some, not all, of the migrations a squashed one
replaces (the old chain, half applied) fails ``check`` and ``migrate`` with how to
finish them, instead of Django's conflict of two leaf migrations."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections
from django.db.migrations.recorder import MigrationRecorder

from flowwarden_django.checks.migrations import APP_LABEL, partly_applied
from tests.support.lanes import lane_marks

DATABASES = [
    pytest.param("default", marks=pytest.mark.django_db(transaction=True, databases=["default"])),
    pytest.param("postgres", marks=lane_marks("postgres", databases=["postgres"])),
    pytest.param("mariadb", marks=lane_marks("mariadb", databases=["mariadb"])),
]
SQUASHED = {"0001_squashed_0003_c": ["0001_a", "0002_b", "0003_c"], "0004_d": ["0004_old_d"]}


def test_all_or_none_of_the_replaced_migrations_is_fine() -> None:
    assert partly_applied("default", [], SQUASHED) == []
    assert partly_applied("default", ["0001_a", "0002_b", "0003_c"], SQUASHED) == []
    assert partly_applied("default", ["0001_a", "0002_b", "0003_c", "0004_old_d"], SQUASHED) == []


def test_some_of_them_is_e016_with_the_migration_to_finish_on() -> None:
    (error,) = partly_applied("other", ["0001_a", "0002_b", "0004_old_d"], SQUASHED)
    assert error.id == "flowwarden_django.E016" and error.obj == "other"
    assert "applied 2 of the 3 migrations that flowwarden_django.0001_squashed_0003_c" in error.msg
    assert "(not 0003_c)" in error.msg
    assert "`manage.py migrate flowwarden_django 0003_c --database other`" in error.hint


def test_a_check_that_may_read_no_database_reads_none() -> None:
    assert not [m for m in run_checks(databases=[]) if m.id == "flowwarden_django.E016"]


@pytest.mark.parametrize("db", DATABASES)
def test_a_half_applied_old_chain_stops_check_and_migrate(db: str) -> None:
    recorder = MigrationRecorder(connections[db])
    assert not [m for m in run_checks(databases=[db]) if m.id == "flowwarden_django.E016"]
    recorder.record_unapplied(APP_LABEL, "0016_defined_workflows")
    try:
        (error,) = [m for m in run_checks(databases=[db]) if m.id == "flowwarden_django.E016"]
        assert error.obj == db
        assert "0005_squashed_0016_defined_workflows replaces (not 0016_defined_workflows)" in (
            error.msg
        )
        assert f"migrate flowwarden_django 0016_defined_workflows --database {db}" in error.hint
        with pytest.raises(SystemCheckError, match="E016"):
            call_command("migrate", APP_LABEL, database=db, verbosity=0, skip_checks=False)
    finally:
        recorder.record_applied(APP_LABEL, "0016_defined_workflows")
    assert not [m for m in run_checks(databases=[db]) if m.id == "flowwarden_django.E016"]
