"""Lane (a): the runtime's logic against the in-process fake change source.

Cascade levels, the processed-anchor policy, the idle heartbeat, history-lost
strategies, invalidation, the managed restart and transactional handlers.
"""

import pytest
from pymongo.errors import AutoReconnect

from flowwarden_django.streams import Checkpoint
from flowwarden_django.streams.backends.memory import InMemoryCheckpointStore
from flowwarden_django.streams.runtime import (
    HistoryLostError,
    StreamConsumer,
    StreamInvalidatedError,
    StreamState,
)
from flowwarden_django.streams.spec import CheckpointSpec, RestartPolicySpec, StreamSpec
from flowwarden_django.testkit.checkpoint_store import now_ms
from flowwarden_django.testkit.fake_source import FakeChangeSource, fake_token
from tests.streams.managers import RUNNERS, consumer_class
from tests.support.polling import poll


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Recorder:
    def __init__(self, fail_on=()):
        self.seen = []
        self.fail_on = set(fail_on)

    def __call__(self, doc, ctx):
        if doc["_id"] in self.fail_on:
            self.fail_on.discard(doc["_id"])
            raise RuntimeError(f"handler failed on {doc['_id']}")
        self.seen.append(doc["_id"])


def spec(handler=None, *, checkpoint=None, restart=None, **options):
    handlers = {"insert": handler} if handler is not None else {}
    return StreamSpec(
        name="orders",
        collection="orders",
        handlers=options.pop("handlers", handlers),
        checkpoint=checkpoint or CheckpointSpec(),
        restart_policy=restart or RestartPolicySpec(initial_delay="1ms", max_delay="5ms"),
        **options,
    )


Consumer = StreamConsumer


@pytest.fixture(autouse=True, params=RUNNERS)
def runner(request, monkeypatch):
    """Every test runs on both runtimes: ``Consumer`` is the runner's consumer class."""
    monkeypatch.setitem(globals(), "Consumer", consumer_class(request.param))
    return request.param


def run(stream_spec, store, source, *, clock=None, burst=True):
    consumer = Consumer(stream_spec, store, lambda s: source, monotonic=clock or Clock())
    consumer.run(burst=burst)
    return consumer


def insert(oplog, *ids):
    return [oplog.insert({"_id": i, "n": i}) for i in ids]


# -- the resume cascade ---------------------------------------------------------------


def test_bootstrap_persists_the_position_before_the_first_event():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    run(spec(Recorder()), store, source)
    bootstrap = store.find("orders")
    assert bootstrap.last_seen_token is not None
    assert bootstrap.last_heartbeat_at is not None
    assert bootstrap.last_processed_token is None
    assert source.opens == [
        {
            "resume_after": bootstrap.last_seen_token,
            "start_after": None,
            "start_at_operation_time": None,
        }
    ]
    insert(source.oplog, 1, 2)
    handler = Recorder()
    run(spec(handler), store, source)
    assert handler.seen == [1, 2], "events after the bootstrap position are not lost"


def test_level1_resumes_after_the_processed_anchor():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    events = insert(source.oplog, 1, 2, 3, 4)
    store.save(
        Checkpoint("orders", last_processed_token=events[1]["_id"], last_processed_at=now_ms())
    )
    handler = Recorder()
    run(spec(handler), store, source)
    assert handler.seen == [3, 4]
    assert store.find("orders").last_processed_token == events[3]["_id"]


def test_level2_uses_the_seen_anchor_when_processed_aged_out():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    events = insert(source.oplog, 1, 2, 3, 4, 5)
    source.oplog.lose_history(keep_last=3)  # events 3, 4, 5 remain
    store.save(
        Checkpoint(
            "orders",
            last_seen_token=events[3]["_id"],
            last_seen_at=now_ms(),
            last_processed_token=events[0]["_id"],
            last_processed_at=now_ms(),
        )
    )
    handler = Recorder()
    run(spec(handler), store, source)
    assert handler.seen == [5]
    assert [o["resume_after"] for o in source.opens] == [events[0]["_id"], events[3]["_id"]]


