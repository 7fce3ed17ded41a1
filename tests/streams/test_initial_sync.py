"""Initial sync (``COPY_EXISTING`` / ``RESYNC``): copy the existing documents, then
stream from the position captured before the copy, with no gap.

Each scenario keeps a mirror (a dict, or ``Effect`` rows) and compares it with the
server's final documents: same ids, same field values. On the in-process fake source
and on the scripted replica set with the real driver.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from flowwarden_django.streams import metrics
from flowwarden_django.streams.backends.memory import InMemoryCheckpointStore
from flowwarden_django.streams.core.resume import (
    MAX_COPIES_PER_OPEN,
    HistoryLostError,
    OplogTooShortError,
)
from flowwarden_django.streams.initial_sync import InitialSyncConflictError, decode_id, encode_id
from flowwarden_django.streams.initial_sync.filter import CopyFilterError, copy_filter
from flowwarden_django.streams.runtime import StreamConsumer, StreamState
from flowwarden_django.streams.runtime.manager import pymongo_source
from flowwarden_django.streams.spec import (
    CheckpointSpec,
    DeadLetterQueueSpec,
    RestartPolicySpec,
    RetryPolicySpec,
    StreamSpec,
)
from flowwarden_django.streams.validation import validate_spec
from flowwarden_django.testkit.fake_source import FakeChangeSource
from tests.streams.managers import RUNNERS, consumer_class
from tests.support.lanes import on_lane

Consumer = StreamConsumer


@pytest.fixture(autouse=True, params=RUNNERS)
def runner(request, monkeypatch):
    """Every test runs on both runtimes: ``Consumer`` is the runner's consumer class."""
    monkeypatch.setitem(globals(), "Consumer", consumer_class(request.param))
    return request.param


FAST = RestartPolicySpec(max_attempts=5, initial_delay="1ms", max_delay="5ms")


class Mirror:
    """An idempotent copy of the collection: upserts, updates if present, deletes."""

    def __init__(self) -> None:
        self.docs: dict[Any, dict[str, Any]] = {}
        self.operations: list[str] = []

    def on_snapshot(self, doc: Any, ctx: Any) -> None:
        self.operations.append(ctx.operation_type)
        self.docs[doc["_id"]] = copy.deepcopy(dict(doc))

    def on_insert(self, doc: Any, ctx: Any) -> None:
        self.operations.append(ctx.operation_type)
        self.docs[doc["_id"]] = copy.deepcopy(dict(doc))

    def on_update(self, ctx: Any) -> None:
        self.operations.append("update")
        doc = self.docs.get(ctx.document_key["_id"])
        if doc is None:
            return
        description = ctx.update_description
        for path, value in description.updated_fields.items():
            doc[path] = copy.deepcopy(value)
        for path in description.removed_fields:
            doc.pop(path, None)

    def on_delete(self, ctx: Any) -> None:
        self.operations.append("delete")
        self.docs.pop(ctx.document_key["_id"], None)

    def handlers(self, *, snapshot: bool = True) -> dict[str, Any]:
        found = {
            "insert": self.on_insert,
            "update": self.on_update,
            "delete": self.on_delete,
        }
        if snapshot:
            found["snapshot"] = self.on_snapshot
        return found


def copy_spec(handlers: dict[str, Any], *, batch: int = 1000, **options: Any) -> StreamSpec:
    checkpoint = options.pop("checkpoint", None) or CheckpointSpec(
        start_position="COPY_EXISTING",
        copy_batch_size=batch,
        on_history_lost=options.pop("on_history_lost", "FAIL"),
    )
    return StreamSpec(
        name="orders",
        collection="orders",
        handlers=handlers,
        checkpoint=checkpoint,
        restart_policy=options.pop("restart_policy", FAST),
        **options,
    )


def run(spec: StreamSpec, store: Any, source: Any) -> StreamConsumer:
    consumer = Consumer(spec, store, lambda s: source)
    consumer.run(burst=True)
    return consumer


def seeded(n: int) -> FakeChangeSource:
    source = FakeChangeSource()
    source.oplog.seed({"_id": i, "n": i, "kind": "a" if i % 2 else "b"} for i in range(1, n + 1))
    return source


