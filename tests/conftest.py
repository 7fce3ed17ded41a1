"""Lane plumbing: a test marked ``lane(name)`` skips or fails when its server is down."""

import pytest

from tests.support.services import REQUIRE_SERVICES, unavailable_reason

# A plugin of the tests that use the API fixtures (``pytest_plugins`` there); its
# asserts are rewritten like a test module's, though they import it first.
pytest.register_assert_rewrite("tests.api.helpers")


@pytest.fixture(autouse=True)
def _require_lane(request: pytest.FixtureRequest) -> None:
    for mark in request.node.iter_markers("lane"):
        reason = unavailable_reason(mark.args[0])
        if reason is None:
            continue
        if REQUIRE_SERVICES and mark.args[0] != "mongo_live":
            pytest.fail(f"{reason} (FLOWWARDEN_REQUIRE_SERVICES is set, so this fails)")
        pytest.skip(reason)


def _long(item: pytest.Item) -> bool:
    """The long tests: crash, chaos, Temporal, browser, subprocesses. Most of their time
    is spent waiting (on a process, a server, a clock), not on a core."""
    if any(item.get_closest_marker(name) for name in ("slow", "browser", "chaos", "subprocess")):
        return True
    return any(mark.args[0] == "temporal" for mark in item.iter_markers("lane"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long tests first. ``make test`` hands tests out one at a time
    (``--maxschedchunk 1``), so the long ones start at once on every worker and the
    short ones fill in around them; nothing long trails at the end. (Measured: 6:03
    for ``make test``; spreading the long tests through the run took 7:12.)"""
    items.sort(key=lambda item: not _long(item))  # stable: each group keeps its order


@pytest.fixture(autouse=True)
def _no_connection_left_open(request: pytest.FixtureRequest) -> None:
    """A test without database access finds no connection an earlier test of this
    process left open: code under test that tidies connections (``close_old_connections``)
    would touch it, which pytest-django refuses. Under pytest-xdist any test may follow
    any other."""
    if request.node.get_closest_marker("django_db") is not None:
        return
    if {"db", "transactional_db", "django_db_setup", "live_server"} & set(request.fixturenames):
        return
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        if connection.connection is not None:
            connection.close()


@pytest.fixture(autouse=True)
def _no_password_failures_left() -> None:
    """A test starts with no failed password attempts counted by an earlier test of
    this process (``api/throttling.py`` keeps them in the ``default`` cache, an
    in-memory one in the test settings): under pytest-xdist any test may follow the
    fuzzing run that fails hundreds of them from 127.0.0.1."""
    from django.conf import settings
    from django.core.cache import cache

    if settings.CACHES["default"]["BACKEND"].endswith("LocMemCache"):
        cache.clear()
