"""Byte-exact text columns on MySQL/MariaDB for the migrations (not a migration: the
loader skips modules whose names start with ``_``).

The servers' default collations are case-insensitive and ignore trailing spaces,
which would merge "orders", "Orders" and "orders " into one key.
"""

from collections.abc import Callable, Sequence
from typing import Any

#: (model name, column, varchar length, "NULL" or "NOT NULL")
Column = tuple[str, str, int, str]


def exact_columns(columns: Sequence[Column]) -> Callable[[Any, Any], None]:
    """A ``RunPython`` function giving *columns* a binary collation on MySQL/MariaDB
    (nothing elsewhere)."""

    def make_exact(apps: Any, schema_editor: Any) -> None:
        connection = schema_editor.connection
        if connection.vendor != "mysql":
            return
        collation = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"
        for model, column, length, nullability in columns:
            table = apps.get_model("flowwarden_django", model)._meta.db_table
            schema_editor.execute(
                f"ALTER TABLE {schema_editor.quote_name(table)} "
                f"MODIFY {schema_editor.quote_name(column)} "
                f"varchar({length}) CHARACTER SET utf8mb4 COLLATE {collation} {nullability}"
            )

    return make_exact