def test_level3_fail_is_terminal_with_operator_guidance():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    events = insert(source.oplog, 1, 2, 3)
    source.oplog.lose_history(keep_last=1)
    store.save(
        Checkpoint("orders", last_processed_token=events[0]["_id"], last_processed_at=now_ms())
    )
    consumer = Consumer(spec(Recorder()), store, lambda s: source, monotonic=Clock())
    with pytest.raises(HistoryLostError, match="flowwarden_checkpoints reset orders"):
        consumer.run(burst=True)
    assert consumer.state == StreamState.CRASHED
    assert store.find("orders").last_processed_token == events[0]["_id"], "nothing was reset"


def test_level3_resume_from_now_resets_with_the_guard():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    events = insert(source.oplog, 1, 2, 3)
    source.oplog.lose_history()
    store.save(
        Checkpoint(
            "orders",
            "pod",
            last_processed_token=events[0]["_id"],
            last_processed_at=now_ms(),
            metadata={"k": 1},
        )
    )
    handler = Recorder()
    run(spec(handler, checkpoint=CheckpointSpec(on_history_lost="RESUME_FROM_NOW")), store, source)
    after = store.find("orders")
    assert after.last_processed_token is None
    assert after.last_seen_token is not None and after.metadata == {"k": 1}
    insert(source.oplog, 4)
    run(spec(handler, checkpoint=CheckpointSpec(on_history_lost="RESUME_FROM_NOW")), store, source)
    assert handler.seen == [4]


def test_level3_resume_from_oplog_start_replays_what_is_left():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    events = insert(source.oplog, 1, 2, 3, 4)
    source.oplog.lose_history(keep_last=2)
    store.save(
        Checkpoint("orders", last_processed_token=events[0]["_id"], last_processed_at=now_ms())
    )
    handler = Recorder()
    policy = CheckpointSpec(on_history_lost="RESUME_FROM_OPLOG_START")
    run(spec(handler, checkpoint=policy), store, source)
    assert handler.seen == [3, 4]
    assert source.opens[-1]["start_at_operation_time"] == source.oplog.oldest_time()
    after = store.find("orders")
    assert after.last_processed_token == events[3]["_id"], "the fresh anchor survived the reset"
    assert after.last_seen_token is not None, "the first certified position was installed"


def test_latest_ignores_saved_anchors():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    events = insert(source.oplog, 1, 2)
    store.save(
        Checkpoint("orders", last_processed_token=events[0]["_id"], last_processed_at=now_ms())
    )
    handler = Recorder()
    run(spec(handler, checkpoint=CheckpointSpec(start_position="LATEST")), store, source)
    assert handler.seen == []
    assert source.opens[0]["resume_after"] is None


# -- the processed-anchor policy -------------------------------------------------------


def test_save_every_n_and_the_graceful_flush():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    run(spec(Recorder()), store, source)
    events = insert(source.oplog, *range(1, 8))
    writes = []
    original = store.save_processed

    def counting(*args, **kwargs):
        writes.append(args[1])
        return original(*args, **kwargs)

    store.save_processed = counting
    run(spec(Recorder(), checkpoint=CheckpointSpec(save_every_n=3)), store, source)
    # Written at events 3 and 6 by count, then event 7 by the flush on stop.
    assert writes == [events[2]["_id"], events[5]["_id"], events[6]["_id"]]


def test_without_a_graceful_stop_at_most_n_minus_1_are_unsaved():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    run(spec(Recorder()), store, source)
    events = insert(source.oplog, *range(1, 8))

    def handler(doc, ctx):
        if doc["_id"] == 7:
            raise RuntimeError("poison")

    restart = RestartPolicySpec(max_attempts=1, initial_delay="1ms")
    consumer = Consumer(
        spec(
            handler,
            checkpoint=CheckpointSpec(save_every_n=3, save_interval_seconds=0),
            restart=restart,
        ),
        store,
        lambda s: source,
        monotonic=Clock(),
    )
    consumer.policy = None
    consumer._close = lambda cursor: cursor.close()  # die without flushing, like a kill
    with pytest.raises(RuntimeError):
        consumer.run(burst=True)
    assert store.find("orders").last_processed_token == events[5]["_id"]


