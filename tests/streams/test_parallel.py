"""Lane (a): streams handled in parallel (``parallelism`` > 1) against the fake source.

Per-key order, concurrency across keys, the low-watermark anchor, a poison event that
parks its key and not the stream, backpressure, a graceful stop, the lifecycle
barrier, and the system checks of the options. The window's own decisions are
tested without threads first.
"""

import random
import threading
import time
from collections import Counter

import pytest

from flowwarden_django.streams.backends.memory import InMemoryCheckpointStore, InMemoryDlqStore
from flowwarden_django.streams.core.window import KeyedWindow, WindowEntry, event_key
from flowwarden_django.streams.runtime.manager import window_report
from flowwarden_django.streams.spec import (
    CheckpointSpec,
    DeadLetterQueueSpec,
    RestartPolicySpec,
    RetryPolicySpec,
    StreamSpec,
)
from flowwarden_django.streams.validation import validate_spec
from flowwarden_django.testkit.fake_source import FakeChangeSource, fake_token
from tests.streams.managers import consumer_class
from tests.support import polling
from tests.support.lanes import on_lane

WAIT = polling.DEADLINE_SECONDS

RUNNERS = ("threads", "asyncio")


def spec(handler, *, parallelism=4, checkpoint=None, **options):
    return StreamSpec(
        name="orders",
        collection="orders",
        handlers={"insert": handler},
        checkpoint=checkpoint or CheckpointSpec(save_interval_seconds=0),
        restart_policy=RestartPolicySpec(max_attempts=1, initial_delay="1ms", max_delay="5ms"),
        parallelism=parallelism,
        **options,
    )


def by_customer(event):
    return event["fullDocument"]["customer"]


def bootstrapped(runner):
    """A store and a source whose stream has bootstrapped (its anchor is at the start)."""
    store, source = InMemoryCheckpointStore(), FakeChangeSource()
    consumer_class(runner)(spec(lambda doc: None), store, lambda s: source).run(burst=True)
    return store, source


def processed_position(store):
    """The log position of the processed anchor (of the bootstrap's seen anchor
    before any event was processed)."""
    checkpoint = store.find("orders")
    token = checkpoint.last_processed_token or checkpoint.last_seen_token
    return int(token["_data"][2:], 16)


# -- the window's decisions, without threads ------------------------------------------


def entry_of(window, key, n):
    return window.admit(key, {"_id": fake_token(n)}, "insert", None)


def test_one_key_runs_in_order_and_other_keys_do_not_wait():
    window = KeyedWindow(parallelism=4, capacity=16)
    a1, b1, a2, c1 = (entry_of(window, k, n) for n, k in enumerate("abac", 1))
    taken = [window.take() for _ in range(4)]
    assert taken == [a1, b1, c1, None]  # a2 waits behind a1
    assert window.settle(b1) == []  # a1 is unsettled: the watermark stays before it
    assert window.settle(a1) == [a1, b1]
    assert window.take() is a2
    assert window.settle(c1) == []
    assert window.settle(a2) == [a2, c1]
    assert window.empty and window.watermark is c1


def test_the_window_is_full_at_its_capacity_and_bounds_the_slots():
    window = KeyedWindow(parallelism=2, capacity=3)
    entries = [entry_of(window, n, n) for n in range(1, 4)]
    assert window.full and window.held == 3
    assert [window.take(), window.take(), window.take()] == [entries[0], entries[1], None]
    window.settle(entries[1])
    assert window.full  # settled behind an unsettled event: still held
    assert window.settled_beyond_watermark == 1 and window.in_flight == 2
    window.settle(entries[0])
    assert window.held == 1 and not window.full


def test_a_failing_event_parks_its_key_only():
    window = KeyedWindow(parallelism=4)
    a1, a2, b1 = entry_of(window, "a", 1), entry_of(window, "a", 2), entry_of(window, "b", 3)
    assert window.take() is a1 and window.take() is b1
    a1.failing = True
    assert window.parked_keys() == ["a"]
    window.settle(b1)
    window.settle(a1)  # parked in the DLQ: settled
    assert window.parked_keys() == [] and window.take() is a2


