"""Resync on demand (``flowwarden_streams resync``, the console's Resync button) and the
operator's view of a copy: progress, rate and ETA in the status, state ``copying``.

Each resync scenario compares the mirror with the source's final documents: same ids,
same field values.
"""

from __future__ import annotations

import io
import re
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from flowwarden_django.models import StreamControl, StreamWorker
from flowwarden_django.streams import register_stream, stream_registry
from flowwarden_django.streams.clients import pymongo_source
from flowwarden_django.streams.initial_sync.progress import (
    CopyProgress,
    copy_progress,
    duration_text,
)
from flowwarden_django.streams.initial_sync.resync import ResyncError, request_resync
from flowwarden_django.streams.operations.status import health_report, stream_status
from flowwarden_django.streams.registry import StreamRegistry
from flowwarden_django.streams.runtime import StreamConsumer
from flowwarden_django.streams.runtime.manager import StreamManager
from flowwarden_django.streams.spec import CheckpointSpec
from flowwarden_django.streams.stores import checkpoint_stores
from flowwarden_django.testkit.fake_source import FakeChangeSource, FakeOplog
from tests.streams.test_initial_sync import (  # noqa: F401 (fixtures)
    FAST,
    Mirror,
    _scripted_rs,
    _state,
    scripted,
)
from tests.support.status_rows import NOW, worker

MEMORY = "flowwarden_django.streams.backends.memory."
T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


# -- the progress as an operator reads it --------------------------------------------------


def record(**fields: Any) -> dict[str, Any]:
    return {
        "phase": "copying",
        "batch": 3,
        "last_id": '{"v": 3000}',
        "copied": 3000,
        "estimated": 10_000,
        "started_at": T0.isoformat(),
        "updated_at": (T0 + timedelta(seconds=2)).isoformat(),
        "finished_at": None,
        "reason": "first start",
        **fields,
    }


def test_progress_rate_eta_and_summary():
    progress = copy_progress(record())
    assert progress == CopyProgress(
        phase="copying",
        reason="first start",
        copied=3000,
        estimated=10_000,
        started_at=T0,
        updated_at=T0 + timedelta(seconds=2),
        finished_at=None,
    )
    assert progress.copying and progress.percent == 30.0
    assert progress.rate == 1500.0 and progress.eta_seconds == pytest.approx(7000 / 1500)
    assert progress.summary() == "copying (first start): 3,000 of ~10,000 (30%), 1,500/s, ETA 5s"
    assert progress.to_json() == {
        "phase": "copying",
        "reason": "first start",
        "copied": 3000,
        "estimated": 10_000,
        "percent": 30.0,
        "rate_per_second": 1500.0,
        "eta_seconds": 4.7,
        "started_at": T0.isoformat(),
        "updated_at": (T0 + timedelta(seconds=2)).isoformat(),
        "finished_at": None,
    }
    assert "last_id" not in progress.to_json()  # an _id may be data


def test_progress_when_done_waiting_or_underestimated():
    done = copy_progress(
        record(phase="done", copied=10_000, finished_at=(T0 + timedelta(seconds=125)).isoformat())
    )
    assert not done.copying and done.eta_seconds is None
    assert done.duration_seconds == 125
    assert done.summary() == "copied 10,000 documents (first start) in 2m 05s"
    waiting = copy_progress(
        record(copied=0, estimated=None, started_at=None, updated_at=None, reason="on demand")
    )
    assert waiting.rate is None and waiting.percent is None and waiting.eta_seconds is None
    assert waiting.summary() == "copying (on demand): 0, waiting for a process to start it"
    over = copy_progress(record(copied=12_000))
    assert over.percent == 100.0 and over.eta_seconds == 0
    assert copy_progress(None) is None
    assert [duration_text(s) for s in (0.4, 59, 61, 3600 * 2 + 600)] == [
        "0s",
        "59s",
        "1m 01s",
        "2h 10m",
    ]


@pytest.mark.django_db
def test_status_shows_a_copying_stream_as_working_with_its_progress():
    registry = StreamRegistry()
    register_stream("orders", "orders", on_snapshot=lambda doc: None, registry=registry)
    worker("orders", "host-a:1", "copying")
    store = checkpoint_stores["default"]
    store.save_initial_sync("orders", record(), expected_batch=None)
    (status,) = stream_status(NOW, registry)
    assert status.state == "copying" and status.healthy
    assert status.initial_sync.copied == 3000 and status.initial_sync.copying
    report = health_report(NOW, registry, details=False)
    entry = report["streams"]["orders"]
    assert report["healthy"] and entry["status"] == "UP"
    assert entry["initial_sync"]["copied"] == 3000
    assert entry["initial_sync"]["started_at"] == T0.isoformat()