def test_save_interval_flushes_a_dirty_anchor():
    clock = Clock()
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    run(spec(Recorder()), store, source)
    events = insert(source.oplog, 1)
    seen_during = []

    def handler(doc, ctx):
        clock.now += 10  # the handler takes 10 s: the anchor of the previous event ages
        anchored = store.find("orders").last_processed_token
        if doc["_id"] == 2:  # event 1's anchor is dirty and aged: the flusher writes it
            anchored = poll(lambda: store.find("orders").last_processed_token, bool)
        seen_during.append(anchored)

    insert(source.oplog, 2)
    policy = CheckpointSpec(save_every_n=100, save_interval_seconds=5)
    consumer = Consumer(spec(handler, checkpoint=policy), store, lambda s: source, monotonic=clock)
    consumer.flush_tick_seconds = 0.01
    consumer.run(burst=True)
    assert seen_during == [None, events[0]["_id"]]


def test_the_event_after_an_anchor_aged_writes_it_without_the_flusher():
    # The flusher never ticks here: the age write is the event path's own, after each
    # event (its check needs no lock while the anchor is younger than the threshold).
    clock = Clock()
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    run(spec(Recorder()), store, source)
    events = insert(source.oplog, 1, 2, 3, 4)
    anchored = []

    def handler(doc):
        anchored.append(store.find("orders").last_processed_token)
        if doc["_id"] == 2:
            clock.now += 10  # event 2 takes 10 s: once settled, its anchor is aged

    policy = CheckpointSpec(save_every_n=100, save_interval_seconds=5)
    consumer = Consumer(spec(handler, checkpoint=policy), store, lambda s: source, monotonic=clock)
    consumer.flush_tick_seconds = 3600
    consumer.run(burst=True)
    # Event 1 settled at t=1000 and event 2 at t=1010: the check after event 2 writes
    # event 2's anchor; event 3's is younger than 5 s, so event 4 still sees event 2's.
    assert anchored == [None, None, events[1]["_id"], events[1]["_id"]]
    assert store.find("orders").last_processed_token == events[3]["_id"]  # the stop's flush


def test_filter_rejects_and_missing_handlers_settle():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    run(spec(Recorder()), store, source)
    insert(source.oplog, 1, 2)
    last = source.oplog.delete(2)  # no on_delete handler: settled
    handler = Recorder()
    stream = spec(handler, filter=lambda ctx: ctx.full_document["_id"] != 1)
    run(stream, store, source)
    assert handler.seen == [2]
    assert store.find("orders").last_processed_token == last["_id"]


def test_handler_shapes_and_async_handlers():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    run(spec(Recorder()), store, source)
    insert(source.oplog, 1)
    source.oplog.update(1, {"n": 2})
    source.oplog.delete(1)
    calls = []

    async def on_insert(doc):
        calls.append(("insert", doc["_id"]))

    def on_update(ctx):
        calls.append(("update", ctx.update_description.has_field_changed("n")))

    def on_delete(doc, ctx):
        calls.append(("delete", doc, ctx.document_key["_id"]))

    handlers = {"insert": on_insert, "update": on_update, "delete": on_delete}
    run(spec(handlers=handlers), store, source)
    assert calls == [("insert", 1), ("update", True), ("delete", None, 1)]


def test_save_checkpoint_now_is_an_early_acknowledgement():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    run(spec(Recorder()), store, source)
    events = insert(source.oplog, 1, 2)
    observed = []

    def handler(doc, ctx):
        assert ctx.save_checkpoint_now() is True
        observed.append(store.find("orders").last_processed_token)

    run(spec(handler, checkpoint=CheckpointSpec(save_every_n=100)), store, source)
    assert observed == [events[0]["_id"], events[1]["_id"]]


