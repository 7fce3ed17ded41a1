"""The per-event path made cheap (issue 14) keeps every guarantee.

A handler that takes only the document gets no change context unless it fails; the
per-event signals are sent to cached receivers, with their arguments made only for
receivers that read them; the processed anchor's timestamp is converted only when it
is written; the handler caller reads each signature once.
"""

import asyncio
import gc
import uuid
import weakref
from datetime import UTC, datetime

import pytest
from bson import Timestamp
from django.dispatch import Signal

from flowwarden_django.streams import metrics
from flowwarden_django.streams.backends.memory import InMemoryCheckpointStore
from flowwarden_django.streams.checkpoint import as_utc
from flowwarden_django.streams.context import ChangeContext, aware_datetime, new_event_id
from flowwarden_django.streams.dispatch import HandlerCaller
from flowwarden_django.streams.runtime import StreamConsumer
from flowwarden_django.streams.runtime.policy import ProcessedAnchorPolicy
from flowwarden_django.streams.spec import (
    CheckpointSpec,
    DeadLetterQueueSpec,
    RestartPolicySpec,
    RetryPolicySpec,
    StreamSpec,
)
from flowwarden_django.testkit.checkpoint_store import now_ms
from flowwarden_django.testkit.fake_source import FakeChangeSource
from tests.streams.managers import RUNNERS, consumer_class

Consumer = StreamConsumer


@pytest.fixture(autouse=True, params=RUNNERS)
def runner(request, monkeypatch):
    """Every test runs on both runtimes: ``Consumer`` is the runner's consumer class."""
    monkeypatch.setitem(globals(), "Consumer", consumer_class(request.param))
    return request.param


STREAM = "event-path"


def make_spec(handler, **options):
    return StreamSpec(
        name=STREAM,
        collection="orders",
        handlers={"insert": handler},
        checkpoint=options.pop("checkpoint", CheckpointSpec(save_every_n=1)),
        restart_policy=RestartPolicySpec(max_attempts=1, initial_delay=0),
        **options,
    )


def consume(spec, source, store=None, dlq=None):
    """Run *spec* in burst mode over *source* from the position ``source_with`` saved."""
    if store is None:
        store = source.store
    else:
        store.save_seen(STREAM, source.start, now_ms(), heartbeat_at=now_ms())
    consumer = Consumer(spec, store, lambda s: source, dlq_store=dlq, sleep=lambda s: False)
    consumer.run(burst=True)
    return consumer, store


def source_with(*ids):
    """A fake source whose stream has a position, then the inserts of *ids* after it."""
    source = FakeChangeSource()
    source.start = source.initial_position()
    source.store = InMemoryCheckpointStore()
    source.store.save_seen(STREAM, source.start, now_ms(), heartbeat_at=now_ms())
    events = [source.oplog.insert({"_id": i, "n": i}) for i in ids]
    return source, events


@pytest.fixture
def connected():
    """Connect receivers for the test (strongly, to ``STREAM``), disconnect after."""
    connections = []

    def connect(signal, receiver, **options):
        options.setdefault("sender", STREAM)
        options.setdefault("weak", False)
        signal.connect(receiver, **options)
        connections.append((signal, receiver, options["sender"]))
        return receiver

    yield connect
    for signal, receiver, sender in connections:
        signal.disconnect(receiver, sender=sender)


# -- the first attempt without a context -------------------------------------------------


def test_a_document_handler_gets_no_context_and_every_event_is_settled(monkeypatch):
    made = []
    real_init = ChangeContext.__init__

    def counting_init(self, *args, **kwargs):
        made.append(1)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(ChangeContext, "__init__", counting_init)
    handled = []
    source, events = source_with(1, 2, 3)
    consumer, store = consume(make_spec(lambda doc: handled.append(doc["_id"])), source)
    assert handled == [1, 2, 3]
    assert made == []  # nobody needed one
    assert consumer.events_handled == 3
    saved = store.find(STREAM)
    assert saved.last_processed_token == events[-1]["_id"]
    # The anchor's timestamp is the event's cluster time, converted when written.
    assert saved.last_processed_at == events[-1]["clusterTime"].as_datetime()


def test_each_event_is_a_span_when_a_provider_records():
    pytest.importorskip("opentelemetry.sdk")
    from tests.support.otel import recorded_spans

    handled = []
    source, _ = source_with(1, 2)
    with recorded_spans() as exporter:  # set before the stream starts, as at startup
        consume(make_spec(lambda doc: handled.append(doc["_id"])), source)
    spans = [span for span in exporter.get_finished_spans() if span.name.startswith("flow")]
    assert handled == [1, 2]
    assert [span.name for span in spans] == ["flowwarden.stream.event"] * 2
    assert {span.attributes["flowwarden.stream"] for span in spans} == {STREAM}
    assert {span.attributes["flowwarden.stream.operation"] for span in spans} == {"insert"}


