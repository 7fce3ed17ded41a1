"""``closed_when_lost``: a connection its driver declared lost inside an atomic block
is closed there, so that Django leaves the block without connecting again (issue
51: in a silent partition that reconnection waits a whole ``connect_timeout``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.db import connection, transaction

from flowwarden_django.common import connections as module
from flowwarden_django.common.connections import closed_when_lost, connection_lost


class Boom(Exception):
    """What failed inside the block."""


@pytest.mark.django_db(transaction=True)
def test_a_lost_connection_is_closed_in_the_block_and_not_reopened():
    def reconnect() -> None:
        raise AssertionError("Django connected again to leave the block")

    connection.ensure_connection()  # an earlier test may have closed it
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "connection_lost", lambda raw: True)
        patch.setattr(connection, "connect", reconnect)
        with pytest.raises(Boom), transaction.atomic(), closed_when_lost("default"):
            connection.cursor().execute("SELECT 1")
            raise Boom
        assert connection.connection is None


@pytest.mark.django_db(transaction=True)
def test_a_connection_that_still_works_stays_open(monkeypatch):
    with pytest.raises(Boom), transaction.atomic(), closed_when_lost("default"):
        connection.ensure_connection()
        raise Boom
    assert connection.connection is not None


def test_what_the_drivers_say():
    assert connection_lost(SimpleNamespace(broken=True, closed=False))  # psycopg 3
    assert not connection_lost(SimpleNamespace(broken=False, closed=False))
    assert connection_lost(SimpleNamespace(closed=2))  # psycopg2
    assert not connection_lost(SimpleNamespace(closed=0))
    assert not connection_lost(object())