def test_an_async_handler_saves_with_asave_checkpoint_now():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    run(spec(Recorder()), store, source)
    events = insert(source.oplog, 1, 2)
    observed = []

    async def handler(doc, ctx):
        assert await ctx.asave_checkpoint_now() is True
        observed.append(store.find("orders").last_processed_token)

    run(spec(handler, checkpoint=CheckpointSpec(save_every_n=100)), store, source)
    assert observed == [events[0]["_id"], events[1]["_id"]]


def test_the_blocking_save_from_an_async_handler_says_what_to_await(runner):
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    run(spec(Recorder()), store, source)
    insert(source.oplog, 1)
    errors = []

    async def handler(doc, ctx):
        try:
            ctx.save_checkpoint_now()
        except RuntimeError as exc:
            errors.append(str(exc))

    run(spec(handler), store, source)
    if runner == "asyncio":  # it would block the loop: refused, with the fix
        assert len(errors) == 1 and "await ctx.asave_checkpoint_now()" in errors[0]
    else:  # the threaded runtime's handler thread may block
        assert errors == []


# -- the idle heartbeat ------------------------------------------------------------------


def test_idle_heartbeat_certifies_the_position_and_rewrites_only_the_heartbeat():
    clock = Clock()
    store = InMemoryCheckpointStore()
    source = FakeChangeSource(idle_advances=False)
    run(spec(Recorder()), store, source)
    insert(source.oplog, 1)
    bootstrap = store.find("orders")
    policy = CheckpointSpec(idle_heartbeat_interval_seconds=60)
    consumer = Consumer(
        spec(Recorder(), checkpoint=policy), store, lambda s: source, monotonic=clock
    )
    polls = iter(range(100))

    original_try_next = None

    def open_and_count(**kwargs):
        cursor = FakeChangeSource.open(source, **kwargs)
        nonlocal original_try_next
        original_try_next = cursor.try_next

        def try_next():
            if next(polls) >= 6:
                consumer.stop()
            clock.now += 25
            return original_try_next()

        cursor.try_next = try_next
        return cursor

    source.open = open_and_count
    writes = []
    for method in ("save_seen", "save_heartbeat"):
        original = getattr(store, method)
        setattr(
            store, method, lambda *a, _m=method, _o=original, **k: (writes.append(_m), _o(*a, **k))
        )
    consumer.run()
    after = store.find("orders")
    assert after.last_seen_token == fake_token(source.oplog.last_position)
    assert after.last_seen_token != bootstrap.last_seen_token
    assert writes[0] == "save_seen" and set(writes[1:]) == {"save_heartbeat"}
    assert len(writes) >= 2


def test_no_heartbeat_when_the_interval_is_zero():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    run(spec(Recorder()), store, source)
    seen = store.find("orders").last_seen_token
    clock = Clock()
    clock.now += 10_000
    run(
        spec(Recorder(), checkpoint=CheckpointSpec(idle_heartbeat_interval_seconds=0)),
        store,
        source,
        clock=clock,
    )
    assert store.find("orders").last_seen_token == seen


# -- invalidation and restarts ---------------------------------------------------------


def test_drop_is_dispatched_then_invalidate_under_fail_is_terminal():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    run(spec(Recorder()), store, source)
    insert(source.oplog, 1)
    source.oplog.drop()
    changes = []
    stream = spec(Recorder(), on_change=lambda ctx: changes.append(ctx.operation_type))
    consumer = Consumer(stream, store, lambda s: source, monotonic=Clock())
    with pytest.raises(StreamInvalidatedError, match="dropped"):
        consumer.run(burst=True)
    assert changes == ["drop"], "invalidate itself is never dispatched"
    marker = store.find("orders")
    assert marker.last_processed_token is None
    assert marker.last_seen_token == fake_token(source.oplog.last_position)
    with pytest.raises(HistoryLostError):  # every later start fails loudly
        Consumer(stream, store, lambda s: source, monotonic=Clock()).run(burst=True)


def test_drop_under_resume_from_now_heals_and_continues():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    policy = CheckpointSpec(on_history_lost="RESUME_FROM_NOW")
    run(spec(Recorder(), checkpoint=policy), store, source)
    insert(source.oplog, 1)
    source.oplog.drop()
    handler = Recorder()
    consumer = run(spec(handler, checkpoint=policy), store, source)
    assert handler.seen == [1]
    assert consumer.restarts == 1 and consumer.state == StreamState.STOPPED
    insert(source.oplog, 2)
    run(spec(handler, checkpoint=policy), store, source)
    assert handler.seen == [1, 2]


