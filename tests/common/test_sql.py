"""The kept cursor: one per DB-API connection, with the checks Django's ``cursor()``
makes whenever they could fail."""

from __future__ import annotations

import asyncio
from typing import Any
from unittest import mock

import pytest
from django.core.exceptions import SynchronousOnlyOperation
from django.db import connection

from flowwarden_django.common.sql import kept_cursor

pytestmark = pytest.mark.django_db(transaction=True)


def test_one_cursor_is_kept_per_database_connection() -> None:
    first = kept_cursor(connection)
    assert kept_cursor(connection) is first
    connection.close()
    again = kept_cursor(connection)
    assert again is not first
    again.execute("SELECT 1")
    assert again.fetchone() == (1,)


def test_a_pending_health_check_is_made_before_the_kept_cursor_is_used() -> None:
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


def test_in_an_event_loop_the_kept_cursor_is_refused_as_django_refuses_a_cursor() -> None:
    kept_cursor(connection)

    async def from_async() -> Any:
        return kept_cursor(connection)

    with pytest.raises(SynchronousOnlyOperation):
        asyncio.run(from_async())