@pytest.mark.django_db
def test_status_command_notes_the_copy(monkeypatch):
    register_stream("st-copy", "orders", on_snapshot=lambda doc: None)
    try:
        worker("st-copy", "host-a:1", "copying", updated=0)
        monkeypatch.setattr("flowwarden_django.streams.operations.status.timezone.now", lambda: NOW)
        checkpoint_stores["default"].save_initial_sync("st-copy", record(), expected_batch=None)
        out = io.StringIO()
        call_command("flowwarden_streams", "status", stdout=out)
    finally:
        stream_registry.unregister("st-copy")
    line = next(line for line in out.getvalue().splitlines() if line.startswith("st-copy"))
    assert " copying " in line
    assert "copying (first start): 3,000 of ~10,000 (30%), 1,500/s, ETA 5s" in line


# -- asking for a resync ------------------------------------------------------------------


@pytest.fixture
def registry() -> StreamRegistry:
    return StreamRegistry()


@pytest.mark.django_db
def test_a_resync_request_is_one_conditional_write_and_a_restart(registry):
    register_stream("orders", "orders", on_insert=lambda doc: None, registry=registry)
    now = datetime.now(UTC)
    request_resync("orders", by="ops", now=now, registry=registry)
    progress = checkpoint_stores["default"].find("orders").initial_sync
    assert progress["phase"] == "copying" and progress["reason"] == "on demand"
    assert progress["requested_by"] == "ops" and progress["batch"] == 0
    assert progress["last_id"] is None and progress["started_at"] is None
    control = StreamControl.objects.get(stream_name="orders")
    assert control.restart_requested_at == now and control.updated_by == "ops"
    with pytest.raises(ResyncError, match="already copying"):
        request_resync("orders", registry=registry)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"on_insert": lambda doc: None, "checkpoint": CheckpointSpec(start_position="LATEST")},
            "starts at LATEST",
        ),
        ({"on_update": lambda doc: None}, "no handler for copied documents"),
    ],
)
def test_resync_refusals_say_why(registry, options, message):
    register_stream("orders", "orders", registry=registry, **options)
    with pytest.raises(ResyncError, match=message):
        request_resync("orders", registry=registry)
    with pytest.raises(ResyncError, match="no stream named 'nope'; declared: orders"):
        request_resync("nope", registry=registry)
    assert not StreamControl.objects.exists()


@pytest.mark.django_db
def test_the_command_refuses_without_a_terminal_or_for_an_unknown_stream(monkeypatch):
    register_stream("rs-cmd", "orders", on_insert=lambda doc: None)
    try:
        monkeypatch.setattr("sys.stdin", io.StringIO(""))
        with pytest.raises(CommandError, match="pass --yes"):
            call_command("flowwarden_streams", "resync", "rs-cmd", stdout=io.StringIO())
        with pytest.raises(CommandError, match="No stream named 'nope'"):
            call_command("flowwarden_streams", "resync", "nope", "--yes")
        out = io.StringIO()
        call_command("flowwarden_streams", "resync", "rs-cmd", "--yes", stdout=out)
        assert "No process runs rs-cmd now: the copy starts when one does" in out.getvalue()
        with pytest.raises(CommandError, match="Cannot resync: stream 'rs-cmd' is already copying"):
            call_command("flowwarden_streams", "resync", "rs-cmd", "--yes")
    finally:
        stream_registry.unregister("rs-cmd")


# -- resync scenarios ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_wire_resync_on_demand_copies_what_the_stream_never_saw(scripted, registry):  # noqa: F811
    """A stream started after documents existed (no COPY_EXISTING) misses them; a resync
    copies them, and changes made during the copy arrive after it."""
    scripted.seed("app", "orders", [{"_id": i, "n": i} for i in range(1, 2001)])
    mirror = Mirror()
    copied: list[Any] = []

    def on_snapshot(doc: Any, ctx: Any) -> None:
        mirror.on_snapshot(doc, ctx)
        copied.append(doc["_id"])
        if len(copied) == 700:
            scripted.update("app", "orders", 5, {"n": -5})
            scripted.update("app", "orders", 1900, {"n": -1900, "x": 1})
            scripted.delete("app", "orders", 6)
            scripted.delete("app", "orders", 1999)
            scripted.insert("app", "orders", {"_id": 5000, "n": 1})

    spec = register_stream(
        "orders",
        "orders",
        database="app",
        registry=registry,
        on_insert=mirror.on_insert,
        on_update=mirror.on_update,
        on_delete=mirror.on_delete,
        on_snapshot=on_snapshot,
        checkpoint=CheckpointSpec(copy_batch_size=250),
        restart_policy=FAST,
    )
    store = checkpoint_stores["default"]
    StreamConsumer(spec, store, pymongo_source).run(burst=True)
    scripted.insert("app", "orders", {"_id": 3000, "n": 3})
    StreamConsumer(spec, store, pymongo_source).run(burst=True)
    assert set(mirror.docs) == {3000}  # the 2,000 older documents were never seen

    request_resync("orders", by="ops", registry=registry)
    StreamConsumer(spec, store, pymongo_source).run(burst=True)
    assert mirror.docs == _state(scripted)
    progress = store.find("orders").initial_sync
    assert progress["phase"] == "done" and progress["reason"] == "on demand"
    assert progress["requested_by"] == "ops"
    assert len(copied) == len(set(copied)) == progress["copied"]  # one pass

    scripted.update("app", "orders", 7, {"n": 70})  # streaming goes on afterwards
    StreamConsumer(spec, store, pymongo_source).run(burst=True)
    assert mirror.docs == _state(scripted)