def test_rename_is_terminal_even_under_a_healing_strategy():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    policy = CheckpointSpec(on_history_lost="RESUME_FROM_NOW")
    run(spec(Recorder(), checkpoint=policy), store, source)
    source.oplog.rename("orders_old")
    with pytest.raises(StreamInvalidatedError, match="renamed"):
        run(spec(Recorder(), checkpoint=policy), store, source)


def test_a_dying_cursor_is_reopened_through_the_cascade_without_loss():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    run(spec(Recorder()), store, source)
    insert(source.oplog, 1, 2, 3)
    source.errors.extend([AutoReconnect("connection reset"), AutoReconnect("again")])
    handler = Recorder()
    consumer = run(spec(handler), store, source)
    assert handler.seen == [1, 2, 3]
    assert consumer.restarts == 2


def test_a_failing_handler_is_redelivered_after_the_restart():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    run(spec(Recorder()), store, source)
    insert(source.oplog, 1, 2, 3)
    handler = Recorder(fail_on={2})
    run(spec(handler), store, source)
    assert handler.seen == [1, 2, 3]


def test_restart_attempts_exhausted_is_terminal():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    run(spec(Recorder()), store, source)
    source.errors.extend(AutoReconnect("down") for _ in range(5))
    restart = RestartPolicySpec(max_attempts=2, initial_delay="1ms")
    consumer = Consumer(
        spec(Recorder(), restart=restart), store, lambda s: source, monotonic=Clock()
    )
    with pytest.raises(AutoReconnect):
        consumer.run(burst=True)
    assert consumer.state == StreamState.CRASHED


# -- transactional handlers ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_transactional_handler_and_anchor_commit_together():
    from flowwarden_django.streams.backends.orm import OrmCheckpointStore
    from tests.testapp.models import Effect

    store, source = OrmCheckpointStore(), FakeChangeSource()
    run(spec(Recorder(), transactional=True), store, source)
    events = insert(source.oplog, 1, 2, 3)
    failed = set()

    def handler(doc, ctx):
        Effect.objects.create(order_id=doc["_id"], stream="orders")
        if doc["_id"] == 2 and 2 not in failed:
            failed.add(2)
            raise RuntimeError("after the write")

    run(spec(handler, transactional=True), store, source)
    assert sorted(Effect.objects.values_list("order_id", flat=True)) == [1, 2, 3]
    assert store.find("orders").last_processed_token == events[2]["_id"]


def test_a_stop_before_the_thread_runs_holds():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    consumer = Consumer(spec(Recorder()), store, lambda s: source, monotonic=Clock())
    consumer.stop()
    consumer.run()  # returns at once instead of consuming forever
    assert consumer.state == StreamState.STOPPED


def test_filter_can_take_the_document():
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    run(spec(Recorder()), store, source)
    insert(source.oplog, 1, 2)
    handler = Recorder()
    run(spec(handler, filter=lambda doc: doc["_id"] == 2), store, source)
    assert handler.seen == [2]


@pytest.mark.django_db(transaction=True)
def test_async_transactional_handler_writes_inside_the_transaction():
    from asgiref.sync import sync_to_async

    from flowwarden_django.streams.backends.orm import OrmCheckpointStore
    from tests.testapp.models import Effect

    store, source = OrmCheckpointStore(), FakeChangeSource()
    run(spec(Recorder(), transactional=True), store, source)
    insert(source.oplog, 1, 2)
    failed = set()

    async def handler(doc, ctx):
        await sync_to_async(Effect.objects.create)(order_id=doc["_id"], stream="orders")
        if doc["_id"] == 1 and not failed:
            failed.add(1)
            raise RuntimeError("after the write")

    run(spec(handler, transactional=True), store, source)
    assert sorted(Effect.objects.values_list("order_id", flat=True)) == [1, 2]
