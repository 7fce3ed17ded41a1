"""``write_transaction``: a transaction that means to write, on any supported database.

Used by the ORM snapshot store, the engine and approvals; it lives apart from the
ORM store (``backends.orm``, which re-exports it) because that module imports the
models at module level, and approvals must stay importable before the app registry
is ready.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from django.db import connections, transaction


@contextmanager
def write_transaction(using: str) -> Iterator[None]:
    """``transaction.atomic(using=using)`` that, on SQLite, takes the write lock when
    it begins (``BEGIN IMMEDIATE``).

    A deferred SQLite transaction that reads and then writes fails at once with
    "database is locked" when another connection is writing; an immediate one waits
    for the lock (the database's ``timeout``). Inside an existing transaction this is
    a plain savepoint.
    """
    connection = connections[using]
    if connection.vendor == "sqlite" and not connection.in_atomic_block:
        # Connect first: connecting sets transaction_mode from the settings.
        connection.close_if_health_check_failed()
        connection.ensure_connection()
    if (
        connection.vendor != "sqlite"
        or connection.in_atomic_block
        or not hasattr(connection, "transaction_mode")
    ):
        with transaction.atomic(using=using):
            yield
        return
    with ExitStack() as stack:
        previous = connection.transaction_mode
        connection.transaction_mode = "IMMEDIATE"
        try:
            stack.enter_context(transaction.atomic(using=using))
        finally:
            connection.transaction_mode = previous
        yield
