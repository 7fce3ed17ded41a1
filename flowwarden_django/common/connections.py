"""Discarding database connections that an outage left unusable.

Django closes broken connections only in ``close_old_connections()``, which it calls
around each request. Long-running threads (a stream, its flusher, the heartbeat,
the supervisor, a workflow runner) call ``discard_unusable_connections()`` after a
failure, so the next attempt reconnects instead of failing on the dead connection
forever.
"""

from __future__ import annotations

import logging

from django.db import close_old_connections

logger = logging.getLogger("flowwarden_django")


def discard_unusable_connections() -> None:
    """Close this thread's database connections that errored and no longer answer
    (or that outlived ``CONN_MAX_AGE``); never raises."""
    try:
        close_old_connections()
    except Exception:  # closing a dead connection can fail too; the next use reconnects
        logger.debug("discarding unusable database connections failed", exc_info=True)
