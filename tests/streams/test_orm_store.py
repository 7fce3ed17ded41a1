"""ORM store specifics: one SQL statement per write, on every database; routing;
the statements of the conditional ``save_initial_sync``."""

from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connections
from django.test import override_settings

from flowwarden_django.models import StreamCheckpoint
from flowwarden_django.streams import Checkpoint
from flowwarden_django.streams.backends import orm
from flowwarden_django.streams.backends.orm import OrmCheckpointStore
from flowwarden_django.testkit.checkpoint_store import now_ms, sync_progress, token
from tests.support.lanes import lane_marks

ALIASES = [
    pytest.param("default", marks=pytest.mark.django_db(transaction=True), id="sqlite"),
    pytest.param("postgres", marks=lane_marks("postgres", databases=["postgres"]), id="postgres"),
    pytest.param("mariadb", marks=lane_marks("mariadb", databases=["mariadb"]), id="mariadb"),
]


@contextmanager
def recorded_statements(alias: str):
    """Record the statements and the transaction calls made on *alias*.

    An execute wrapper sees every statement without switching Django to its
    logging cursor, so the store's normal (kept-cursor) path is the one measured.
    No transaction control is allowed, and autocommit must be on at the end.
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
    assert not calls, f"explicit transaction control: {calls}"
    assert connection.get_autocommit()


@contextmanager
def exactly_one_statement(alias: str):
    """:func:`recorded_statements`, and exactly one statement: an upsert."""
    with recorded_statements(alias) as statements:
        yield statements
    assert len(statements) == 1, statements
    assert statements[0].lstrip().upper().startswith("INSERT INTO"), statements[0]


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


def _kinds(statements):
    return [" ".join(sql.split()[:2]).upper() for sql in statements]


def _table(alias):
    return connections[alias].ops.quote_name(StreamCheckpoint._meta.db_table).upper()


@pytest.mark.parametrize("alias", ALIASES)
def test_save_initial_sync_on_an_existing_record_is_one_update(alias):
    store = OrmCheckpointStore(using=alias)
    store.save_heartbeat("s", now_ms())
    with recorded_statements(alias) as statements:
        assert store.save_initial_sync("s", sync_progress(0), expected_batch=None)
    assert _kinds(statements) == ["UPDATE " + _table(alias)]
    with recorded_statements(alias) as statements:
        assert store.save_initial_sync("s", sync_progress(1), expected_batch=0)
        assert not store.save_initial_sync("s", sync_progress(9), expected_batch=0)
        assert not store.save_initial_sync("s", sync_progress(9), expected_batch=None)
    # A refused write expecting no progress also tries the INSERT, which meets the row,
    # and asks the UPDATE again (the row might have been created meanwhile).
    assert [kind.split()[0] for kind in _kinds(statements)] == [
        "UPDATE",  # batch 0 -> 1
        "UPDATE",  # expected 0: refused, no INSERT
        "UPDATE",  # expected None: no row without progress ...
        "INSERT",  # ... the row exists ...
        "UPDATE",  # ... and still has progress: refused
    ]
    row = StreamCheckpoint.objects.using(alias).get(pk="s")
    assert (row.initial_sync, row.initial_sync_batch) == (sync_progress(1), 1)


@pytest.mark.parametrize("alias", ALIASES)
def test_save_initial_sync_creating_the_record_is_update_then_insert(alias):
    store = OrmCheckpointStore(using=alias)
    with recorded_statements(alias) as statements:
        assert store.save_initial_sync("s", sync_progress(0), expected_batch=None)
    assert [kind.split()[0] for kind in _kinds(statements)] == ["UPDATE", "INSERT"]
    with recorded_statements(alias) as statements:
        assert not store.save_initial_sync("t", sync_progress(1), expected_batch=0)
    assert [kind.split()[0] for kind in _kinds(statements)] == ["UPDATE"], "no INSERT"
    assert store.find("t") is None
    row = StreamCheckpoint.objects.using(alias).get(pk="s")
    assert (row.initial_sync, row.initial_sync_batch, row.metadata) == (sync_progress(0), 0, {})


@pytest.mark.parametrize("alias", ALIASES)
def test_save_initial_sync_keeps_the_batch_column_in_step(alias):
    """The condition compares ``initial_sync_batch``: every write that sets the
    progress sets it, and clearing the progress clears it."""
    store = OrmCheckpointStore(using=alias)

    def columns():
        row = StreamCheckpoint.objects.using(alias).get(pk="s")
        return row.initial_sync, row.initial_sync_batch

    store.save(Checkpoint("s", initial_sync=sync_progress(4)))
    assert columns() == (sync_progress(4), 4)
    store.save_initial_sync("s", sync_progress(5), expected_batch=4)
    assert columns() == (sync_progress(5), 5)
    store.save_initial_sync("s", None, expected_batch=5)
    assert columns() == (None, None)
    store.save_initial_sync("s", sync_progress(0), expected_batch=None)
    store.save(Checkpoint("s"))
    assert columns() == (None, None)


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize(
    ("concurrent", "written"),
    [("heartbeat", True), ("progress", False)],
    ids=["record-created-without-progress", "record-created-with-progress"],
)
def test_save_initial_sync_decides_on_a_record_created_between_its_statements(
    alias, concurrent, written, monkeypatch
):
    """Another writer creates the record after the UPDATE found none: the INSERT does
    nothing, and the UPDATE, run again, decides on the record as it now is."""
    store = OrmCheckpointStore(using=alias)
    other = OrmCheckpointStore(using=alias)
    real_run = orm._run
    calls = []

    def racing_run(connection, sql, params):
        calls.append(sql.split()[0])
        if sql.startswith("INSERT") and len(calls) == 2:
            with monkeypatch.context() as inner:
                inner.setattr(orm, "_run", real_run)
                if concurrent == "heartbeat":
                    other.save_heartbeat("s", now_ms())
                else:
                    other.save_initial_sync("s", sync_progress(7), expected_batch=None)
        return real_run(connection, sql, params)

    monkeypatch.setattr(orm, "_run", racing_run)
    assert store.save_initial_sync("s", sync_progress(0), expected_batch=None) is written
    assert calls == ["UPDATE", "INSERT", "UPDATE"]
    assert store.find("s").initial_sync == (sync_progress(0) if written else sync_progress(7))


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("existing", [False, True], ids=["new-stream", "existing-stream"])
def test_save_initial_sync_joins_the_callers_transaction(alias, existing):
    """Inside atomic() the conditional write is part of the caller's transaction: rolled
    back with it, and a refused condition leaves the transaction usable."""
    from django.db import transaction

    store = OrmCheckpointStore(using=alias)
    if existing:
        store.save_initial_sync("s", sync_progress(0), expected_batch=None)
    expected = 0 if existing else None

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic(using=alias):
        assert store.save_initial_sync("s", sync_progress(1), expected_batch=expected)
        assert store.find("s").initial_sync == sync_progress(1)
        raise Rollback
    found = store.find("s")
    assert (found and found.initial_sync) == (sync_progress(0) if existing else None)

    with transaction.atomic(using=alias):
        assert not store.save_initial_sync("s", sync_progress(5), expected_batch=4)
        if existing:  # the INSERT meets the row: DO NOTHING / IGNORE, no error
            assert not store.save_initial_sync("s", sync_progress(5), expected_batch=None)
        store.save_processed("s", token("p"), now_ms())
        assert store.save_initial_sync("s", sync_progress(1), expected_batch=expected)
    found = store.find("s")
    assert (found.initial_sync, found.last_processed_token) == (sync_progress(1), token("p"))


@pytest.mark.parametrize("alias", ALIASES)
def test_save_initial_sync_through_the_logging_cursor(alias):
    from django.test.utils import CaptureQueriesContext

    store = OrmCheckpointStore(using=alias)
    with CaptureQueriesContext(connections[alias]) as captured:
        assert store.save_initial_sync("s", sync_progress(0), expected_batch=None)
        assert store.save_initial_sync("s", sync_progress(1), expected_batch=0)
        assert not store.save_initial_sync("s", sync_progress(1), expected_batch=0)
    assert len(captured.captured_queries) == 4  # UPDATE + INSERT, UPDATE, UPDATE
    assert store.find("s").initial_sync == sync_progress(1)


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
    assert store.save_initial_sync("routed", sync_progress(0), expected_batch=None)
    assert StreamCheckpoint.objects.using("other").filter(pk="routed").exists()
    assert not StreamCheckpoint.objects.using("default").filter(pk="routed").exists()
    assert store.find("routed").last_processed_token == token("p")
    assert store.find("routed").initial_sync == sync_progress(0)
    assert [cp.stream_name for cp in store.list_checkpoints()] == ["routed"]
    store.delete("routed")
    assert not StreamCheckpoint.objects.using("other").exists()