# -- the $match translation ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("stages", "expected"),
    [
        ([], {}),
        ([{"$match": {"fullDocument.status": "paid"}}], {"status": "paid"}),
        (
            [{"$match": {"fullDocument.n": {"$gt": 5}, "fullDocument.tag": {"$exists": True}}}],
            {"n": {"$gt": 5}, "tag": {"$exists": True}},
        ),
        (
            [{"$match": {"operationType": {"$in": ["insert", "update"]}}}],
            {},
        ),
        (
            [{"$match": {"operationType": "insert", "fullDocument.a.b": {"$in": [1, 2]}}}],
            {"a.b": {"$in": [1, 2]}},
        ),
        (
            [
                {
                    "$match": {
                        "$or": [
                            {"operationType": "delete"},
                            {"fullDocument.n": {"$lt": 3}},
                            {"fullDocument.kind": "x"},
                        ]
                    }
                }
            ],
            {"$or": [{"n": {"$lt": 3}}, {"kind": "x"}]},
        ),
        (
            [{"$match": {"$or": [{"operationType": "insert"}, {"fullDocument.n": 1}]}}],
            {},
        ),
        (
            [{"$match": {"$nor": [{"fullDocument.n": 1}, {"operationType": "delete"}]}}],
            {"$nor": [{"n": 1}]},
        ),
        (
            [
                {"$match": {"$and": [{"fullDocument.n": {"$gte": 1}}, {"fullDocument.n": 2}]}},
                {"$match": {"fullDocument.kind": "a"}},
            ],
            {"$and": [{"$and": [{"n": {"$gte": 1}}, {"n": 2}]}, {"kind": "a"}]},
        ),
        ([{"$match": {"operationType": {"$ne": "delete"}, "$comment": "x"}}], {}),
    ],
)
def test_match_translation(stages, expected):
    assert copy_filter(stages, "orders") == expected


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        (
            [{"$match": {"fullDocument.n": 1}}, {"$project": {"x": 1}}],
            "stream 'orders': COPY_EXISTING cannot apply pipeline stage 2 ($project) to the copy",
        ),
        ([{"$addFields": {"x": 1}}], "stage 1 ($addFields)"),
        (
            [{"$match": {"updateDescription.updatedFields.n": {"$exists": True}}}],
            "stage 1 ($match) to the copy: a condition on 'updateDescription.updatedFields.n'",
        ),
        ([{"$match": {"$or": [{"ns.coll": "x"}]}}], "stage 1 ($match)"),
        ([{"$match": {"$expr": {"$eq": ["$a", 1]}}}], "stage 1 ($match)"),
        ([{"$match": {"operationType": {"$regex": "^ins"}}}], "operationType with $regex"),
        ([{"$match": {"operationType": "delete"}}], "admits no insert"),
    ],
)
def test_untranslatable_pipelines(stages, message):
    with pytest.raises(CopyFilterError) as raised:
        copy_filter(stages, "orders")
    assert message in str(raised.value)


def test_last_id_round_trips_with_its_bson_type():
    from bson import ObjectId

    for value in (5, 2**40, "a", ObjectId(), 1.5, {"k": 1}):
        text = encode_id(value)
        assert isinstance(text, str)
        assert decode_id(text) == value and isinstance(decode_id(text), type(value))


# -- validation -------------------------------------------------------------------------------


def codes(spec: StreamSpec) -> dict[str, str]:
    return {p.code: p.text() for p in validate_spec(spec) if p.level == "error"}


def test_validation_needs_a_snapshot_capable_handler():
    update_only = {"update": lambda ctx: None}
    assert "E118" in codes(copy_spec(update_only))
    resync = copy_spec(
        update_only, checkpoint=CheckpointSpec(on_history_lost="RESYNC"), restart_policy=FAST
    )
    assert "E118" in codes(resync)
    for handlers, on_change in (
        ({"snapshot": lambda doc: None}, None),
        ({"insert": lambda doc: None}, None),
        ({}, lambda ctx: None),
    ):
        spec = copy_spec(handlers, on_change=on_change)
        assert "E118" not in codes(spec)
        assert spec.snapshot_handler() is not None