def test_no_event_is_a_span_without_a_provider(monkeypatch):
    from flowwarden_django.common import tracing

    opened = []
    monkeypatch.setattr(tracing, "span", lambda *args, **kwargs: opened.append(args))
    source, _ = source_with(1, 2)
    consume(make_spec(lambda doc: None), source)
    assert opened == []


def test_a_failing_document_handler_gets_the_full_attempt_loop(connected):
    attempts = []
    received, errors = [], []
    connected(metrics.event_received, lambda sender, **kw: received.append(kw["event_id"]))
    connected(metrics.event_error, lambda sender, **kw: errors.append(kw))

    def handler(doc):
        attempts.append(doc["_id"])
        if len(attempts) < 3:
            raise RuntimeError("flaky")

    source, events = source_with(7)
    spec = make_spec(
        handler, retry_policy=RetryPolicySpec(max_attempts=3, initial_delay=0, jitter=False)
    )
    consumer, store = consume(spec, source)
    assert attempts == [7, 7, 7]
    assert [(e["attempt"], e["will_retry"]) for e in errors] == [(1, True), (2, True)]
    # The delivery id of event_received is the one the error reports.
    assert {e["event_id"] for e in errors} == set(received) and len(received) == 1
    assert consumer.errors == 2 and consumer.retries == 2
    assert store.find(STREAM).last_processed_token == events[0]["_id"]


def test_a_document_handler_that_fails_for_good_is_parked(connected):
    from tests.streams.test_errors import ListDlqStore

    dlq = ListDlqStore()
    source, events = source_with(1, 2)

    def handler(doc):
        if doc["_id"] == 1:
            raise ValueError("poison")

    spec = make_spec(handler, dead_letter_queue=DeadLetterQueueSpec())
    consumer, store = consume(spec, source, dlq=dlq)
    (entry,) = dlq.entries.values()
    assert entry.attempts == 1 and entry.error.type.endswith("ValueError")
    assert entry.resume_token == events[0]["_id"]
    assert consumer.dead_lettered == 1
    assert store.find(STREAM).last_processed_token == events[1]["_id"]


def test_a_handler_whose_signature_cannot_be_read_fails_its_attempts():
    from tests.streams.test_errors import ListDlqStore

    dlq = ListDlqStore()
    source, events = source_with(1)
    spec = make_spec(lambda a, b, c: None, dead_letter_queue=DeadLetterQueueSpec())
    _, store = consume(spec, source, dlq=dlq)
    (entry,) = dlq.entries.values()
    assert entry.error.type.endswith("TypeError") and "takes a, b, c" in entry.error.message
    assert store.find(STREAM).last_processed_token == events[0]["_id"]


def test_a_context_handler_may_save_early_on_the_plain_path():
    writes = []
    store = InMemoryCheckpointStore()
    real_save = store.save_processed

    def save_processed(name, token, at, heartbeat_at=None):
        writes.append(token)
        real_save(name, token, at, heartbeat_at)

    store.save_processed = save_processed

    def handler(doc, ctx):
        if doc["_id"] == 2:
            assert ctx.save_checkpoint_now()

    source, events = source_with(1, 2, 3)
    spec = make_spec(handler, checkpoint=CheckpointSpec(save_every_n=100, save_interval_seconds=0))
    consume(spec, source, store=store)
    # 2 was written at once (and not again on settling); 3 by the flush on stop.
    assert writes == [events[1]["_id"], events[2]["_id"]]


def test_an_async_document_handler_is_awaited_on_the_plain_path():
    handled = []

    async def handler(doc):
        await asyncio.sleep(0)
        handled.append(doc["_id"])

    source, _ = source_with(1, 2)
    consume(make_spec(handler), source)
    assert handled == [1, 2]


def test_last_event_at_is_the_time_of_the_last_event():
    source, _ = source_with(1)
    before = datetime.now(UTC)
    consumer, _ = consume(make_spec(lambda doc: None), source)
    assert before <= consumer.last_event_at <= datetime.now(UTC)
    consumer.last_event_at = None
    assert consumer.last_event_at is None


# -- the per-event signals ----------------------------------------------------------------