def test_a_closed_window_hands_out_nothing():
    window = KeyedWindow(parallelism=2)
    first = entry_of(window, "a", 1)
    entry_of(window, "b", 2)
    assert window.take() is first
    window.release(first)
    assert window.closed and window.take() is None and window.idle


def test_an_event_the_reader_began_alone_enters_the_window_running():
    window = KeyedWindow(parallelism=2)
    began = window.admit_running("a", {"_id": fake_token(1)}, "insert", None)
    later = entry_of(window, "a", 2)
    assert began.state == WindowEntry.RUNNING and window.running == 1
    assert window.take() is None  # its key's next event waits behind it
    assert window.settle(began) == [began] and window.take() is later


def test_the_default_key_is_the_document_key_and_keys_become_hashable():
    event = {"documentKey": {"_id": 7, "shard": [1, 2]}, "fullDocument": {"customer": "c"}}
    assert event_key(None, event) == (("_id", 7), ("shard", (1, 2)))
    assert event_key(by_customer, event) == "c"


# -- the threaded runtime ---------------------------------------------------------------


@pytest.fixture(params=RUNNERS)
def runner(request):
    return request.param


def insert_orders(oplog, count, customers, start=1):
    return [
        oplog.insert({"_id": n, "customer": f"c{n % customers}"})
        for n in range(start, start + count)
    ]


class Recorder:
    """Records each handled order per customer, and the most handler calls at once."""

    def __init__(self, delay=0.0):
        self.delay = delay
        self.lock = threading.Lock()
        self.handled = []
        self.running = 0
        self.most = 0

    def __call__(self, doc):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        if self.delay:
            time.sleep(random.uniform(0, self.delay))
        with self.lock:
            self.running -= 1
            self.handled.append((doc["customer"], doc["_id"]))


def per_customer(handled):
    orders = {}
    for customer, order in handled:
        orders.setdefault(customer, []).append(order)
    return orders


def test_events_of_a_key_keep_their_order_while_keys_run_at_once(runner):
    store, source = bootstrapped(runner)
    events = insert_orders(source.oplog, 300, customers=12)
    recorder = Recorder(delay=0.004)
    consumer = consumer_class(runner)(
        spec(recorder, parallelism=8, key=by_customer), store, lambda s: source
    )
    consumer.run(burst=True)
    assert sorted(order for _, order in recorder.handled) == list(range(1, 301))
    for customer, orders in per_customer(recorder.handled).items():
        assert orders == sorted(orders), customer
    assert recorder.most > 1
    assert consumer.events_handled == 300
    assert store.find("orders").last_processed_token == events[-1]["_id"]


def test_the_anchor_never_passes_an_unsettled_event(runner):
    store, source = bootstrapped(runner)
    events = insert_orders(source.oplog, 40, customers=40)
    blocked, release = threading.Event(), threading.Event()

    def handler(doc):
        if doc["_id"] == 5:
            blocked.set()
            release.wait(WAIT * 2)

    consumer = consumer_class(runner)(spec(handler, parallelism=4), store, lambda s: source)
    thread = threading.Thread(target=consumer.run)
    thread.start()
    try:
        assert blocked.wait(WAIT)
        window = consumer.window.window
        assert polling.poll(lambda: window.settled_beyond_watermark, lambda n: n >= 10) >= 10
        # Orders 1-4 are settled and anchored (the anchor's write may trail the
        # window's count on a loaded machine); 5 holds the watermark whatever settled
        # after, so the anchor reaches order 4 and stays there.
        anchored = polling.poll(
            lambda: store.find("orders").last_processed_token, lambda t: t == events[3]["_id"]
        )
        assert anchored == events[3]["_id"]
        # Everything after 5 the window can hold has settled (all it could feed the
        # anchor with); the anchor still has not passed 5.
        polling.wait_until(
            lambda: (
                window.settled_beyond_watermark == window.held - 1
                and (window.full or window.held == len(events) - 4)
            ),
            "every held order but 5 settled",
        )
        time.sleep(0.1)
        assert store.find("orders").last_processed_token == events[3]["_id"]
        # What the process publishes for operators (StreamWorker).
        report = window_report(consumer)
        assert report["in_flight"] >= 1 and report["watermark_lag"] >= 10
        assert report["parked_keys"] == []
        release.set()
        polling.wait_until(lambda: consumer.events_handled >= 40, "every order handled")
    finally:
        release.set()
        consumer.stop()
        thread.join(WAIT)
    assert store.find("orders").last_processed_token == events[-1]["_id"]


