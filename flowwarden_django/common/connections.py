"""Discarding database connections that an outage left unusable.

Django closes broken connections only in ``close_old_connections()``, which it calls
around each request. Long-running threads (a stream, its flusher, the heartbeat,
the supervisor, a workflow runner) call ``discard_unusable_connections()`` after a
failure, so the next attempt reconnects instead of failing on the dead connection
forever.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import close_old_connections, connections

logger = logging.getLogger("flowwarden_django")


def discard_unusable_connections() -> None:
    """Close this thread's database connections that errored and no longer answer
    (or that outlived ``CONN_MAX_AGE``); never raises."""
    try:
        close_old_connections()
    except Exception:  # closing a dead connection can fail too; the next use reconnects
        logger.debug("discarding unusable database connections failed", exc_info=True)


@contextmanager
def closed_when_lost(using: str) -> Iterator[None]:
    """Inside an atomic block on *using*: when what it runs fails and the driver says
    the connection is lost (a silent partition's timeout), close it there, in the
    block. Django then leaves the block without connecting again to restore
    autocommit, which in an outage waits a whole ``connect_timeout`` more before the
    error reaches the caller."""
    try:
        yield
    except BaseException:
        connection = connections[using]
        if connection.connection is not None and connection_lost(connection.connection):
            with contextlib.suppress(Exception):
                connection.close()
        raise


def connection_lost(raw: Any) -> bool:
    """Whether the DB-API connection *raw* says it is lost: psycopg 3's ``broken``,
    psycopg2's nonzero ``closed``; ``False`` when the driver says neither."""
    broken = getattr(raw, "broken", None)
    if broken is not None:
        return bool(broken)
    closed = getattr(raw, "closed", False)
    return isinstance(closed, bool | int) and bool(closed)
