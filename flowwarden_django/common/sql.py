"""Raw SQL helpers the ORM backends of both halves share: identifier quoting per
vendor and one kept cursor per database connection."""

from __future__ import annotations

from typing import Any

#: Identifier quoting per supported vendor (the ORM backends support no other).
QUOTES = {
    "postgresql": lambda name: f'"{name}"',
    "sqlite": lambda name: f'"{name}"',
    "mysql": lambda name: f"`{name}`",
}


KEPT_CURSOR = "_flowwarden_checkpoint_cursor"


def kept_cursor(connection: Any) -> Any:
    """One Django cursor per database connection, kept for the store's writes.

    Opening a cursor for every write roughly doubles the store's cost per write
    (see ``bench/checkpoint_writes.py``). Django's ``CursorWrapper`` still runs
    its per-call work on each ``execute``: broken-transaction check, execute
    wrappers, error translation. The cursor is replaced whenever Django has
    opened a new DB-API connection (after ``close()`` or a lost connection).
    """
    # What Django's cursor() does first: the CONN_HEALTH_CHECKS check, and
    # ensure_connection() (which test runners hook to forbid database access).
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    kept = connection.__dict__.get(KEPT_CURSOR)
    if kept is not None and kept[0] is connection.connection:
        return kept[1]
    cursor = connection.cursor()
    connection.__dict__[KEPT_CURSOR] = (connection.connection, cursor)
    return cursor