def test_a_poison_event_parks_its_key_not_the_stream(runner):
    store, source = bootstrapped(runner)
    events = insert_orders(source.oplog, 30, customers=3)  # order 3 is customer c0's first
    handled, dlq = [], InMemoryDlqStore()
    parked_at = []

    def handler(doc):
        if doc["_id"] == 3:
            parked_at.append(time.monotonic())
            raise ConnectionError("poison")
        handled.append((doc["customer"], doc["_id"], time.monotonic()))

    stream = spec(
        handler,
        parallelism=4,
        window=64,  # the whole test in the window: nothing waits for room
        key=by_customer,
        retry_policy=RetryPolicySpec(
            max_attempts=3, initial_delay="100ms", multiplier=1.0, jitter=False
        ),
        dead_letter_queue=DeadLetterQueueSpec(),
    )
    consumer = consumer_class(runner)(stream, store, lambda s: source, dlq_store=dlq)
    consumer.run(burst=True)
    gave_up = parked_at[-1]
    assert len(parked_at) == 3
    assert [entry.document_key for entry in dlq.find_by_stream("orders")] == [{"_id": 3}]
    c0 = [(order, at) for customer, order, at in handled if customer == "c0"]
    others = [at for customer, _, at in handled if customer != "c0"]
    # The other customers were all handled while order 3 was still being retried...
    assert len(others) == 20 and max(others) < gave_up
    # ...and customer c0's later orders waited for it to be parked.
    assert [order for order, _ in c0] == [6, 9, 12, 15, 18, 21, 24, 27, 30]
    assert min(at for _, at in c0) >= gave_up
    assert store.find("orders").last_processed_token == events[-1]["_id"]


def test_a_full_window_stops_the_reader(runner):
    store, source = bootstrapped(runner)
    insert_orders(source.oplog, 500, customers=500)
    read, blocked, release = [0], threading.Event(), threading.Event()

    def counting_source(stream_spec):
        opened = FakeChangeSource(source.oplog)
        original = opened.open

        def open_counted(**options):
            cursor = original(**options)
            poll = cursor.try_next

            def try_next():
                event = poll()
                if event is not None:
                    read[0] += 1
                return event

            cursor.try_next = try_next
            return cursor

        opened.open = open_counted
        return opened

    def handler(doc):
        blocked.set()
        release.wait(WAIT * 2)

    consumer = consumer_class(runner)(
        spec(handler, parallelism=4, window=16), store, counting_source
    )
    thread = threading.Thread(target=consumer.run, kwargs={"burst": True})
    thread.start()
    try:
        assert blocked.wait(WAIT)
        # The window fills (every handler waits for the release), then the reader
        # waits: given a moment more, it reads no further.
        window = consumer.window.window
        assert polling.poll(lambda: window.held, lambda held: held >= 16) == 16
        time.sleep(0.3)
        # 16 held, plus the one the reader waits to admit.
        assert read[0] <= 17
        assert consumer.window.window.held == 16
    finally:
        release.set()
        thread.join(WAIT)
    assert read[0] == 500 and consumer.events_handled == 500


def test_a_slow_anchor_write_holds_the_reader(runner):
    """While a processed-anchor write hangs, at most ``window`` events are handled past
    the ``save_every_n`` being written: a kill then re-delivers at most their sum."""
    store, source = bootstrapped(runner)
    events = insert_orders(source.oplog, 400, customers=400)
    writing, release = threading.Event(), threading.Event()
    save_processed = store.save_processed

    def hanging_save(*args, **kwargs):
        writing.set()
        release.wait(WAIT * 2)
        return save_processed(*args, **kwargs)

    store.save_processed = hanging_save
    handled = []

    def handler(doc):
        # Slow enough to run off the reader; the first order holds the watermark
        # while the others settle, so the anchor is then fed a batch at once.
        time.sleep(0.2 if doc["_id"] == 1 else 0.001)
        handled.append(doc["_id"])

    checkpoint = CheckpointSpec(save_interval_seconds=0, save_every_n=10)
    consumer = consumer_class(runner)(
        spec(handler, window=16, checkpoint=checkpoint),
        store,
        lambda s: source,
    )
    thread = threading.Thread(target=consumer.run, kwargs={"burst": True})
    thread.start()
    try:
        assert writing.wait(WAIT)
        # The window drains what it admitted: a reader not held by the write would
        # keep it busy with the 400 orders.
        polling.wait_until(lambda: consumer.window.window.held == 0, "the window to drain")
        assert len(handled) <= 10 + 16
    finally:
        release.set()
        thread.join(WAIT)
    assert len(handled) == 400
    assert store.find("orders").last_processed_token == events[-1]["_id"]


