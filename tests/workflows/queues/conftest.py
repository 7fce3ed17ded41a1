"""Each queue test starts with no slot rows made and ends with the dispatch threads'
database connections closed (so the test databases can be dropped)."""

from collections.abc import Iterator

import pytest

from tests.support.queue_workflows import quiet_queues


@pytest.fixture(autouse=True)
def _quiet_queues() -> Iterator[None]:
    with quiet_queues():
        yield
