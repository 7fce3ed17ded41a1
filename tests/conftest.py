"""Lane plumbing: a test marked ``lane(name)`` skips or fails when its server is down."""

import pytest

from tests.services import REQUIRE_SERVICES, unavailable_reason

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


#: Where the last long test goes: this share of the way through the short ones.
LONG_TESTS_WITHIN = 0.6


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Spread the long tests through the first part of the run, one every few short
    tests. ``make test`` hands tests out one at a time (``--maxschedchunk 1``), so a
    long test waits on one worker while the others run short ones, which need the
    cores; all long tests first would leave the cores idle, then busy; all last would
    make the run as long as its slowest tail. The order is the same in every worker."""
    long_tests = [item for item in items if _long(item)]
    short_tests = [item for item in items if not _long(item)]
    if not long_tests:
        return
    every = max(1, int(len(short_tests) * LONG_TESTS_WITHIN) // len(long_tests))
    ordered: list[pytest.Item] = []
    for index, item in enumerate(long_tests):
        ordered.append(item)
        ordered.extend(short_tests[index * every : (index + 1) * every])
    ordered.extend(short_tests[len(long_tests) * every :])
    items[:] = ordered


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
