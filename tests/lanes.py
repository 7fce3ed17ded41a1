"""Marks for tests that need a server: ``@on_lane("postgres", databases=["postgres"])``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import pytest

from tests.services import available

T = TypeVar("T")


def on_lane(
    name: str, *, databases: Sequence[str] | None = None, transaction: bool = True
) -> Callable[[T], T]:
    """Mark a test (or class) as needing lane *name*; add its django_db mark when reachable.

    ``tests/conftest.py`` skips the test with the lane's reason when the server is
    unreachable, or fails it when ``FLOWWARDEN_REQUIRE_SERVICES`` is set.
    """

    def decorate(obj: T) -> T:
        obj = pytest.mark.lane(name)(obj)
        if databases is not None and available(name):
            obj = pytest.mark.django_db(transaction=transaction, databases=list(databases))(obj)
        return obj

    return decorate
