"""ORM store specifics: one SQL statement per write, on every database; routing."""

from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connections
from django.test import override_settings

from flowwarden_django.models import StreamCheckpoint
from flowwarden_django.streams import Checkpoint
from flowwarden_django.streams.backends.orm import OrmCheckpointStore
from flowwarden_django.testkit.checkpoint_store import now_ms, token
from tests.lanes import lane_marks

ALIASES = [
    pytest.param("default", marks=pytest.mark.django_db(transaction=True), id="sqlite"),
    pytest.param("postgres", marks=lane_marks("postgres", databases=["postgres"]), id="postgres"),
    pytest.param("mariadb", marks=lane_marks("mariadb", databases=["mariadb"]), id="mariadb"),
]


@contextmanager
def exactly_one_statement(alias: str):
    """Record the statements and the transaction calls made on *alias*.

    An execute wrapper sees every statement without switching Django to its
    logging cursor, so the store's normal (kept-cursor) path is the one measured.
    """
    connection = connections[alias]
    statements, calls = [], []

    def record(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    original_set_autocommit = connection.set_autocommit
    original_commit = connection.commit

    def set_autocommit(*args, **kwargs):
        calls.append(("set_autocommit", args))
        return original_set_autocommit(*args, **kwargs)

    def commit(*args, **kwargs):
        calls.append(("commit", args))
        return original_commit(*args, **kwargs)

    connection.ensure_connection()
    connection.set_autocommit = set_autocommit
    connection.commit = commit
    try:
        with connection.execute_wrapper(record):
            yield statements
    finally:
        del connection.set_autocommit
        del connection.commit
    assert not connection.queries_logged
    assert len(statements) == 1, statements
    assert statements[0].lstrip().upper().startswith("INSERT INTO"), statements[0]
    assert not calls, f"explicit transaction control: {calls}"
    assert connection.get_autocommit()


PARTIAL_WRITES = {
    "save_seen": lambda s, n, t: s.save_seen(n, token("s"), t),
    "save_seen+heartbeat": lambda s, n, t: s.save_seen(n, token("s"), t, t),
    "save_processed": lambda s, n, t: s.save_processed(n, token("p"), t),
    "save_processed+heartbeat": lambda s, n, t: s.save_processed(n, token("p"), t, t),
    "save_heartbeat": lambda s, n, t: s.save_heartbeat(n, t),
    "reset": lambda s, n, t: s.reset_after_history_lost(n, token("f"), token("p"), t),
    "reset-null": lambda s, n, t: s.reset_after_history_lost(n, None, None, t),
    "save": lambda s, n, t: s.save(Checkpoint(n, "pod", token("s"), t, token("p"), t, t, {})),
}


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("operation", list(PARTIAL_WRITES))
@pytest.mark.parametrize("existing", [False, True], ids=["new-stream", "existing-stream"])
def test_each_write_is_one_statement(alias, operation, existing):
    store = OrmCheckpointStore(using=alias)
    now = now_ms()
    if existing:
        store.save(Checkpoint("s", "pod", token("s0"), now, token("p"), now, now, {"k": 1}))
    with exactly_one_statement(alias):
        PARTIAL_WRITES[operation](store, "s", now + timedelta(seconds=1))
    assert store.find("s") is not None


@pytest.mark.parametrize("alias", ALIASES)
def test_reset_guard_clears_timestamp_and_token_together(alias):
    """MySQL evaluates ON DUPLICATE KEY assignments left to right; both columns must clear."""
    store = OrmCheckpointStore(using=alias)
    now = now_ms()
    store.save_processed("s", token("dead"), now)
    store.reset_after_history_lost("s", token("fresh"), token("dead"), now)
    row = StreamCheckpoint.objects.using(alias).get(pk="s")
    assert row.last_processed_token is None
    assert row.last_processed_at is None


@pytest.mark.parametrize("alias", ALIASES)
def test_write_joins_the_callers_transaction(alias):
    """Inside atomic() the upsert is part of the caller's transaction (rolled back with it)."""
    from django.db import transaction

    store = OrmCheckpointStore(using=alias)

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic(using=alias):
        store.save_processed("s", token("p"), now_ms())
        raise Rollback
    assert store.find("s") is None


@pytest.mark.parametrize("alias", ALIASES)
def test_writes_survive_a_closed_connection(alias):
    """The store keeps a cursor per connection; a new connection gets a new cursor."""
    store = OrmCheckpointStore(using=alias)
    store.save_processed("s", token("p1"), now_ms())
    connections[alias].close()
    store.save_processed("s", token("p2"), now_ms())
    assert store.find("s").last_processed_token == token("p2")


@pytest.mark.parametrize("alias", ALIASES)
def test_debug_logging_still_sees_the_writes(alias):
    from django.test.utils import CaptureQueriesContext

    store = OrmCheckpointStore(using=alias)
    with CaptureQueriesContext(connections[alias]) as captured:
        store.save_seen("s", token("s"), now_ms())
    assert len(captured.captured_queries) == 1


class CheckpointsToOther:
    """Routes the app's models to the "other" database."""

    def db_for_read(self, model, **hints):
        return "other" if model._meta.app_label == "flowwarden_django" else None

    db_for_write = db_for_read

    def allow_migrate(self, db, app_label, **hints):
        return None


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@override_settings(DATABASE_ROUTERS=["tests.streams.test_orm_store.CheckpointsToOther"])
def test_store_honours_database_routing():
    store = OrmCheckpointStore()
    store.save_processed("routed", token("p"), now_ms())
    assert StreamCheckpoint.objects.using("other").filter(pk="routed").exists()
    assert not StreamCheckpoint.objects.using("default").filter(pk="routed").exists()
    assert store.find("routed").last_processed_token == token("p")
    assert [cp.stream_name for cp in store.list_checkpoints()] == ["routed"]
    store.delete("routed")
    assert not StreamCheckpoint.objects.using("other").exists()
