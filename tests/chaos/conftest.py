"""Fixtures of the chaos tests: private servers they may stop, kill and restart.

Missing binaries skip the test with a one-line reason, or fail it when
``FLOWWARDEN_REQUIRE_SERVICES=1`` (as ``tests/conftest.py`` does for the lanes).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

import pytest
from pytest_django import DjangoDbBlocker

from tests.chaos.servers import (
    PrivatePostgres,
    PrivateRabbitMQ,
    PrivateRedis,
    PrivateServer,
    add_database_alias,
    migrate,
    postgres_unavailable_reason,
    rabbitmq_unavailable_reason,
    redis_unavailable_reason,
    remove_database_alias,
)
from tests.support.services import REQUIRE_SERVICES

S = TypeVar("S", bound=PrivateServer)

#: The Django alias of the private PostgreSQL's database (``private_postgres_alias``).
CHAOS_ALIAS = "chaos"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "chaos: stops and restarts private servers (tests/chaos/servers.py)"
    )


def require(reason: str | None) -> None:
    """Skip with *reason*, or fail when ``FLOWWARDEN_REQUIRE_SERVICES`` is set; no-op if None."""
    if reason is None:
        return
    if REQUIRE_SERVICES:
        pytest.fail(f"{reason} (FLOWWARDEN_REQUIRE_SERVICES is set, so this fails)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def _postgres_server() -> Iterator[PrivatePostgres]:
    require(postgres_unavailable_reason())
    with PrivatePostgres() as server:
        yield server


@pytest.fixture
def private_postgres(_postgres_server: PrivatePostgres) -> Iterator[PrivatePostgres]:
    """A running private PostgreSQL, shared by the module's tests (``initdb`` takes ~1 s).

    Each test gets it up, with empty ``outages``; its background restarts must have
    ended (and succeeded) when the test ends.
    """
    yield from _fresh(_postgres_server)


def _fresh(server: S) -> Iterator[S]:
    """*server* up, with no outage and no background restart left from another test."""
    server.join_background()
    server.background_errors.clear()
    server.start()
    server.outages.clear()
    yield server
    server.join_background()


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    """A running private Redis without persistence, one per test (it starts in ~20 ms)."""
    require(redis_unavailable_reason())
    with PrivateRedis() as server:
        yield server


@pytest.fixture(scope="module")
def _rabbitmq_server() -> Iterator[PrivateRabbitMQ]:
    require(rabbitmq_unavailable_reason())
    with PrivateRabbitMQ() as server:
        yield server


@pytest.fixture
def private_rabbitmq(_rabbitmq_server: PrivateRabbitMQ) -> Iterator[PrivateRabbitMQ]:
    """A running private RabbitMQ node, shared by the module's tests (it starts in ~6 s).

    As ``private_postgres``: up, empty ``outages``, background restarts joined.
    """
    yield from _fresh(_rabbitmq_server)


@pytest.fixture(scope="module")
def _postgres_alias(
    _postgres_server: PrivatePostgres, django_db_blocker: DjangoDbBlocker
) -> Iterator[str]:
    _postgres_server.create_database(CHAOS_ALIAS)
    add_database_alias(CHAOS_ALIAS, _postgres_server.django_settings(CHAOS_ALIAS))
    try:
        with django_db_blocker.unblock():
            migrate(CHAOS_ALIAS)
        yield CHAOS_ALIAS
    finally:
        remove_database_alias(CHAOS_ALIAS)


@pytest.fixture
def private_postgres_alias(
    private_postgres: PrivatePostgres, _postgres_alias: str, django_db_blocker: DjangoDbBlocker
) -> Iterator[str]:
    """The Django alias (``"chaos"``) of a migrated database on ``private_postgres``.

    Queries through it are allowed during the test (no ``django_db`` mark needed);
    the test's rows stay (the database is the module's).
    """
    from django.db import connections

    with django_db_blocker.unblock():
        yield _postgres_alias
        connections[_postgres_alias].close()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Repeat the chaos tests' figures at the end of the run (CI shows them)."""
    from tests.chaos.report import LINES

    if LINES:
        terminalreporter.section("chaos figures")
        for line in LINES:
            terminalreporter.write_line(line)
