"""A transaction whose client went silent in the middle of it (issue 51): the server
ends it within the bound, with ``postgres_options()``'s ``options``.

In a silent partition the server cannot tell that its client is gone: it keeps the
session, idle in its transaction, and its row locks until its own TCP gives up
(minutes). A stream cut off while it wrote its processed anchor came back after the
partition to a checkpoint row still locked by its own dead session, and its next
anchor write (under its window's lock: every handler thread behind it) waited for
it. ``idle_in_transaction_session_timeout`` (the bound) ends that session on the
server, and its locks with it.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from flowwarden_django.common.network import postgres_options
from flowwarden_django.models import StreamCheckpoint
from tests.support.lanes import lane_marks

psycopg = pytest.importorskip("psycopg")

DB = "postgres"
#: The bound of the test (seconds): the silent session ends this long after its last
#: statement.
BOUND = 3.0

pytestmark = lane_marks("postgres", databases=["default", DB])


def _connect(**options: Any) -> Any:
    settings = connections[DB].settings_dict
    return psycopg.connect(
        host=settings["HOST"] or "localhost",
        port=settings["PORT"] or 5432,
        dbname=settings["NAME"],
        user=settings["USER"],
        password=settings["PASSWORD"],
        **options,
    )


def test_a_session_gone_silent_in_its_transaction_loses_its_locks_within_the_bound():
    name = "silent-anchor"
    StreamCheckpoint.objects.using(DB).create(stream_name=name)
    table = StreamCheckpoint._meta.db_table
    update = f'UPDATE "{table}" SET last_processed_at = %s WHERE stream_name = %s'
    silent = _connect(**postgres_options(BOUND))
    # The anchor write a partition cut off: the row is locked, then the client says
    # nothing more (its COMMIT was lost), as the server sees it.
    silent.execute(update, (timezone.now(), name))
    assert silent.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    with _connect(autocommit=True) as back:
        # The stream's next anchor write, after the partition. lock_timeout only stops
        # a regression from hanging the run: the row is free after BOUND seconds.
        back.execute("SET lock_timeout = '60s'")
        written = back.execute(update, (timezone.now(), name)).rowcount
    assert written == 1
    with pytest.raises(psycopg.Error, match="idle-in-transaction"):  # the server ended it
        silent.execute("SELECT 1")
    silent.close()


def test_the_options_set_the_bound_on_the_server():
    with _connect(**postgres_options(BOUND)) as session:
        (value,) = session.execute("SHOW idle_in_transaction_session_timeout").fetchone()
    assert value == "3s"
