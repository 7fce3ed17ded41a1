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
