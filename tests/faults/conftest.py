"""Fixtures of the network-fault tests: a namespace of the test's own (``netns``).

Not root, or no ``ip``/``socat``: the tests skip with the reason, or fail when
``FLOWWARDEN_REQUIRE_SERVICES=1`` (as the lanes and the chaos tests do). Every test
module here marks its tests ``faults`` and ``subprocess`` (``pytestmark``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.faults import netns
from tests.faults.netns import NetworkNamespace
from tests.support.services import REQUIRE_SERVICES


def pytest_sessionstart(session: pytest.Session) -> None:
    """Delete the namespaces a SIGKILLed test process left (its pid is gone)."""
    if netns.unavailable_reason() is None:
        netns.remove_stale()


@pytest.fixture
def namespace() -> Iterator[NetworkNamespace]:
    """A fresh namespace joined to the host, link up; removed after the test, even
    when it fails (and by the next session's start if this process is SIGKILLed)."""
    require(netns.unavailable_reason())
    with NetworkNamespace.create() as ns:
        yield ns


def require(reason: str | None) -> None:
    """Skip with *reason*, or fail when ``FLOWWARDEN_REQUIRE_SERVICES`` is set; no-op if None."""
    if reason is None:
        return
    if REQUIRE_SERVICES:
        pytest.fail(f"{reason} (FLOWWARDEN_REQUIRE_SERVICES is set, so this fails)")
    pytest.skip(reason)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Repeat the fault tests' figures at the end of the run."""
    from tests.faults.figures import LINES

    if LINES:
        terminalreporter.section("network-fault figures")
        for line in LINES:
            terminalreporter.write_line(line)