def test_a_graceful_stop_anchors_what_settled_and_the_restart_reads_the_rest(runner):
    store, source = bootstrapped(runner)
    events = insert_orders(source.oplog, 200, customers=7)
    first = int(events[0]["_id"]["_data"][2:], 16) - 1
    handled = []
    lock = threading.Lock()
    consumer = None

    def handler(doc):
        time.sleep(0.001)
        with lock:
            handled.append(doc["_id"])
            if len(handled) == 60:
                consumer.stop()

    consumer = consumer_class(runner)(
        spec(handler, parallelism=4, checkpoint=CheckpointSpec(save_every_n=10)),
        store,
        lambda s: source,
    )
    consumer.run()
    anchored = processed_position(store) - first
    # The stop let the running events finish and flushed the watermark: every
    # order up to it was handled, none after it is lost.
    assert set(range(1, anchored + 1)) <= set(handled)
    again = []
    consumer_class(runner)(
        spec(lambda doc: again.append(doc["_id"]), parallelism=4), store, lambda s: source
    ).run(burst=True)
    assert sorted(set(handled) | set(again)) == list(range(1, 201))
    assert min(again) == anchored + 1
    redelivered = set(handled) & set(again)
    assert len(redelivered) <= 16  # at most the window


def test_a_lifecycle_event_waits_for_everything_before_it(runner):
    store, source = bootstrapped(runner)
    insert_orders(source.oplog, 20, customers=20)
    source.oplog.append("drop")
    seen = []

    def on_change(ctx):
        seen.append(("drop", len(handled)))

    handled = []
    stream = spec(lambda doc: (time.sleep(0.002), handled.append(doc["_id"])), parallelism=4)
    stream.on_change = on_change
    stream.checkpoint = CheckpointSpec(save_interval_seconds=0, on_history_lost="RESUME_FROM_NOW")
    consumer_class(runner)(stream, store, lambda s: source).run(burst=True)
    assert seen and seen[0] == ("drop", 20)


# -- the checks -------------------------------------------------------------------------


def codes(stream):
    return {problem.code for problem in validate_spec(stream)}


@pytest.mark.parametrize(
    "options, code",
    [
        ({"parallelism": 0}, "E120"),
        ({"parallelism": "4"}, "E120"),
        ({"parallelism": 10_000}, "E120"),
        ({"parallelism": 4, "key": "customer"}, "E121"),
        ({"parallelism": 4, "window": 2}, "E122"),
        ({"parallelism": 4, "window": True}, "E122"),
        ({"parallelism": 1, "key": by_customer}, "W107"),
        ({"parallelism": 1, "window": 8}, "W107"),
    ],
)
def test_bad_parallel_options_are_reported(options, code):
    assert code in codes(spec(lambda doc: None, **options))


def test_good_parallel_options_pass():
    stream = spec(lambda doc: None, parallelism=16, key=by_customer, window=64)
    assert not {c for c in codes(stream) if c.startswith(("E12", "W107"))}


# -- quick handlers run on the reader's thread (threaded runtime) -------------------------


@pytest.fixture
def quick_under_half_a_second(monkeypatch):
    """Any handler counts as quick: the reader runs events itself once the average
    (starting at 1 s) is below 0.5 s, a few events in, however loaded the machine."""
    from flowwarden_django.streams.runtime.async_parallel import AsyncWindow
    from flowwarden_django.streams.runtime.parallel import ThreadedWindow

    monkeypatch.setattr(ThreadedWindow, "inline_below_seconds", 0.5)
    monkeypatch.setattr(AsyncWindow, "inline_below_seconds", 0.5)