def test_validation_names_the_untranslatable_stage():
    spec = copy_spec(
        {"insert": lambda doc: None},
        pipeline=lambda: [{"$match": {"fullDocument.n": 1}}, {"$project": {"n": 1}}],
    )
    problems = codes(spec)
    assert "E119" in problems
    assert "cannot apply pipeline stage 2 ($project) to the copy" in problems["E119"]
    fine = copy_spec({"insert": lambda doc: None}, pipeline=lambda: [{"$match": {}}])
    assert "E119" not in codes(fine)
    # A stream that never copies may keep any pipeline.
    plain = StreamSpec(
        name="orders",
        collection="orders",
        handlers={"insert": lambda doc: None},
        pipeline=lambda: [{"$project": {"n": 1}}],
    )
    assert "E119" not in codes(plain)


@pytest.mark.parametrize("size", [0, -1, 1.5, True, "10"])
def test_validation_rejects_a_bad_copy_batch_size(size):
    spec = copy_spec({"insert": lambda doc: None}, batch=size)
    assert "checkpoint.copy_batch_size" in codes(spec).get("E108", "")


def test_decorators_declare_on_snapshot_and_copy_options():
    from flowwarden_django.streams.registry import (
        StreamRegistry,
        change_stream,
        checkpoint,
        register_stream,
        spec_from_class,
    )

    registry = StreamRegistry()

    @change_stream(collection="orders", registry=registry)
    @checkpoint(start_position="COPY_EXISTING", copy_batch_size=50, on_history_lost="RESYNC")
    class Orders:
        def on_snapshot(self, doc, ctx):
            pass

    spec = spec_from_class(Orders)
    assert set(spec.handlers) == {"snapshot"}
    assert spec.checkpoint.copy_batch_size == 50
    assert "E118" not in codes(spec)
    other = register_stream(
        "other",
        "orders",
        on_snapshot=lambda doc: None,
        checkpoint=CheckpointSpec(start_position="COPY_EXISTING"),
        registry=registry,
    )
    assert set(other.handlers) == {"snapshot"}


# -- the copy on the fake source ------------------------------------------------------------


def test_copy_10000_documents_with_changes_during_the_copy_then_stream():
    source = seeded(10_000)
    oplog = source.oplog
    mirror = Mirror()
    store = InMemoryCheckpointStore()
    copied = []

    def on_snapshot(doc, ctx):
        mirror.on_snapshot(doc, ctx)
        copied.append(doc["_id"])
        if len(copied) == 2000:  # after batch 2: change documents behind and ahead
            oplog.update(5, {"n": -5})  # already copied
            oplog.update(9_000, {"n": -9000, "extra": True})  # not yet copied
            oplog.delete(10)  # already copied
            oplog.delete(9_500)  # not yet copied
            oplog.insert({"_id": 20_000, "n": 1})  # ahead of the copy
            oplog.insert({"_id": 0, "n": 0})  # behind the copy
            oplog.update(0, {"n": 100})

    handlers = {**mirror.handlers(), "snapshot": on_snapshot}
    started, finished = [], []

    def on_started(sender, **kwargs):
        started.append(kwargs)

    def on_finished(sender, **kwargs):
        finished.append(kwargs)

    metrics.initial_sync_started.connect(on_started)
    metrics.initial_sync_finished.connect(on_finished)
    try:
        consumer = run(copy_spec(handlers), store, source)
    finally:
        metrics.initial_sync_started.disconnect(on_started)
        metrics.initial_sync_finished.disconnect(on_finished)
    assert consumer.state == StreamState.STOPPED
    assert mirror.docs == oplog.documents
    assert len(mirror.docs) == 10_000  # 10,000 - 2 + 2
    assert mirror.docs[9_000] == {"_id": 9_000, "n": -9000, "kind": "b", "extra": True}
    # Copied in _id order, each once; the insert ahead of the copy was copied too.
    assert copied == sorted(copied) and len(copied) == len(set(copied))
    assert 20_000 in copied and 0 not in copied and 9_500 not in copied
    saved = store.find("orders")
    progress = saved.initial_sync
    assert progress["phase"] == "done" and progress["reason"] == "first start"
    assert progress["copied"] == len(copied) and progress["estimated"] == 10_000
    assert progress["batch"] == 11  # start, 10 full batches (the 11th read is empty), done
    assert decode_id(progress["last_id"]) == 20_000
    assert progress["finished_at"] is not None
    assert saved.last_processed_token is not None  # the changes were streamed after it
    # The stream opened after the position captured before the first read.
    assert source.opens[0]["resume_after"] is not None
    assert started[0]["reason"] == "first start" and started[0]["estimated"] == 10_000
    assert finished[0]["copied"] == len(copied) and finished[0]["duration"] >= 0
    # Each batch asked for documents after the previous batch's last _id.
    afters = [q["after_id"] for q in source.copy_queries]
    assert afters[:3] == [None, 1000, 2000]
    # A restart after the copy resumes the stream; it does not copy again.
    oplog.update(1, {"n": 7})
    again = run(copy_spec(handlers), store, source)
    assert again.documents_copied == 0
    assert mirror.docs == oplog.documents