def test_event_received_carries_every_argument_to_a_plain_receiver(connected):
    got = []
    connected(metrics.event_received, lambda sender, **kw: got.append((sender, kw)))
    source, events = source_with(5)
    consume(make_spec(lambda doc: None), source)
    ((sender, kwargs),) = got
    assert sender == STREAM
    assert kwargs["signal"] is metrics.event_received
    assert uuid.UUID(kwargs["event_id"]).version == 4
    assert kwargs["operation_type"] == "insert"
    assert kwargs["collection"] == "orders"
    assert kwargs["document_key"] == {"_id": 5}
    assert kwargs["cluster_time"] == events[0]["clusterTime"]
    assert kwargs["wall_time"] == as_utc(events[0]["wallTime"])


def test_receivers_that_read_only_the_cluster_time_spare_the_costly_arguments(connected):
    lean, plain = [], []

    @metrics.reads("cluster_time")
    def lean_receiver(sender, **kwargs):
        lean.append(kwargs)

    def plain_receiver(sender, **kwargs):
        plain.append(kwargs)

    connected(metrics.event_received, lean_receiver)
    source, events = source_with(1)
    consume(make_spec(lambda doc: None), source)
    assert lean[0]["event_id"] is None and lean[0]["wall_time"] is None
    assert lean[0]["cluster_time"] == events[0]["clusterTime"]
    # One receiver that reads everything: everyone gets everything.
    connected(metrics.event_received, plain_receiver)
    source, _ = source_with(2)
    consume(make_spec(lambda doc: None), source)
    assert lean[1]["event_id"] is not None and lean[1]["wall_time"] is not None
    assert plain[0]["event_id"] == lean[1]["event_id"]


def test_event_processed_reports_success_and_a_duration(connected):
    got = []
    connected(metrics.event_processed, lambda sender, **kw: got.append(kw))
    source, _ = source_with(1, 2)

    def handler(doc):
        if doc["_id"] == 2:
            raise ValueError("skip me")

    spec = make_spec(handler, on_error=(((ValueError,), lambda error, ctx: "SKIP"),))
    consume(spec, source)
    assert [kw["success"] for kw in got] == [True, False]
    assert all(isinstance(kw["duration"], float) and kw["duration"] >= 0 for kw in got)


def test_an_async_receiver_still_gets_every_event(connected):
    got = []

    async def receiver(sender, **kwargs):
        got.append(kwargs["success"])

    connected(metrics.event_processed, receiver)
    source, _ = source_with(1, 2)
    consume(make_spec(lambda doc: None), source)
    assert got == [True, True]


def test_a_raising_receiver_is_logged_and_the_others_still_run(connected, caplog):
    got = []

    def broken(sender, **kwargs):
        raise RuntimeError("receiver bug")

    connected(metrics.event_processed, broken)
    connected(metrics.event_processed, lambda sender, **kw: got.append(kw["success"]))
    source, _ = source_with(1)
    consume(make_spec(lambda doc: None), source)
    assert got == [True]
    assert "metrics receiver" in caplog.text and "receiver bug" in caplog.text


# -- the cached receivers of a StreamSignal ---------------------------------------------


def test_connect_and_disconnect_take_effect_at_the_next_send():
    signal = metrics.StreamSignal()
    got = []

    def receiver(sender, **kwargs):
        got.append(sender)

    metrics.emit(signal, STREAM)  # caches "nobody"
    signal.connect(receiver, sender=STREAM)
    assert signal.has_listeners(STREAM)
    metrics.emit(signal, STREAM)  # cached now
    metrics.emit(signal, STREAM)
    signal.disconnect(receiver, sender=STREAM)
    metrics.emit(signal, STREAM)
    assert got == [STREAM, STREAM]
    assert not metrics.listeners(signal, STREAM)


def test_the_cache_keeps_weak_receivers_weak():
    signal = metrics.StreamSignal()
    got = []

    class Owner:
        def receive(self, sender, **kwargs):
            got.append(sender)

    owner = Owner()
    signal.connect(owner.receive, sender=STREAM)
    metrics.emit(signal, STREAM)
    ref = weakref.ref(owner)
    del owner
    gc.collect()
    assert ref() is None  # the cache did not keep it alive
    metrics.emit(signal, STREAM)
    assert got == [STREAM]
    assert not signal.has_listeners(STREAM)


def test_a_sender_matches_as_it_would_without_the_cache():
    # Django matches a connected sender by identity: an equal string that is another
    # object is another sender, cached or not.
    cached, plain = metrics.StreamSignal(), Signal()
    name = "".join(["event-", "path"])
    other = "".join(["event-", "path"])
    assert name == other and name is not other
    for signal in (cached, plain):
        signal.connect(lambda sender, **kwargs: None, sender=name, weak=False)
    for _ in range(2):  # the second time from the cache
        assert cached.has_listeners(name) is plain.has_listeners(name) is True
        assert cached.has_listeners(other) is plain.has_listeners(other) is False


