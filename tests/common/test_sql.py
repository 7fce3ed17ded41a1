"""The kept cursor: one per DB-API connection, behind the checks Django's ``cursor()``
makes."""

from __future__ import annotations

import asyncio
from typing import Any
from unittest import mock

import pytest
from django.core.exceptions import SynchronousOnlyOperation
from django.db import connections

from flowwarden_django.common.sql import kept_cursor

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def connection() -> Any:
    """This thread's connection of the default database (not the module's proxy)."""
    return connections["default"]


def test_one_cursor_is_kept_per_database_connection(connection: Any) -> None:
    first = kept_cursor(connection)
    assert kept_cursor(connection) is first
    connection.close()
    again = kept_cursor(connection)
    assert again is not first
    again.execute("SELECT 1")
    assert again.fetchone() == (1,)


def test_a_pending_health_check_is_made_before_the_kept_cursor_is_used(connection: Any) -> None:
    """With ``CONN_HEALTH_CHECKS`` and no check made yet in this request, the check
    runs: a connection that is no longer usable is replaced, with its cursor."""
    first = kept_cursor(connection)
    with (
        mock.patch.object(connection, "health_check_enabled", True),
        mock.patch.object(connection, "health_check_done", False),
        mock.patch.object(connection, "is_usable", return_value=False),
    ):
        replaced = kept_cursor(connection)
        assert connection.health_check_done
    assert replaced is not first
    assert kept_cursor(connection) is replaced


def test_in_an_event_loop_the_kept_cursor_is_refused_as_a_cursor_is(connection: Any) -> None:
    kept_cursor(connection)

    async def from_async() -> Any:
        return kept_cursor(connection)

    with pytest.raises(SynchronousOnlyOperation):
        asyncio.run(from_async())