def test_the_copy_applies_the_pipeline_match_and_insert_handler_fallback():
    source = seeded(100)
    seen = []

    def on_insert(doc, ctx):
        seen.append((doc["_id"], ctx.operation_type, ctx.resume_token, ctx.document_key))

    spec = copy_spec(
        {"insert": on_insert},
        batch=7,
        pipeline=lambda: [
            {"$match": {"operationType": {"$in": ["insert", "replace"]}}},
            {"$match": {"fullDocument.kind": "a", "fullDocument.n": {"$lte": 20}}},
        ],
    )
    run(spec, InMemoryCheckpointStore(), source)
    assert [s[0] for s in seen] == list(range(1, 21, 2))
    assert {s[1] for s in seen} == {"snapshot"}
    assert all(s[2] is None and s[3] == {"_id": s[0]} for s in seen)
    assert source.copy_queries[0]["query"] == {"kind": "a", "n": {"$lte": 20}}


def test_on_change_receives_snapshots_when_nothing_else_does():
    source = seeded(3)
    operations = []
    spec = copy_spec({}, on_change=lambda ctx: operations.append(ctx.operation_type))
    run(spec, InMemoryCheckpointStore(), source)
    assert operations == ["snapshot"] * 3


def test_progress_signal_after_each_committed_batch():
    source = seeded(250)
    store = InMemoryCheckpointStore()
    progress: list[dict[str, Any]] = []
    processed: list[Any] = []

    def on_progress(sender, **kwargs):
        # Sent after the batch's progress write: the store already holds it.
        stored = store.find(sender).initial_sync
        progress.append({**kwargs, "stored": (stored["batch"], stored["copied"])})

    def on_processed(sender, success, **kwargs):
        processed.append(success)

    metrics.initial_sync_progress.connect(on_progress, sender="orders")
    metrics.event_processed.connect(on_processed, sender="orders")
    try:
        run(copy_spec({"snapshot": lambda doc: None}, batch=100), store, source)
    finally:
        metrics.initial_sync_progress.disconnect(on_progress, sender="orders")
        metrics.event_processed.disconnect(on_processed, sender="orders")
    assert [(p["documents"], p["copied"], p["batch"], p["estimated"]) for p in progress] == [
        (100, 100, 1, 250),
        (100, 200, 2, 250),
        (50, 250, 3, 250),
    ]
    assert [p["stored"] for p in progress] == [(1, 100), (2, 200), (3, 250)]
    assert processed == [True] * 250  # event_processed for each copied document