@pytest.fixture
def managed(settings):
    settings.FLOWWARDEN = {
        **settings.FLOWWARDEN,
        "CHECKPOINT_STORES": {"default": {"BACKEND": MEMORY + "InMemoryCheckpointStore"}},
        "STATUS_INTERVAL": "250ms",
    }
    oplog = FakeOplog()
    mirror = Mirror()
    lock = threading.Lock()
    copied = threading.Event()

    def on_snapshot(doc: Any, ctx: Any) -> None:
        with lock:
            mirror.on_snapshot(doc, ctx)
        time.sleep(0.001)  # a copy long enough for the progress bar to draw
        if doc["_id"] == 1500 and not copied.is_set():
            copied.set()
            oplog.update(1, {"n": -1})  # during the copy
            oplog.insert({"_id": 9000, "n": 9})

    register_stream(
        "rs-managed",
        "orders",
        on_insert=mirror.on_insert,
        on_update=mirror.on_update,
        on_delete=mirror.on_delete,
        on_snapshot=on_snapshot,
        checkpoint=CheckpointSpec(copy_batch_size=200, save_interval_seconds=0),
    )
    manager = StreamManager(source_factory=lambda spec: FakeChangeSource(oplog), instance_id="i1")
    yield manager, oplog, mirror
    manager.stop_all(timeout=10)
    stream_registry.unregister("rs-managed")


def wait_until(condition: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.mark.django_db(transaction=True)
def test_resync_right_after_a_graceful_stop_is_requested_for_the_next_start(managed):
    """Issue 24: the stopped process's row still counted as an instance, so the command
    waited for a restart that never came and exited 1."""
    manager, _oplog, _mirror = managed
    manager.start("rs-managed")
    wait_until(
        lambda: StreamWorker.objects.filter(stream_name="rs-managed", state="running").exists(),
        "the process's status row",
    )
    manager.stop_all(timeout=10)
    assert not StreamWorker.objects.filter(stream_name="rs-managed").exists()
    status = io.StringIO()
    call_command("flowwarden_streams", "status", stdout=status)
    (line,) = [x for x in status.getvalue().splitlines() if x.startswith("rs-managed")]
    assert " stopped " in line and re.search(r"\s0\s", line)

    out = io.StringIO()
    call_command("flowwarden_streams", "resync", "rs-managed", "--yes", stdout=out)
    assert "Resync requested. No process runs rs-managed now: the copy starts when one" in (
        out.getvalue()
    )
    progress = checkpoint_stores["default"].find("rs-managed").initial_sync
    assert progress["phase"] == "copying" and progress["reason"] == "on demand"


@pytest.mark.django_db(transaction=True)
def test_resync_command_restarts_the_running_stream_and_follows_the_copy(managed):
    manager, oplog, mirror = managed
    oplog.seed({"_id": i, "n": i} for i in range(1, 2001))
    manager.start("rs-managed")
    wait_until(lambda: manager.consumer("rs-managed").state.value == "running", "running")
    oplog.insert({"_id": 5000, "n": 5})
    wait_until(lambda: 5000 in mirror.docs, "the live insert")
    assert len(mirror.docs) == 1  # started at LATEST-of-now: the seeded orders are missing
    wait_until(
        lambda: StreamWorker.objects.filter(stream_name="rs-managed", state="running").exists(),
        "the process's status row",
    )

    out = io.StringIO()
    call_command("flowwarden_streams", "resync", "rs-managed", "--yes", stdout=out)
    text = out.getvalue()
    assert "waiting for the stream to restart" in text
    assert "rs-managed (on demand)" in text and "docs" in text  # tqdm's bar
    assert re.search(r"rs-managed: copied 2,00[12] documents \(on demand\) in \d+s", text)
    wait_until(lambda: mirror.docs.get(9000) is not None, "the insert made during the copy")
    assert mirror.docs == {d["_id"]: d for d in oplog.documents.values()}
    progress = checkpoint_stores["default"].find("rs-managed").initial_sync
    assert progress["reason"] == "on demand" and progress["requested_by"].endswith("(manage.py)")