@pytest.fixture
def quick_from_the_start(monkeypatch):
    """Any handler counts as quick from the first event (the average starts at 1 s):
    the reader runs every event itself while nothing fails, so the window is empty
    whenever it reads the next one, however slowly the machine drains it."""
    from flowwarden_django.streams.runtime.async_parallel import AsyncWindow
    from flowwarden_django.streams.runtime.parallel import ThreadedWindow

    monkeypatch.setattr(ThreadedWindow, "inline_below_seconds", 2.0)
    monkeypatch.setattr(AsyncWindow, "inline_below_seconds", 2.0)


def test_quick_handlers_run_on_the_reader_and_keep_key_order(quick_under_half_a_second):
    store, source = bootstrapped("threads")
    insert_orders(source.oplog, 600, customers=10)
    threads, handled = [], []

    def handler(doc):
        threads.append(threading.get_ident())
        handled.append((doc["customer"], doc["_id"]))

    consumer = consumer_class("threads")(
        spec(handler, parallelism=16, key=by_customer), store, lambda s: source
    )
    consumer.run(burst=True)  # on this thread: it is the reader
    reader = threading.get_ident()
    assert sorted(order for _, order in handled) == list(range(1, 601))
    for customer, orders in per_customer(handled).items():
        assert orders == sorted(orders), customer
    # Once the handler's average was known to be quick, the reader ran the events.
    assert threads[-300:].count(reader) == 300


def test_a_quick_handlers_failure_is_retried_on_a_handler_thread(quick_from_the_start):
    store, source = bootstrapped("threads")
    events = insert_orders(source.oplog, 400, customers=4)  # order 300 is customer c0's
    dlq, attempts, handled = InMemoryDlqStore(), [], []

    def handler(doc):
        if doc["_id"] == 300:
            attempts.append((threading.get_ident(), time.monotonic()))
            raise ConnectionError("poison")
        handled.append((doc["customer"], doc["_id"], time.monotonic()))

    stream = spec(
        handler,
        parallelism=4,
        window=200,
        key=by_customer,
        retry_policy=RetryPolicySpec(
            max_attempts=3, initial_delay="100ms", multiplier=1.0, jitter=False
        ),
        dead_letter_queue=DeadLetterQueueSpec(),
    )
    consumer = consumer_class("threads")(stream, store, lambda s: source, dlq_store=dlq)
    consumer.run(burst=True)
    reader = threading.get_ident()
    # The first attempt ran on the reader (the handler was quick); its retries did not
    # hold the reader: they ran on a handler thread while the other customers went on.
    assert attempts[0][0] == reader
    assert {thread for thread, _ in attempts[1:]} - {reader} == {attempts[1][0]}
    gave_up = attempts[-1][1]
    others_late = [order for customer, order, at in handled if customer != "c0" and at > gave_up]
    assert others_late == []  # orders 301-400 all fit in the window while 300 retried
    c0 = [order for customer, order, _ in handled if customer == "c0"]
    assert c0 == sorted(c0) and 300 not in c0 and c0[-1] == 400
    assert [entry.document_key for entry in dlq.find_by_stream("orders")] == [{"_id": 300}]
    assert store.find("orders").last_processed_token == events[-1]["_id"]


# -- transactional streams in parallel: settled marks (PostgreSQL) ------------------------


def transactional_spec(handler, **options):
    return spec(
        handler,
        parallelism=4,
        window=64,
        key=by_customer,
        transactional=True,
        transaction_using="postgres",
        checkpoint=CheckpointSpec(save_every_n=5, save_interval_seconds=0),
        **options,
    )