def test_the_copy_without_event_processed_receivers(monkeypatch):
    # Nobody observes event_processed (no Prometheus): the batch asks once, and its
    # documents are handled, counted and interruptible all the same.
    monkeypatch.setattr(metrics.event_processed, "has_listeners", lambda sender=None: False)
    source = seeded(35)
    store = InMemoryCheckpointStore()
    handled: list[int] = []
    holder: dict[str, StreamConsumer] = {}

    def on_snapshot(doc):
        handled.append(doc["_id"])
        if doc["_id"] == 15 and "stopped" not in holder:
            holder["stopped"] = True
            holder["consumer"].stop()
            raise RuntimeError("the stop cuts the retry backoff short")

    spec = copy_spec(
        {"snapshot": on_snapshot},
        batch=10,
        retry_policy=RetryPolicySpec(max_attempts=3, initial_delay=0.001, jitter=False),
    )
    holder["consumer"] = consumer = Consumer(spec, store, lambda s: source)
    consumer.run(burst=True)
    assert consumer.state == StreamState.STOPPED
    assert consumer.documents_copied == 14  # 11-14 settled, but batch 2 was not committed
    assert decode_id(store.find("orders").initial_sync["last_id"]) == 10
    again = run(spec, store, source)
    assert again.documents_copied == 25
    assert handled == [*range(1, 16), *range(11, 36)]
    assert store.find("orders").initial_sync["phase"] == "done"


def test_a_stop_mid_copy_resumes_after_the_last_committed_batch():
    source = seeded(1000)
    store = InMemoryCheckpointStore()
    handled: list[int] = []
    holder: dict[str, StreamConsumer] = {}

    def on_snapshot(doc, ctx):
        handled.append(doc["_id"])
        if len(handled) == 250:  # in batch 3 (batch size 100): it still commits
            holder["consumer"].stop()

    spec = copy_spec({"snapshot": on_snapshot}, batch=100)
    holder["consumer"] = consumer = Consumer(spec, store, lambda s: source)
    consumer.run(burst=True)
    assert consumer.state == StreamState.STOPPED
    progress = store.find("orders").initial_sync
    assert progress["phase"] == "copying" and decode_id(progress["last_id"]) == 300
    assert source.opens == []  # the change stream was never opened
    position = store.find("orders").last_seen_token
    handled.clear()
    run(copy_spec({"snapshot": lambda doc: handled.append(doc["_id"])}, batch=100), store, source)
    assert handled == list(range(301, 1001))  # nothing before the last batch again
    saved = store.find("orders")
    assert saved.initial_sync["phase"] == "done"
    assert source.opens[0]["resume_after"] == position  # the position captured first


def test_a_second_copier_is_fenced_by_the_batch_condition():
    source = seeded(50)
    store = InMemoryCheckpointStore()
    holder: dict[str, Any] = {}

    def on_snapshot(doc):
        if doc["_id"] == 15:  # another copier moves the progress meanwhile
            current = store.find("orders").initial_sync
            store.save_initial_sync(
                "orders",
                {**current, "batch": current["batch"] + 1},
                expected_batch=current["batch"],
            )
            holder["moved"] = True

    spec = copy_spec({"snapshot": on_snapshot}, batch=10)
    consumer = Consumer(spec, store, lambda s: source)
    with pytest.raises(InitialSyncConflictError, match="another process is copying"):
        consumer.run(burst=True)
    assert holder["moved"] and consumer.state == StreamState.CRASHED


def test_a_failed_copied_document_is_dead_lettered_as_a_snapshot():
    from flowwarden_django.streams.backends._memory_dlq import InMemoryDlqStore

    source = seeded(20)
    dlq = InMemoryDlqStore()
    mirror = Mirror()

    def on_snapshot(doc, ctx):
        if doc["_id"] == 7:
            raise RuntimeError("bad document")
        mirror.on_snapshot(doc, ctx)

    spec = copy_spec(
        {"snapshot": on_snapshot},
        batch=5,
        retry_policy=RetryPolicySpec(max_attempts=2, initial_delay=0.001, jitter=False),
        dead_letter_queue=DeadLetterQueueSpec(),
    )
    consumer = Consumer(spec, InMemoryCheckpointStore(), lambda s: source, dlq_store=dlq)
    consumer.run(burst=True)
    assert sorted(mirror.docs) == [i for i in range(1, 21) if i != 7]
    entries = dlq.find_by_stream("orders")
    entries = list(getattr(entries, "entries", entries))
    assert len(entries) == 1
    entry = entries[0]
    assert entry.operation_type == "snapshot" and entry.attempts == 2
    assert entry.document_key == {"_id": 7} and entry.resume_token is None
    assert entry.full_document["_id"] == 7


