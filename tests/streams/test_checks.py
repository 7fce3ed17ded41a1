"""Declaring streams: decorators, the programmatic API, and their validation in checks."""

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from flowwarden_django.common.durations import parse_duration
from flowwarden_django.streams.registry import (
    change_stream,
    checkpoint,
    register_stream,
    restart_policy,
    stream_registry,
)
from flowwarden_django.streams.spec import CheckpointSpec, RestartPolicySpec


@pytest.fixture(autouse=True)
def clean_registry():
    stream_registry.clear()
    yield
    stream_registry.clear()


def stream_messages():
    return [
        m
        for m in run_checks(databases=[])
        if m.id.startswith("flowwarden_django.E1") or m.id.startswith("flowwarden_django.W1")
    ]


def test_decorated_class_with_defaults():
    @change_stream(collection="orders")
    @checkpoint(save_every_n=10)
    class OrderEvents:
        def on_insert(self, doc):
            pass

    spec = stream_registry.get("order-events")
    assert spec.collection == "orders"
    assert spec.checkpoint == CheckpointSpec(save_every_n=10)
    assert spec.restart_policy == RestartPolicySpec()
    assert set(spec.handlers) == {"insert"}
    assert stream_messages() == []


def test_checkpoint_above_change_stream_works_too():
    @checkpoint(save_every_n=5)
    @restart_policy(max_attempts=3)
    @change_stream("orders", collection="orders")
    class Orders:
        def on_change(self, ctx):
            pass

    spec = stream_registry.get("orders")
    assert spec.checkpoint.save_every_n == 5
    assert spec.restart_policy.max_attempts == 3


@pytest.mark.parametrize(
    ("declare", "attribute"),
    [
        (lambda: checkpoint(save_every_n=0), "checkpoint.save_every_n"),
        (lambda: checkpoint(save_interval_seconds=-1), "checkpoint.save_interval_seconds"),
        (
            lambda: checkpoint(idle_heartbeat_interval_seconds=-5),
            "checkpoint.idle_heartbeat_interval_seconds",
        ),
        (lambda: checkpoint(on_history_lost="IGNORE"), "checkpoint.on_history_lost"),
        (lambda: checkpoint(start_position="EARLIEST"), "checkpoint.start_position"),
        (lambda: restart_policy(initial_delay="5 parsecs"), "restart_policy.initial_delay"),
        (lambda: restart_policy(multiplier=0.5), "restart_policy.multiplier"),
    ],
)
def test_invalid_setting_names_the_stream_and_the_attribute(declare, attribute):
    @change_stream("broken-orders", collection="orders")
    @declare()
    class Broken:
        def on_insert(self, doc):
            pass

    errors = [m for m in stream_messages() if m.level >= 40]
    assert len(errors) == 1, errors
    assert "stream 'broken-orders'" in errors[0].msg
    assert attribute in errors[0].msg
    with pytest.raises(SystemCheckError, match="broken-orders"):
        call_command("check", databases=[])


def test_structural_errors():
    @change_stream("no-handler", collection="x")
    class NoHandler:
        pass

    @change_stream("filtered-deletes", collection="x")
    class FilteredDeletes:
        def filter(self, ctx):
            return True

        def on_delete(self, ctx):
            pass

    @change_stream("bad-shape", collection="x")
    class BadShape:
        def on_insert(self, a, b, c):
            pass

    register_stream("no-collection", "", on_insert=lambda doc: None)
    register_stream("unknown-client", "x", on_insert=lambda doc: None, client="nope")
    register_stream("bad-choice", "x", on_insert=lambda doc: None, full_document="sometimes")
    register_stream(
        "leader",
        "x",
        on_insert=lambda doc: None,
        deployment_mode="SINGLE_LEADER",
        lock_service="nope",
    )
    texts = {m.msg for m in stream_messages() if m.level >= 40}
    expected = [
        ("no-handler", "handlers"),
        ("filtered-deletes", "filter"),
        ("bad-shape", "on_insert"),
        ("no-collection", "collection"),
        ("unknown-client", "client"),
        ("bad-choice", "full_document"),
        ("leader", "lock_service"),
    ]
    for stream, attribute in expected:
        assert any(f"stream {stream!r}" in t and f": {attribute}:" in t for t in texts), (
            stream,
            texts,
        )


def test_duplicate_names_are_an_error():
    register_stream("orders", "a", on_insert=lambda doc: None)
    register_stream("orders", "b", on_insert=lambda doc: None)
    errors = [m for m in stream_messages() if m.id == "flowwarden_django.E113"]
    assert len(errors) == 1 and "declared twice" in errors[0].msg


