"""``manage.py flowwarden_checkpoints`` through ``call_command``, mostly on the ORM store."""

import io
import json
import sys
from datetime import timedelta

import pytest
from bson import Binary, ObjectId, Timestamp
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from flowwarden_django.common.formatting import age_text, truncate
from flowwarden_django.streams import Checkpoint, CheckpointStore, checkpoint_stores
from flowwarden_django.streams.initial_sync import encode_id
from flowwarden_django.streams.operations.display import short_token

PROCESSED = {"_data": "8263A1B2C3000000012B022C0100296E5A1004ABCDEF0123456789"}
SEEN = {"_data": "8263A1B2D4000000022B022C0100296E5A1004ABCDEF0123456789"}
NEWER = {"_data": "8263A1B2E5000000032B022C0100296E5A1004ABCDEF0123456789"}
ORM = "flowwarden_django.streams.backends.orm.OrmCheckpointStore"
MEMORY = "flowwarden_django.streams.backends.memory.InMemoryCheckpointStore"


class NoListStore(CheckpointStore):
    """A store with only the abstract methods: it cannot list."""

    def __init__(self) -> None:
        self.records: dict[str, Checkpoint] = {}

    def save(self, checkpoint: Checkpoint) -> None:
        self.records[checkpoint.stream_name] = checkpoint

    def find(self, stream_name: str) -> Checkpoint | None:
        return self.records.get(stream_name)

    def delete(self, stream_name: str) -> None:
        self.records.pop(stream_name, None)


class BrokenStore(NoListStore):
    """Fails to build, as a backend whose optional extra is missing does."""

    def __init__(self) -> None:
        raise ImproperlyConfigured("BrokenStore needs the 'nothing' package")


class TTYInput(io.StringIO):
    def isatty(self) -> bool:
        return True


def stores(**extra):
    return override_settings(
        FLOWWARDEN={"CHECKPOINT_STORES": {"default": {"BACKEND": ORM}, **extra}}
    )