def test_history_lost_after_the_copy_resyncs_under_resync():
    source = seeded(300)
    oplog = source.oplog
    mirror = Mirror()
    store = InMemoryCheckpointStore()
    spec = copy_spec(mirror.handlers(), batch=64, on_history_lost="RESYNC")
    run(spec, store, source)
    assert mirror.docs == oplog.documents
    first = store.find("orders").initial_sync
    # Down while changes happen, then the history goes; the mirror misses them.
    oplog.update(3, {"n": 33})
    oplog.delete(4)
    oplog.insert({"_id": 1000, "n": 1})
    oplog.seed([{"_id": 2000, "n": 2}])  # no event at all: only a copy can see it
    oplog.lose_history()
    before = len(mirror.operations)
    run(spec, store, source)
    # The stale 4 remains in the mirror (an idempotent copy only upserts): RESYNC
    # delivers every current document; removing vanished ones is the handler's job.
    mirror.docs.pop(4, None)
    assert mirror.docs == oplog.documents
    progress = store.find("orders").initial_sync
    assert progress["reason"] == "history lost" and progress["phase"] == "done"
    assert progress["batch"] > first["batch"]  # numbering continues
    assert mirror.operations[before:].count("snapshot") == len(oplog.documents)


def test_history_lost_after_the_copy_fails_under_fail():
    source = seeded(30)
    store = InMemoryCheckpointStore()
    spec = copy_spec(Mirror().handlers(), batch=8)
    run(spec, store, source)
    source.oplog.insert({"_id": 99, "n": 1})
    source.oplog.lose_history()
    with pytest.raises(HistoryLostError):
        run(spec, store, source)


def test_the_captured_position_lost_during_the_copy_applies_the_strategy():
    source = seeded(40)
    oplog = source.oplog

    def on_snapshot(doc):
        if doc["_id"] == 40:
            oplog.insert({"_id": 41, "n": 41})
            oplog.lose_history()

    spec = copy_spec({"snapshot": on_snapshot}, batch=10)
    with pytest.raises(HistoryLostError):
        run(spec, InMemoryCheckpointStore(), source)


def test_resync_gives_up_when_every_copy_outlasts_the_oplog():
    source = seeded(30)
    oplog = source.oplog
    copies = []

    def on_snapshot(doc):
        if doc["_id"] == 30:  # the last document of every copy: the position is gone
            copies.append(1)
            oplog.insert({"_id": 100 + len(copies), "n": 0})
            oplog.lose_history()

    spec = copy_spec({"snapshot": on_snapshot}, batch=10, on_history_lost="RESYNC")
    with pytest.raises(OplogTooShortError, match="3 copies in a row outlasted the oplog"):
        run(spec, InMemoryCheckpointStore(), source)
    assert len(copies) == MAX_COPIES_PER_OPEN == 3


# -- transactional: each batch and its progress in one transaction ---------------------------


def _transactional_crash_and_resume(using: str) -> None:
    from flowwarden_django.streams.backends.orm import OrmCheckpointStore
    from tests.testapp.models import Effect

    source = seeded(200)
    store = OrmCheckpointStore(using=using)
    effects = Effect.objects.using(using)
    failed: set[int] = set()
    holder: dict[str, StreamConsumer] = {}

    def on_snapshot(doc, ctx):
        effects.create(order_id=doc["_id"], stream="orders")
        if doc["_id"] == 130 and not failed:  # mid-batch 3 (batch size 50)
            failed.add(130)
            raise RuntimeError("after the write")
        if doc["_id"] == 170:
            holder["consumer"].stop()

    def on_insert(doc, ctx):
        effects.create(order_id=doc["_id"], stream="orders")

    spec = copy_spec(
        {"snapshot": on_snapshot, "insert": on_insert},
        batch=50,
        transactional=True,
        transaction_using=using,
        restart_policy=RestartPolicySpec(max_attempts=0, initial_delay="1ms", max_delay="1ms"),
    )
    holder["consumer"] = consumer = Consumer(spec, store, lambda s: source)
    consumer.run(burst=True)  # fails in batch 3 (rolled back), restarts, stops after batch 4
    assert consumer.state == StreamState.STOPPED
    progress = store.find("orders").initial_sync
    assert progress["phase"] == "copying" and decode_id(progress["last_id"]) == 200
    counts = list(effects.order_by("order_id").values_list("order_id", flat=True))
    assert counts == list(range(1, 201))  # no duplicate effect: batch 3 rolled back
    # Inserted while the copy is paused, ahead of it: copied, then also delivered by
    # the change stream (at least once: handlers must be idempotent).
    source.oplog.insert({"_id": 500, "n": 5})
    run(spec, store, source)
    ids = list(effects.order_by("order_id").values_list("order_id", flat=True))
    assert ids == [*range(1, 201), 500, 500]
    assert store.find("orders").initial_sync["phase"] == "done"


