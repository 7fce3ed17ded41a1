# The admin's searches on PostgreSQL (issue 29, part 5): "contains" searches of the
# approvals (prompt, coordination id) and of the runs (coordination id, idempotency
# key) through trigram indexes, instead of reading the whole table for every search.
# Was migration 0009, which this one replaces; it stands alone, after the squashed
# ones, because it cannot run in a transaction.
#
# Django's admin searches with ``icontains``: on PostgreSQL,
# ``UPPER("column"::text) LIKE UPPER('%term%')``; each index is on that very
# expression, with pg_trgm's operator class. Built CONCURRENTLY (the migration is not
# atomic), so a large table keeps taking writes meanwhile. Without the pg_trgm
# extension (a database user that may not create it), the indexes are left out and
# the searches work as before; other databases have no such index.

import logging

from django.db import migrations

logger = logging.getLogger("flowwarden_django.migrations")

#: (index name, table, column) of every search index.
SEARCH_INDEXES = (
    ("fw_approval_prompt_search", "flowwarden_django_approval", "prompt"),
    ("fw_approval_coordination_search", "flowwarden_django_approval", "coordination_id"),
    ("fw_run_coordination_search", "flowwarden_django_workflowrun", "coordination_id"),
    ("fw_run_key_search", "flowwarden_django_workflowrun", "idempotency_key"),
)


def _has_trigrams(cursor):
    cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm'")
    if cursor.fetchone():
        return True
    try:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except Exception as exc:  # no privilege: searches stay unindexed
        logger.warning(
            "flowwarden_django: the pg_trgm extension could not be created (%s); the admin's "
            "searches of approvals and runs are not indexed. Run CREATE EXTENSION pg_trgm "
            "as a superuser, then `manage.py migrate flowwarden_django "
            "0005_squashed_0016_defined_workflows` and `manage.py migrate flowwarden_django`.",
            exc,
        )
        return False
    return True


def add_search_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        if not _has_trigrams(cursor):
            return
        for name, table, column in SEARCH_INDEXES:
            cursor.execute(
                f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{name}" ON "{table}" '
                f'USING gin ((UPPER("{column}"::text)) gin_trgm_ops)'
            )


def drop_search_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for name, _table, _column in SEARCH_INDEXES:
            cursor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')


class Migration(migrations.Migration):

    atomic = False

    replaces = [
        ('flowwarden_django', '0009_search_indexes'),
    ]

    dependencies = [
        ('flowwarden_django', '0005_squashed_0016_defined_workflows'),
    ]

    operations = [
        migrations.RunPython(add_search_indexes, drop_search_indexes, elidable=False),
    ]