def run(*args, **options):
    out, err = io.StringIO(), io.StringIO()
    call_command("flowwarden_checkpoints", *args, stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def store():
    return checkpoint_stores["default"]


@pytest.fixture
def orders(store):
    now = timezone.now()
    checkpoint = Checkpoint(
        "orders",
        instance_id="worker-1",
        last_seen_token=SEEN,
        last_seen_at=now - timedelta(seconds=12),
        last_processed_token=PROCESSED,
        last_processed_at=now - timedelta(minutes=3),
        last_heartbeat_at=now - timedelta(hours=2),
        metadata={"owner": "billing"},
    )
    store.save(checkpoint)
    return store.find("orders")


@pytest.fixture
def non_interactive(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO())


@pytest.fixture
def answer(monkeypatch):
    monkeypatch.setattr(sys, "stdin", TTYInput())

    def set_answer(text):
        monkeypatch.setattr("builtins.input", lambda *args: text)

    return set_answer


# -- list ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_list_table(store, orders):
    store.save(Checkpoint("payments", last_processed_token={"_data": "82AB", "x": 1}))

    out, err = run("list")

    header, first, second = out.splitlines()
    assert header.split()[:3] == ["STREAM", "INSTANCE", "PROCESSED"]
    assert first.startswith("orders")
    assert "worker-1" in first
    assert "8263A1B2C3000000012…" in first
    assert "8263A1B2D4000000022…" in first
    assert "3m ago" in first
    assert "12s ago" in first
    assert "2h ago" in first
    assert second.startswith("payments")
    assert "82AB" in second
    assert second.count("—") == 5  # instance, processed age, seen token and age, heartbeat
    assert err == ""


@pytest.mark.django_db
def test_list_json(orders):
    out, _ = run("list", "--json")

    [item] = json.loads(out)
    assert item == {
        "stream_name": "orders",
        "instance_id": "worker-1",
        "last_processed_token": PROCESSED,
        "last_processed_at": orders.last_processed_at.isoformat(),
        "last_seen_token": SEEN,
        "last_seen_at": orders.last_seen_at.isoformat(),
        "last_heartbeat_at": orders.last_heartbeat_at.isoformat(),
        "metadata": {"owner": "billing"},
        "initial_sync": None,
    }


@pytest.mark.django_db
def test_list_json_with_initial_sync_progress(store, orders):
    progress = {
        "phase": "copying",
        "batch": 12,
        "last_id": '{"$oid": "65a1b2c3d4e5f60718293a4b"}',
        "copied": 12000,
        "estimated": 50000,
        "started_at": "2026-06-01T12:30:15.123000+00:00",
        "nested": {"rate": 0.5, "done": False, "skipped": None, "ids": [1, "2"]},
    }
    assert store.save_initial_sync("orders", progress, expected_batch=None)
    store.save_heartbeat("payments", timezone.now())

    out, _ = run("list", "--json")

    first, second = json.loads(out)
    assert first["initial_sync"] == progress
    assert second["initial_sync"] is None
    assert json.loads(run("show", "orders", "--json")[0])["initial_sync"] == progress


@pytest.mark.django_db
def test_list_empty():
    assert run("list") == ("No checkpoints in store 'default'.\n", "")
    assert json.loads(run("list", "--json")[0]) == []


def test_list_on_the_memory_store_with_store_before_or_after_the_action():
    with stores(mem={"BACKEND": MEMORY}):
        checkpoint_stores["mem"].save_processed("orders", PROCESSED, timezone.now())

        before, _ = run("--store", "mem", "list")
        after, _ = run("list", "--store", "mem")

    assert before == after
    assert "orders" in before
    assert "8263A1B2C3000000012…" in before


def test_json_writes_bson_types_as_relaxed_extended_json():
    token = {"_data": "8263", "ts": Timestamp(1700000000, 2), "raw": Binary(b"\x01")}
    with stores(mem={"BACKEND": MEMORY}):
        checkpoint_stores["mem"].save(Checkpoint("orders", last_seen_token=token))

        out, _ = run("show", "orders", "--store", "mem", "--json")

    assert json.loads(out)["last_seen_token"] == {
        "_data": "8263",
        "ts": {"$timestamp": {"t": 1700000000, "i": 2}},
        "raw": {"$binary": {"base64": "AQ==", "subType": "00"}},
    }


def test_list_refused_when_the_store_cannot_list():
    with (
        stores(nolist={"BACKEND": "tests.management.test_flowwarden_checkpoints.NoListStore"}),
        pytest.raises(CommandError) as info,
    ):
        run("list", "--store", "nolist")

    message = str(info.value)
    assert "'nolist' (NoListStore) cannot list its checkpoints" in message
    assert "flowwarden_checkpoints --store nolist show NAME" in message


# -- show ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_show(orders):
    out, _ = run("show", "orders")

    lines = dict(line.split(":", 1) for line in out.splitlines())
    fields = {label.strip(): value.strip() for label, value in lines.items()}
    assert fields["Stream"] == "orders"
    assert fields["Store"] == "default"
    assert fields["Instance id"] == "worker-1"
    assert json.loads(fields["Processed token"]) == PROCESSED
    assert json.loads(fields["Seen token"]) == SEEN
    assert fields["Processed at"] == f"{orders.last_processed_at.isoformat()} (3m ago)"
    assert fields["Seen at"] == f"{orders.last_seen_at.isoformat()} (12s ago)"
    assert fields["Heartbeat at"] == f"{orders.last_heartbeat_at.isoformat()} (2h ago)"
    assert json.loads(fields["Metadata"]) == {"owner": "billing"}


@pytest.mark.django_db
def test_show_json(orders):
    out, _ = run("show", "orders", "--json")

    item = json.loads(out)
    assert item["last_processed_token"] == PROCESSED
    assert item["last_heartbeat_at"] == orders.last_heartbeat_at.isoformat()
    assert item["initial_sync"] is None


def show_fields(out: str) -> dict[str, str]:
    """``show``'s lines as label → value (labels stripped of their indentation)."""
    lines = dict(line.split(":", 1) for line in out.splitlines())
    return {label.strip(): value.strip() for label, value in lines.items()}


@pytest.mark.django_db
def test_show_without_initial_sync(orders):
    out, _ = run("show", "orders")
    assert out.splitlines()[-1].split() == ["Initial", "sync:", "—"]


@pytest.mark.django_db
def test_show_initial_sync_in_progress(store, orders):
    started = timezone.now() - timedelta(minutes=4)
    progress = {
        "phase": "copying",
        "reason": "first start",
        "batch": 12,
        "last_id": encode_id(ObjectId("65a1b2c3d4e5f60718293a4b")),
        "copied": 12000,
        "estimated": 50000,
        "started_at": started.isoformat(),
        "finished_at": None,
    }
    assert store.save_initial_sync("orders", progress, expected_batch=None)

    out, _ = run("show", "orders")

    fields = show_fields(out)
    assert fields["Initial sync"] == "copying (first start)"
    assert fields["Copied"] == "12,000 of ~50,000 (24%)"
    assert fields["Started at"] == f"{started.isoformat()} (4m ago)"
    assert fields["Finished at"] == "—"
    assert fields["Last _id"] == '{"$oid": "65a1b2c3d4e5f60718293a4b"}'
    assert fields["Batch"] == "12"
    assert "Last batch at" not in fields  # a record without updated_at
    # The block follows the other fields, its details indented under its heading.
    block = out.splitlines()[-6:]
    assert block[0].startswith("Initial sync:")
    assert all(line.startswith("  ") for line in block[1:])


@pytest.mark.django_db
def test_show_finished_initial_sync(store, orders):
    finished = timezone.now() - timedelta(hours=2)
    started = finished - timedelta(seconds=90)
    progress = {
        "phase": "done",
        "reason": "history lost",
        "batch": 4,
        "last_id": encode_id(300),
        "copied": 300,
        "estimated": 250,  # an estimate: it may be below what was copied
        "started_at": started.isoformat(),
        "updated_at": finished.isoformat(),
        "finished_at": finished.isoformat(),
    }
    assert store.save_initial_sync("orders", progress, expected_batch=None)

    fields = show_fields(run("show", "orders")[0])

    assert fields["Initial sync"] == "done (history lost)"
    assert fields["Copied"] == "300 of ~250 (100%)"
    assert fields["Started at"] == f"{started.isoformat()} (2h ago)"
    assert fields["Last batch at"] == f"{finished.isoformat()} (2h ago)"
    assert fields["Finished at"] == f"{finished.isoformat()} (2h ago)"
    assert fields["Last _id"] == "300"
    assert fields["Batch"] == "4"


@pytest.mark.django_db
def test_show_initial_sync_with_unexpected_values(store, orders):
    progress = {
        "phase": "copying",
        "batch": 1,
        "last_id": '{"$oid": "65a1b2c3d4e5f60718293a4b"}',  # not encode_id's form
        "copied": 10,
        "started_at": "yesterday",
    }
    assert store.save_initial_sync("orders", progress, expected_batch=None)

    fields = show_fields(run("show", "orders")[0])

    assert fields["Initial sync"] == "copying"
    assert fields["Copied"] == "10"  # no estimate
    assert fields["Started at"] == "yesterday"
    assert fields["Last _id"] == '{"$oid": "65a1b2c3d4e5f60718293a4b"}'


@pytest.mark.django_db
def test_show_missing():
    with pytest.raises(CommandError) as info:
        run("show", "x")

    assert str(info.value) == (
        "No checkpoint for stream 'x' in store 'default'. "
        "Run `manage.py flowwarden_checkpoints list` to see the streams."
    )


# -- reset -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_reset_with_yes_clears_the_position_and_keeps_owner_and_metadata(store, orders):
    out, err = run("reset", "orders", "--yes")

    assert store.find("orders") == Checkpoint(
        "orders", instance_id="worker-1", metadata={"owner": "billing"}
    )
    assert "processed token: " in out
    assert out.endswith("Checkpoint 'orders' reset in store 'default'.\n")
    assert err == ""


@pytest.mark.django_db
def test_reset_with_seen_token(store, orders):
    before = timezone.now()

    run("reset", "orders", "--seen-token", json.dumps(NEWER), "--yes")

    after = store.find("orders")
    assert after.last_seen_token == NEWER
    assert after.last_seen_at >= before
    assert after.last_heartbeat_at == after.last_seen_at
    assert after.last_processed_token is None
    assert after.last_processed_at is None
    assert (after.instance_id, after.metadata) == ("worker-1", {"owner": "billing"})


@pytest.mark.django_db
def test_reset_cancelled(store, orders, answer):
    answer("no")

    out, _ = run("reset", "orders")

    assert "Type 'yes' to continue: " in out
    assert out.endswith("Reset cancelled.\n")
    assert store.find("orders") == orders


@pytest.mark.django_db
def test_reset_confirmed(store, orders, answer):
    answer("yes")

    out, _ = run("reset", "orders")

    assert "reset in store 'default'" in out
    assert store.find("orders").last_processed_token is None


@pytest.mark.django_db
def test_reset_refused_without_yes_when_stdin_is_not_interactive(store, orders, non_interactive):
    with pytest.raises(CommandError, match="pass --yes"):
        run("reset", "orders")

    assert store.find("orders") == orders


@pytest.mark.django_db
@pytest.mark.django_db
@pytest.mark.parametrize(
    "args", [["--no-input", "reset", "orders"], ["reset", "orders", "--noinput"]]
)
def test_reset_without_input(store, orders, non_interactive, args):
    run(*args)

    assert store.find("orders").last_processed_token is None


@pytest.mark.django_db
def test_reset_with_interactive_false(store, orders, non_interactive):
    run("reset", "orders", interactive=False)

    assert store.find("orders").last_processed_token is None


@pytest.mark.django_db
def test_reset_keeps_a_processed_anchor_written_concurrently(store, orders, monkeypatch):
    real_reset = store.reset_after_history_lost

    def racing_reset(stream_name, fresh, expected_dead_processed, at):
        store.save_processed(stream_name, NEWER, timezone.now())
        real_reset(stream_name, fresh, expected_dead_processed, at)

    monkeypatch.setattr(store, "reset_after_history_lost", racing_reset)

    out, err = run("reset", "orders", "--yes")

    after = store.find("orders")
    assert after.last_processed_token == NEWER
    assert after.last_seen_token is None
    assert "A consumer seems to be running on 'orders'" in err
    assert "was kept" in err
    assert "reset in store" not in out


@pytest.mark.django_db
def test_reset_missing():
    with pytest.raises(CommandError, match="No checkpoint for stream 'x' in store 'default'"):
        run("reset", "x", "--yes")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("{not json", "--seen-token: not valid Extended JSON"),
        ('"8263"', "--seen-token: a resume token must be a JSON object"),
    ],
)
def test_reset_with_an_invalid_seen_token(text, error):
    with pytest.raises(CommandError) as info:
        run("reset", "orders", "--seen-token", text, "--yes")

    assert str(info.value).startswith(error)


