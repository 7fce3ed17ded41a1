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


def _cost(item: pytest.Item) -> int:
    """0 for the long tests (crash, chaos, Temporal, browser, subprocesses), 1 for
    the rest: under pytest-xdist the long ones start first, so they overlap with the
    many short ones instead of trailing after them."""
    if any(item.get_closest_marker(name) for name in ("slow", "browser", "chaos", "subprocess")):
        return 0
    if any(mark.args[0] == "temporal" for mark in item.iter_markers("lane")):
        return 0
    return 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_cost)  # stable: each group keeps the order it was collected in


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