def test_every_stream_signal_caches():
    assert metrics.ALL_SIGNALS
    assert all(isinstance(s, metrics.StreamSignal) for s in metrics.ALL_SIGNALS.values())


# -- the handler caller, ids and times ----------------------------------------------------


def test_the_caller_reads_a_signature_once_and_never_by_a_reused_id(monkeypatch):
    from flowwarden_django.streams import dispatch

    reads = []
    real = dispatch.handler_shape

    def counting(handler):
        reads.append(handler)
        return real(handler)

    monkeypatch.setattr(dispatch, "handler_shape", counting)
    caller = HandlerCaller()

    def by_doc(doc):
        return ("doc", doc)

    assert caller.call(by_doc, 1, "ctx") == ("doc", 1)
    assert caller.call(by_doc, 2, "ctx") == ("doc", 2)
    assert reads == [by_doc]
    # Another function under the same id (after the first died) is read anew.
    caller._shapes[id(by_ctx := (lambda ctx: ("ctx", ctx)))] = (by_doc, "doc")
    assert caller.call(by_ctx, 1, "ctx") == ("ctx", "ctx")
    assert caller.call(lambda doc, ctx: (doc, ctx), 1, "c") == (1, "c")


def test_event_ids_are_random_uuid4_hex():
    ids = {new_event_id() for _ in range(1000)}
    assert len(ids) == 1000
    for value in ids:
        parsed = uuid.UUID(value)
        assert parsed.hex == value and parsed.version == 4 and parsed.variant == uuid.RFC_4122


@pytest.mark.parametrize(
    "value",
    [
        datetime(2024, 1, 1, 12, 30, 5, 123000),
        datetime(2024, 11, 3, 1, 30, fold=1),
        datetime(2024, 1, 1, tzinfo=UTC),
        Timestamp(1_700_000_000, 3),
        None,
    ],
)
def test_aware_datetime_is_what_it_was(value):
    expected = (
        None
        if value is None
        else value.as_datetime()
        if isinstance(value, Timestamp)
        else as_utc(value)
    )
    got = aware_datetime(value)
    assert got == expected
    if got is not None:
        assert got.tzinfo is not None and type(got) is datetime
        assert got.fold == expected.fold


def test_the_anchor_timestamp_is_made_only_when_written():
    store = InMemoryCheckpointStore()
    policy = ProcessedAnchorPolicy(store, STREAM, save_every_n=3, save_interval_seconds=0)
    calls = []

    def at(n):
        def make():
            calls.append(n)
            return datetime(2024, 1, 1, 0, 0, n, tzinfo=UTC)

        return make

    for n in (1, 2, 3, 4):
        policy.on_settled({"_data": f"{n:04d}"}, at(n))
    assert calls == [3]  # the third settlement was written; 1, 2 were replaced first
    assert store.find(STREAM).last_processed_at == datetime(2024, 1, 1, 0, 0, 3, tzinfo=UTC)
    assert policy.flush()
    assert calls == [3, 4]
    policy.on_settled({"_data": "0005"}, datetime(2024, 1, 1, tzinfo=UTC))  # a datetime too
    assert policy.flush()
    assert store.find(STREAM).last_processed_at == datetime(2024, 1, 1, tzinfo=UTC)


def test_a_dirty_anchor_without_a_time_is_due_by_age():
    # A manual save that failed leaves the anchor dirty with no dirty time: the age
    # check (made without the lock) must still find it due, as before that check.
    class FailingOnce(InMemoryCheckpointStore):
        failures = 1

        def save_processed(self, *args, **kwargs):
            if self.failures:
                self.failures -= 1
                raise ConnectionError("down")
            return super().save_processed(*args, **kwargs)

    now = [1000.0]
    store = FailingOnce()
    policy = ProcessedAnchorPolicy(
        store, STREAM, save_every_n=100, save_interval_seconds=5, monotonic=lambda: now[0]
    )
    token = {"_data": "0001"}
    assert not policy.save_now(token, datetime(2024, 1, 1, tzinfo=UTC))
    assert not policy.age_flush_ruled_out()
    now[0] += 1  # past the pause after a failed write
    assert policy.flush_if_due()
    assert store.find(STREAM).last_processed_token == token
    assert policy.age_flush_ruled_out()  # nothing dirty any more