@on_lane("postgres", databases=["postgres"])
def test_an_async_handler_of_a_transactional_parallel_stream_writes_in_its_transaction():
    from asgiref.sync import sync_to_async

    from flowwarden_django.streams.backends.orm import OrmCheckpointStore
    from tests.testapp.models import Effect

    store, source = OrmCheckpointStore(using="postgres"), FakeChangeSource()
    Consumer = consumer_class("asyncio")
    Consumer(transactional_spec(lambda doc: None), store, lambda s: source).run(burst=True)
    events = insert_orders(source.oplog, 30, customers=3)
    failed_once = []
    create = sync_to_async(Effect.objects.using("postgres").create)

    async def handler(doc):
        await create(order_id=doc["_id"], stream=doc["customer"])
        if doc["_id"] % 7 == 0 and doc["_id"] not in failed_once:
            failed_once.append(doc["_id"])
            raise ConnectionError("after the write")  # its row must roll back

    stream = transactional_spec(
        handler, retry_policy=RetryPolicySpec(max_attempts=2, initial_delay="1ms", jitter=False)
    )
    Consumer(stream, store, lambda s: source).run(burst=True)
    # The ORM call ran on the transaction's thread: each failed attempt's row is gone.
    orders = sorted(Effect.objects.using("postgres").values_list("order_id", flat=True))
    # Keys run concurrently, so the four failures may come in any order.
    assert sorted(failed_once) == [7, 14, 21, 28] and orders == list(range(1, 31))
    assert store.find("orders").last_processed_token == events[-1]["_id"]


@on_lane("postgres", databases=["postgres"])
def test_a_transactional_stream_in_parallel_marks_what_the_anchor_cannot_pass(runner):
    from flowwarden_django.models import StreamSettledEvent
    from flowwarden_django.streams.backends.orm import OrmCheckpointStore
    from tests.testapp.models import Effect

    store, source = OrmCheckpointStore(using="postgres"), FakeChangeSource()
    consumer_class(runner)(spec(lambda doc: None), store, lambda s: source).run(burst=True)
    events = insert_orders(source.oplog, 60, customers=6)
    blocked, release = threading.Event(), threading.Event()

    def handler(doc):
        Effect.objects.using("postgres").create(order_id=doc["_id"], stream=doc["customer"])
        if doc["_id"] == 7 and not release.is_set():
            blocked.set()
            release.wait(WAIT * 2)
            raise RuntimeError("crashed while holding order 7")  # rolls its row back

    marks = StreamSettledEvent.objects.using("postgres").filter(stream_name="orders")
    consumer = consumer_class(runner)(transactional_spec(handler), store, lambda s: source)
    consumer._close = lambda cursor: None  # die without a flush, like a kill
    thread = threading.Thread(target=consumer.run)
    thread.start()
    try:
        assert blocked.wait(WAIT)
        beyond = polling.poll(
            lambda: consumer.window.window.settled_beyond_watermark, lambda n: n >= 20
        )
        assert beyond >= 20
    finally:
        consumer.stop()
        release.set()
        thread.join(10)
    # Orders 1-6 anchored (5 by count, the 6th's mark kept), 7 rolled back, and every
    # order committed beyond it is marked.
    assert store.find("orders").last_processed_token == events[4]["_id"]
    committed = set(Effect.objects.using("postgres").values_list("order_id", flat=True))
    assert 7 not in committed and marks.count() == len(committed) - 5

    seen = []

    def again(doc):
        seen.append(doc["_id"])
        Effect.objects.using("postgres").create(order_id=doc["_id"], stream=doc["customer"])

    consumer_class(runner)(transactional_spec(again), store, lambda s: source).run(burst=True)
    # The restart skipped every marked order: each order has one row, in key order.
    assert sorted(seen) == sorted(set(range(6, 61)) - committed)
    rows = list(Effect.objects.using("postgres").order_by("id").values_list("stream", "order_id"))
    assert sorted(order for _, order in rows) == list(range(1, 61))
    for customer, orders in per_customer(rows).items():
        assert orders == sorted(orders), customer
    assert store.find("orders").last_processed_token == events[-1]["_id"]
    assert not marks.exists()


# -- execution="celery": the worker's side, in process -----------------------------------


def test_an_event_travels_as_bson():
    from bson import ObjectId, Timestamp

    from flowwarden_django.streams.remote_events import decode_event, encode_event

    event = {
        "_id": fake_token(7),
        "clusterTime": Timestamp(1_700_000_000, 3),
        "fullDocument": {"_id": ObjectId(), "tags": ["a"], "raw": b"\x00\x01"},
    }
    assert decode_event(encode_event(event)) == event