def test_transactional_needs_the_orm_store_on_the_handler_database(settings):
    settings.FLOWWARDEN = {
        **settings.FLOWWARDEN,
        "CHECKPOINT_STORES": {
            "default": {"BACKEND": "flowwarden_django.streams.backends.orm.OrmCheckpointStore"},
            "mem": {"BACKEND": "flowwarden_django.streams.backends.memory.InMemoryCheckpointStore"},
        },
    }
    register_stream("ok", "x", on_insert=lambda doc: None, transactional=True)
    register_stream(
        "wrong-store", "x", on_insert=lambda doc: None, transactional=True, checkpoint_store="mem"
    )
    errors = [m.msg for m in stream_messages() if m.level >= 40]
    assert len(errors) == 1 and "wrong-store" in errors[0] and "transactional" in errors[0]


def test_warnings():
    @change_stream("quiet", collection="x")
    @checkpoint(idle_heartbeat_interval_seconds=0, save_interval_seconds=0, save_every_n=5)
    class Quiet:
        def on_update(self, doc):
            pass

    codes = sorted(m.id for m in stream_messages())
    assert codes == ["flowwarden_django.W101", "flowwarden_django.W103", "flowwarden_django.W104"]


def test_parse_duration():
    assert parse_duration("500ms") == 0.5
    assert parse_duration("30s") == 30
    assert parse_duration("2m") == 120
    assert parse_duration(1.5) == 1.5
    assert parse_duration("1h") == 3600
    assert parse_duration("7d") == 7 * 86400
    for bad in ["1y", "soon", "", "-1s", True, float("nan"), float("inf")]:
        with pytest.raises(ValueError, match="invalid duration"):
            parse_duration(bad)


@pytest.mark.parametrize(
    "clients",
    [
        {"default": {"URL": "http://x"}},
        {"default": {}},
        {"default": {"URL": "mongodb://x", "OPTIONS": [1]}},
        ["x"],
    ],
)
def test_mongo_clients_need_a_mongodb_url(settings, clients):
    settings.FLOWWARDEN = {**settings.FLOWWARDEN, "MONGO_CLIENTS": clients}
    errors = [m for m in run_checks(databases=[]) if m.id == "flowwarden_django.E114"]
    assert len(errors) == 1 and "MONGO_CLIENTS" in errors[0].msg


def test_error_handling_without_a_dead_letter_queue_is_a_warning():
    @change_stream("with-errors", collection="x")
    class WithErrors:
        def on_insert(self, doc):
            pass

        def on_error(self, exc, ctx):
            return "SKIP"

    codes = [m.id for m in stream_messages()]
    assert codes == ["flowwarden_django.W106"]


def test_retry_and_dlq_bounds_are_checked():
    from flowwarden_django.streams.spec import DeadLetterQueueSpec, RetryPolicySpec

    register_stream(
        "bounds",
        "x",
        on_insert=lambda doc: None,
        retry_policy=RetryPolicySpec(max_attempts=0, initial_delay="5 hours", multiplier=0),
        dead_letter_queue=DeadLetterQueueSpec(retention_days=-1, store="nope"),
    )
    texts = [m.msg for m in stream_messages() if m.level >= 40]
    for attribute in (
        "retry_policy.max_attempts",
        "retry_policy.initial_delay",
        "retry_policy.multiplier",
        "dead_letter_queue.retention_days",
        "dead_letter_queue.store",
    ):
        assert any(f": {attribute}:" in t for t in texts), (attribute, texts)


def test_one_error_handler_per_exception_type():
    from flowwarden_django.streams import on_error

    @change_stream("twice", collection="x")
    class Twice:
        def on_insert(self, doc):
            pass

        @on_error(KeyError)
        def first(self, exc, ctx):
            return "SKIP"

        @on_error(KeyError, ValueError)
        def second(self, exc, ctx):
            return "DLQ"

        @on_error()
        def bad_shape(self, exc):
            return "DLQ"

    errors = [m for m in stream_messages() if m.id == "flowwarden_django.E117"]
    assert len(errors) == 2, [m.msg for m in errors]
    assert any("KeyError is already handled" in m.msg for m in errors)
    assert any("takes (exc, ctx)" in m.msg for m in errors)


def test_transactional_store_must_write_where_the_handler_writes():
    register_stream(
        "elsewhere", "x", on_insert=lambda doc: None, transactional=True, transaction_using="other"
    )
    errors = [m.msg for m in stream_messages() if m.level >= 40]
    assert len(errors) == 1 and "elsewhere" in errors[0]


def test_save_every_n_must_be_a_number_not_a_bool():
    register_stream(
        "flag", "x", on_insert=lambda doc: None, checkpoint=CheckpointSpec(save_every_n=True)
    )
    errors = [m.msg for m in stream_messages() if m.level >= 40]
    assert len(errors) == 1 and "checkpoint.save_every_n" in errors[0]