@pytest.mark.django_db(transaction=True)
def test_transactional_copy_on_sqlite_rolls_back_a_failed_batch():
    _transactional_crash_and_resume("default")


@on_lane("postgres", databases=["postgres"])
def test_transactional_copy_on_postgres_rolls_back_a_failed_batch():
    _transactional_crash_and_resume("postgres")


@pytest.mark.django_db(transaction=True)
def test_transactional_progress_signal_only_after_each_commit():
    from django.db import connection

    from flowwarden_django.streams.backends.orm import OrmCheckpointStore

    source = seeded(60)
    failed: set[int] = set()
    sent: list[tuple[int, int, int, bool]] = []

    def on_snapshot(doc):
        if doc["_id"] == 25 and not failed:  # batch 2 rolls back once
            failed.add(25)
            raise RuntimeError("once")

    def on_progress(sender, **kwargs):
        sent.append(
            (kwargs["documents"], kwargs["copied"], kwargs["batch"], connection.in_atomic_block)
        )

    spec = copy_spec({"snapshot": on_snapshot}, batch=20, transactional=True)
    metrics.initial_sync_progress.connect(on_progress, sender="orders")
    try:
        consumer = run(spec, OrmCheckpointStore(), source)
    finally:
        metrics.initial_sync_progress.disconnect(on_progress, sender="orders")
    assert consumer.restarts == 1
    # Nothing for the rolled-back batch; each signal outside the batch's transaction.
    assert sent == [(20, 20, 1, False), (20, 40, 2, False), (20, 60, 3, False)]


@pytest.mark.django_db(transaction=True)
def test_transactional_stop_in_a_batch_commits_nothing_of_it():
    from flowwarden_django.streams.backends.orm import OrmCheckpointStore
    from tests.testapp.models import Effect

    source = seeded(100)
    store = OrmCheckpointStore()
    holder: dict[str, StreamConsumer] = {}

    def on_snapshot(doc, ctx):
        Effect.objects.create(order_id=doc["_id"], stream="orders")
        if doc["_id"] == 45:
            holder["consumer"].stop()

    spec = copy_spec({"snapshot": on_snapshot}, batch=20, transactional=True)
    holder["consumer"] = consumer = Consumer(spec, store, lambda s: source)
    consumer.run(burst=True)
    assert decode_id(store.find("orders").initial_sync["last_id"]) == 60
    run(
        copy_spec(
            {"snapshot": lambda doc: Effect.objects.create(order_id=doc["_id"])},
            batch=20,
            transactional=True,
        ),
        store,
        source,
    )
    ids = list(Effect.objects.order_by("order_id").values_list("order_id", flat=True))
    assert ids == list(range(1, 101))


# -- on the scripted replica set, with the real driver ---------------------------------------


@pytest.fixture(scope="module")
def _scripted_rs() -> Iterator[Any]:
    pytest.importorskip("mockupdb", reason="the scripted MongoDB fake needs mockupdb==1.8.1")
    from flowwarden_django.testkit.scripted_mongo import ScriptedReplicaSet

    with ScriptedReplicaSet() as srv:
        yield srv


@pytest.fixture
def scripted(_scripted_rs: Any) -> Iterator[Any]:
    _scripted_rs.reset()
    fw = {
        **settings.FLOWWARDEN,
        "MONGO_CLIENTS": {
            "default": {"URL": _scripted_rs.uri, "OPTIONS": {"serverSelectionTimeoutMS": 5000}}
        },
        "STREAM_MAX_AWAIT_MS": 50,
    }
    with override_settings(FLOWWARDEN=fw):
        yield _scripted_rs
    assert not _scripted_rs.internal_errors, _scripted_rs.internal_errors[0]