def test_the_worker_runs_the_consumers_event_path():
    from flowwarden_django.streams.remote_events import HANDLED, SKIPPED, RemoteEventError
    from flowwarden_django.streams.runtime.remote_runner import EventRunner

    source, dlq = FakeChangeSource(), InMemoryDlqStore()
    ok, poison = insert_orders(source.oplog, 2, customers=1)
    handled = []

    def handler(doc):
        if doc["_id"] == 2:
            raise ConnectionError("poison")
        handled.append(doc["_id"])

    with_dlq = spec(
        handler,
        retry_policy=RetryPolicySpec(max_attempts=2, initial_delay="1ms", jitter=False),
        dead_letter_queue=DeadLetterQueueSpec(),
    )
    runner = EventRunner(with_dlq)
    runner.consumer._dlq_store = dlq
    assert runner.run(ok) == HANDLED and handled == [1]
    assert runner.run(poison) == SKIPPED  # retried once, then parked
    assert [e.attempts for e in dlq.find_by_stream("orders")] == [2]
    with pytest.raises(RemoteEventError, match="poison"):
        EventRunner(spec(handler)).run(poison)  # no DLQ: unsettled, delivered again


def test_the_worker_says_once_that_an_attempt_failed():
    from flowwarden_django.streams.remote_events import SKIPPED
    from flowwarden_django.streams.runtime.remote_runner import EventRunner

    source, dlq = FakeChangeSource(), InMemoryDlqStore()
    (poison,) = insert_orders(source.oplog, 1, customers=1)
    failing = []

    def handler(doc):
        raise ConnectionError("poison")

    with_dlq = spec(
        handler,
        retry_policy=RetryPolicySpec(max_attempts=3, initial_delay="1ms", jitter=False),
        dead_letter_queue=DeadLetterQueueSpec(),
    )
    runner = EventRunner(with_dlq, on_failing=lambda: failing.append(True))
    runner.consumer._dlq_store = dlq
    assert runner.run(poison) == SKIPPED
    assert failing == [True]  # three failed attempts, one notice

    def backend_down():
        raise ConnectionError("result backend down")

    runner = EventRunner(with_dlq, on_failing=backend_down)
    runner.consumer._dlq_store = dlq
    assert runner.run(poison) == SKIPPED  # the notice only informs: the event is parked


def test_a_slot_waiting_for_a_worker_parks_the_key_it_says_is_failing():
    from celery.exceptions import TimeoutError as ResultTimeout

    from flowwarden_django.integrations.celery import stream_events

    class Result:
        id = "task-1"
        answers = [ResultTimeout(), ResultTimeout(), ResultTimeout(), "skipped"]
        state = "PENDING"

        def get(self, **options):
            answer = self.answers.pop(0)
            if isinstance(answer, Exception):
                self.state = stream_events.FAILING  # the worker's first attempt failed
                raise answer
            return answer

    class App:
        def send_task(self, name, args):
            return Result()

    window = KeyedWindow(parallelism=2)
    entry = window.admit_running("c0", {"_id": fake_token(1)}, "insert", None)
    seen = []

    def failing():
        entry.failing = True
        seen.append(window.parked_keys())

    answer = stream_events.run_on_celery(
        "orders", {"_id": fake_token(1)}, None, lambda: False, failing=failing, app=App()
    )
    assert answer is False and seen == [["c0"]]  # once, while the worker retried


def test_execution_is_checked():
    assert "E123" in codes(spec(lambda doc: None, execution="kafka"))
    assert "E123" not in codes(spec(lambda doc: None, execution="inline"))


def test_celery_execution_without_a_result_backend_names_the_backends(monkeypatch):
    from celery import current_app

    monkeypatch.setattr(current_app.conf, "result_backend", None)
    (problem,) = [
        p for p in validate_spec(spec(lambda doc: None, execution="celery")) if p.code == "E123"
    ]
    assert "needs a Celery result backend" in problem.message
    assert '"redis://127.0.0.1:6379/1"' in problem.hint
    assert '"django-db" with django-celery-results' in problem.hint