# -- delete ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_delete_with_yes(store, orders):
    out, _ = run("delete", "orders", "--yes")

    assert store.find("orders") is None
    assert out.endswith("Checkpoint 'orders' deleted from store 'default'.\n")


@pytest.mark.django_db
def test_delete_cancelled(store, orders, answer):
    answer("")

    out, _ = run("delete", "orders")

    assert out.endswith("Delete cancelled.\n")
    assert store.find("orders") == orders


@pytest.mark.django_db
def test_delete_missing():
    with pytest.raises(CommandError) as info:
        run("delete", "x", "--yes")

    assert str(info.value).startswith("No checkpoint for stream 'x' in store 'default'.")


def test_delete_missing_on_a_store_without_listing_has_no_list_hint():
    with (
        stores(nolist={"BACKEND": "tests.management.test_flowwarden_checkpoints.NoListStore"}),
        pytest.raises(CommandError) as info,
    ):
        run("delete", "x", "--store", "nolist", "--yes")

    assert str(info.value) == "No checkpoint for stream 'x' in store 'nolist'."


# -- store errors ----------------------------------------------------------------------


def test_unknown_store_alias():
    with pytest.raises(CommandError) as info:
        run("list", "--store", "nope")

    message = str(info.value)
    assert "No checkpoint store 'nope'" in message
    assert "configured aliases: default" in message
    assert message.endswith("(see FLOWWARDEN['CHECKPOINT_STORES'])")