def wire_spec(handlers: dict[str, Any], **options: Any) -> StreamSpec:
    return copy_spec(handlers, database="app", **options)


def _state(srv: Any) -> dict[Any, dict[str, Any]]:
    return {doc["_id"]: doc for doc in srv.documents("app", "orders")}


def test_wire_copy_10000_with_changes_during_the_copy(scripted):
    scripted.seed("app", "orders", [{"_id": i, "n": i} for i in range(1, 10_001)])
    mirror = Mirror()
    copied = []

    def on_snapshot(doc, ctx):
        mirror.on_snapshot(doc, ctx)
        copied.append(doc["_id"])
        if len(copied) == 3000:
            scripted.update("app", "orders", 2, {"n": -2})
            scripted.update("app", "orders", 8000, {"n": -8000, "x": "y"})
            scripted.delete("app", "orders", 3)
            scripted.delete("app", "orders", 9999)
            scripted.insert("app", "orders", {"_id": 0, "n": 0})
            scripted.insert("app", "orders", {"_id": 50_000, "n": 5})

    store = InMemoryCheckpointStore()
    spec = wire_spec({**mirror.handlers(), "snapshot": on_snapshot})
    consumer = Consumer(spec, store, pymongo_source)
    consumer.run(burst=True)
    assert consumer.state == StreamState.STOPPED
    assert mirror.docs == _state(scripted)
    assert len(mirror.docs) == 10_000
    finds = scripted.commands("find")
    assert finds and all(f["sort"] == {"_id": 1} and f["limit"] == 1000 for f in finds)
    progress = store.find("orders").initial_sync
    assert progress["phase"] == "done" and progress["copied"] == len(copied)


def test_wire_stop_mid_copy_and_resume_with_a_pipeline(scripted):
    scripted.seed("app", "orders", [{"_id": i, "n": i % 3} for i in range(1, 601)])
    store = InMemoryCheckpointStore()
    handled: list[int] = []
    holder: dict[str, StreamConsumer] = {}

    def on_snapshot(doc):
        handled.append(doc["_id"])
        if len(handled) == 120:
            holder["consumer"].stop()

    pipeline = [{"$match": {"fullDocument.n": {"$in": [1, 2]}}}]
    spec = wire_spec({"snapshot": on_snapshot}, batch=50, pipeline=lambda: pipeline)
    holder["consumer"] = consumer = Consumer(spec, store, pymongo_source)
    consumer.run(burst=True)
    last = decode_id(store.find("orders").initial_sync["last_id"])
    assert last == handled[-1] and len(handled) == 150
    scripted.update("app", "orders", 1, {"n": 7})  # during the (paused) copy
    rest: list[Any] = []
    spec = wire_spec({"snapshot": rest.append, "update": rest.append}, batch=50)
    spec.pipeline = lambda: pipeline
    consumer = Consumer(spec, store, pymongo_source)
    consumer.run(burst=True)
    assert [d["_id"] for d in rest if d] == [i for i in range(last + 1, 601) if i % 3]
    assert store.find("orders").initial_sync["phase"] == "done"


def test_wire_history_lost_resync_and_fail(scripted):
    scripted.seed("app", "orders", [{"_id": i, "n": i} for i in range(1, 201)])
    mirror = Mirror()
    store = InMemoryCheckpointStore()
    resync = wire_spec(mirror.handlers(), batch=64, on_history_lost="RESYNC")
    Consumer(resync, store, pymongo_source).run(burst=True)
    assert mirror.docs == _state(scripted)
    scripted.update("app", "orders", 5, {"n": 55})
    scripted.insert("app", "orders", {"_id": 500, "n": 1})
    scripted.lose_history()
    fail = wire_spec(mirror.handlers(), batch=64)
    with pytest.raises(HistoryLostError):
        Consumer(fail, store, pymongo_source).run(burst=True)
    Consumer(resync, store, pymongo_source).run(burst=True)
    assert mirror.docs == _state(scripted)
    assert store.find("orders").initial_sync["reason"] == "history lost"