def test_quick_async_handlers_run_on_the_asyncio_reader_and_keep_key_order(
    quick_under_half_a_second,
):
    import asyncio

    store, source = bootstrapped("asyncio")
    insert_orders(source.oplog, 600, customers=10)
    tasks, handled = [], []

    async def handler(doc):
        tasks.append(asyncio.current_task())
        handled.append((doc["customer"], doc["_id"]))

    consumer_class("asyncio")(
        spec(handler, parallelism=16, key=by_customer), store, lambda s: source
    ).run(burst=True)
    assert sorted(order for _, order in handled) == list(range(1, 601))
    for customer, orders in per_customer(handled).items():
        assert orders == sorted(orders), customer
    # Once known to be quick, the events ran in the reader's own task: no task each.
    assert len({id(task) for task in tasks[-300:]}) == 1
    assert len({id(task) for task in tasks[:5]}) > 1  # tasks until the average is known


def test_a_quick_async_handlers_failure_is_retried_in_a_task_of_its_own(quick_from_the_start):
    import asyncio

    store, source = bootstrapped("asyncio")
    events = insert_orders(source.oplog, 400, customers=4)
    dlq, attempts, handled = InMemoryDlqStore(), [], []

    async def handler(doc):
        if doc["_id"] == 300:
            attempts.append((id(asyncio.current_task()), time.monotonic()))
            raise ConnectionError("poison")
        handled.append((doc["customer"], doc["_id"], id(asyncio.current_task()), time.monotonic()))

    stream = spec(
        handler,
        parallelism=4,
        window=200,
        key=by_customer,
        retry_policy=RetryPolicySpec(
            max_attempts=3, initial_delay="100ms", multiplier=1.0, jitter=False
        ),
        dead_letter_queue=DeadLetterQueueSpec(),
    )
    consumer_class("asyncio")(stream, store, lambda s: source, dlq_store=dlq).run(burst=True)
    # The reader's task: the one that ran most of the quick events before the poison.
    before = Counter(task for _, order, task, _ in handled if order < 300)
    reader = before.most_common(1)[0][0]
    assert all(task != reader for task, _ in attempts[1:])  # no backoff held the reader
    gave_up = attempts[-1][1]
    assert [order for customer, order, _, at in handled if customer != "c0" and at > gave_up] == []
    c0 = [order for customer, order, _, _ in handled if customer == "c0"]
    assert c0 == sorted(c0) and 300 not in c0 and c0[-1] == 400
    assert [entry.document_key for entry in dlq.find_by_stream("orders")] == [{"_id": 300}]
    assert store.find("orders").last_processed_token == events[-1]["_id"]


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_failure_lets_the_other_events_sent_to_workers_answer_before_the_restart(
    runner, monkeypatch
):
    """Order 2's worker fails it while order 1 (another key) waits for its worker: the
    slot of order 1 waits on for the answer, and the restart sends nothing before it
    came (the task it waits for may still run: a replay beside it could overtake it)."""
    from flowwarden_django.streams.remote_events import RemoteEventError
    from flowwarden_django.streams.runtime import parallel

    store, source = bootstrapped(runner)
    insert_orders(source.oplog, 2, customers=2)
    log, lock = [], threading.Lock()
    sent = Counter()
    failed = threading.Event()

    def on_worker(name, event, event_id, stopping, *, failing=None):
        order = event["fullDocument"]["_id"]
        with lock:
            sent[order] += 1
            log.append(f"send {order}#{sent[order]}")
            first = sent[order] == 1
        if first and order == 2:
            polling.wait_until(lambda: sent[1] == 1, "order 1 sent")
            failed.set()
            raise RemoteEventError("order 2 failed in the worker")
        if first and order == 1:
            failed.wait(WAIT)
            window = stopping.__self__
            # Until the generation ends (its window closes), then a look at the stop.
            polling.wait_until(lambda: window._stopping, "the window closing")
            with lock:
                log.append("gave up 1" if stopping() else "answer 1")
            return None if stopping() else True
        return True

    monkeypatch.setattr(parallel, "remote_executor", lambda execution: on_worker)
    stream = spec(
        lambda doc: None,
        parallelism=2,
        key=by_customer,
        execution="celery",
    )
    consumer_class(runner)(stream, store, lambda s: source).run(burst=True)
    assert "gave up 1" not in log, log
    answered = log.index("answer 1")
    # The first generation's two sends and order 1's answer (settled: the anchor
    # passes it), then the restart's send of order 2.
    assert sorted(log[:answered]) == ["send 1#1", "send 2#1"], log
    assert log[answered + 1 :] == ["send 2#2"], log