def test_store_that_cannot_be_built():
    with (
        stores(broken={"BACKEND": "tests.management.test_flowwarden_checkpoints.BrokenStore"}),
        pytest.raises(CommandError, match="BrokenStore needs the 'nothing' package"),
    ):
        run("show", "orders", "--store", "broken")


def test_an_action_is_required():
    with pytest.raises(CommandError, match="ACTION"):
        run()


# -- formatting helpers ----------------------------------------------------------------


def test_age_text():
    now = timezone.now()
    assert age_text(None, now) == "—"
    assert age_text(now - timedelta(seconds=12), now) == "12s ago"
    assert age_text(now - timedelta(seconds=200), now) == "3m ago"
    assert age_text(now - timedelta(hours=2, minutes=59), now) == "2h ago"
    assert age_text(now - timedelta(days=4, hours=23), now) == "4d ago"
    assert age_text(now + timedelta(seconds=5), now) == "in 5s"


def test_short_token():
    assert short_token(None) == "—"
    assert short_token({"_data": "82AB"}) == "82AB"
    assert short_token({"_data": "8" * 30}, width=10) == "888888888…"
    assert short_token({"_data": 1, "n": "x"}) == '{"_data":1,"n":"x"}'
    assert truncate("abc", 3) == "abc"


@pytest.mark.django_db
def test_database_errors_become_command_errors(monkeypatch):
    from django.db import OperationalError

    from flowwarden_django.streams.backends.orm import OrmCheckpointStore

    def broken(self):
        raise OperationalError("no such table: flowwarden_django_streamcheckpoint")

    monkeypatch.setattr(OrmCheckpointStore, "list_checkpoints", broken)
    with pytest.raises(CommandError, match=r"manage\.py migrate"):
        call_command("flowwarden_checkpoints", "list")


@pytest.mark.django_db
def test_reset_of_a_copying_stream_says_the_collection_is_copied_again(store, orders):
    from flowwarden_django.streams.registry import register_stream, stream_registry
    from flowwarden_django.streams.spec import CheckpointSpec

    register_stream(
        "orders",
        "orders",
        on_insert=lambda doc: None,
        on_snapshot=lambda doc: None,
        checkpoint=CheckpointSpec(start_position="COPY_EXISTING"),
    )
    try:
        out, _ = run("reset", "orders", "--yes")
    finally:
        stream_registry.unregister("orders")
    assert "copies the whole collection again" in out
    assert "not delivered" not in out
