"""Marks for tests that need a server: ``@on_lane("postgres", databases=["postgres"])``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import pytest

from tests.support.services import available

T = TypeVar("T")


def lane_marks(
    name: str, *, databases: Sequence[str] | None = None, transaction: bool = True
) -> list[pytest.MarkDecorator]:
    """The marks of lane *name*: ``lane(name)``, plus its django_db mark when reachable.

    ``tests/conftest.py`` skips a test marked ``lane`` with the lane's reason when
    the server is unreachable, or fails it when ``FLOWWARDEN_REQUIRE_SERVICES`` is set.
    """
    marks = [pytest.mark.lane(name)]
    if databases is not None and available(name):
        marks.append(pytest.mark.django_db(transaction=transaction, databases=list(databases)))
    return marks


def on_lane(
    name: str, *, databases: Sequence[str] | None = None, transaction: bool = True
) -> Callable[[T], T]:
    """Decorate a test or class with :func:`lane_marks`."""

    def decorate(obj: T) -> T:
        for mark in lane_marks(name, databases=databases, transaction=transaction):
            obj = mark(obj)
        return obj

    return decorate
