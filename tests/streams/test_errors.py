"""Lane (a): error routing, retries and dead-lettering against the fake change source.

The reference's rules (on_error exact → parent → catch-all; SKIP, RETRY, DLQ,
RETHROW; retry_on / no_retry_on; a DLQ decision settles the event) plus our
fixes: an event that failed for good without a DLQ, or whose DLQ write failed, is
not dropped but redelivered after a restart; a failing filter restarts the stream.
"""

import threading

import pytest

from flowwarden_django.streams import ErrorAction, metrics
from flowwarden_django.streams.backends.memory import InMemoryCheckpointStore
from flowwarden_django.streams.dlq import (
    MANUAL_DLQ_TYPE,
    DeadLetter,
    DlqPolicy,
    DlqStore,
    dead_letter_id,
)
from flowwarden_django.streams.runtime import StreamConsumer
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
from tests.support.polling import wait_until

Consumer = StreamConsumer


@pytest.fixture(autouse=True, params=RUNNERS)
def runner(request, monkeypatch):
    """Every test runs on both runtimes: ``Consumer`` is the runner's consumer class."""
    monkeypatch.setitem(globals(), "Consumer", consumer_class(request.param))
    return request.param


class ListDlqStore(DlqStore):
    """Keeps entries in a dict; ``fail_next`` makes the next saves raise."""

    def __init__(self):
        self.entries: dict[str, DeadLetter] = {}
        self.policies: list[DlqPolicy] = []
        self.fail_next = 0

    def save(self, entry, policy):
        if self.fail_next:
            self.fail_next -= 1
            raise ConnectionError("dlq store down")
        self.entries[entry.id] = entry
        self.policies.append(policy)

    def count(self, stream_name):
        return sum(1 for e in self.entries.values() if e.stream_name == stream_name)


class Handler:
    """Fails on the ids in ``failing`` with the given exception until ``fixed``."""

    def __init__(self, failing=(), error=RuntimeError):
        self.failing = set(failing)
        self.error = error
        self.handled = []
        self.calls = []

    def __call__(self, doc, ctx):
        self.calls.append((doc["_id"], ctx.attempt_number))
        if doc["_id"] in self.failing:
            raise self.error(f"cannot handle {doc['_id']}")
        self.handled.append(doc["_id"])


class Sleeps:
    """Records the retry backoff instead of sleeping."""

    def __init__(self, interrupt_after=None):
        self.delays = []
        self.interrupt_after = interrupt_after

    def __call__(self, seconds):
        self.delays.append(seconds)
        return self.interrupt_after is not None and len(self.delays) >= self.interrupt_after


DEFAULT_DLQ = DeadLetterQueueSpec()


def make_spec(handler, *, retry=None, dlq=DEFAULT_DLQ, on_error=(), **options):
    return StreamSpec(
        name="orders",
        collection="orders",
        handlers={"insert": handler},
        retry_policy=retry,
        dead_letter_queue=dlq,
        on_error=on_error,
        checkpoint=CheckpointSpec(save_interval_seconds=0),
        restart_policy=RestartPolicySpec(initial_delay="1ms", max_delay="2ms"),
        **options,
    )


def fresh_source():
    """A fake source whose stream already has a position (``source.store``), so the
    events inserted next are delivered."""
    source = FakeChangeSource()
    source.store = InMemoryCheckpointStore()
    at = now_ms()
    source.store.save_seen("orders", source.initial_position(), at, heartbeat_at=at)
    return source


def consume(spec, source, *, dlq=None, sleeps=None, store=None):
    store = store or source.store
    consumer = Consumer(
        spec, store, lambda s: source, dlq_store=dlq or ListDlqStore(), sleep=sleeps or Sleeps()
    )
    consumer.run(burst=True)
    return consumer, store


def insert(source, *ids):
    return [source.oplog.insert({"_id": i, "n": i}) for i in ids]


NO_JITTER = {"jitter": False, "initial_delay": "100ms", "max_delay": "250ms"}


def test_a_poison_event_is_retried_then_parked_and_the_stream_goes_on():
    source, dlq, sleeps = fresh_source(), ListDlqStore(), Sleeps()
    events = insert(source, 1, 2, 3)
    handler = Handler(failing={2})
    consumer, store = consume(
        make_spec(handler, retry=RetryPolicySpec(max_attempts=3, **NO_JITTER)),
        source,
        dlq=dlq,
        sleeps=sleeps,
    )
    assert handler.handled == [1, 3]
    assert [c for c in handler.calls if c[0] == 2] == [(2, 1), (2, 2), (2, 3)]
    assert sleeps.delays == pytest.approx([0.1, 0.2])  # initial, then x2 (capped at 0.25)
    (entry,) = dlq.entries.values()
    assert entry.id == dead_letter_id("orders", events[1]["_id"])
    assert entry.stream_name == "orders" and entry.operation_type == "insert"
    assert entry.attempts == 3 and entry.status == "PENDING"
    assert entry.error.type == "RuntimeError" and entry.error.message == "cannot handle 2"
    assert "Traceback" in entry.error.stack_trace
    assert entry.full_document == {"_id": 2, "n": 2}
    assert entry.document_key == {"_id": 2}
    assert entry.resume_token == events[1]["_id"]
    assert entry.expires_at == entry.created_at + __import__("datetime").timedelta(days=30)
    assert store.find("orders").last_processed_token == events[2]["_id"]
    assert (consumer.errors, consumer.retries, consumer.dead_lettered) == (3, 2, 1)
    assert consumer.restarts == 0


def test_the_backoff_is_capped_and_jitter_stays_within_20_percent():
    policy = RetryPolicySpec(max_attempts=6, initial_delay="100ms", max_delay="250ms")
    assert [policy.delay(n) for n in range(1, 5)] == pytest.approx([0.1, 0.2, 0.25, 0.25])
    source, sleeps = fresh_source(), Sleeps()
    insert(source, 1)
    consume(make_spec(Handler(failing={1}), retry=policy), source, sleeps=sleeps)
    for delay, base in zip(sleeps.delays, [0.1, 0.2, 0.25, 0.25, 0.25], strict=True):
        assert base * 0.8 <= delay <= base * 1.2


@pytest.mark.parametrize(
    ("retry", "error", "attempts"),
    [
        (RetryPolicySpec(max_attempts=3), ValueError, 1),  # no_retry_on by default
        (RetryPolicySpec(max_attempts=3, retry_on=(ConnectionError,)), RuntimeError, 1),
        (RetryPolicySpec(max_attempts=3, retry_on=(ConnectionError,)), ConnectionResetError, 3),
        (
            RetryPolicySpec(max_attempts=3, retry_on=(KeyError,), no_retry_on=(KeyError,)),
            KeyError,
            1,
        ),
        (None, RuntimeError, 1),  # without a retry policy: one attempt
    ],
    ids=["no-retry-default", "not-in-retry-on", "subclass-in-retry-on", "no-retry-wins", "none"],
)
def test_retry_on_and_no_retry_on(retry, error, attempts):
    source, dlq = fresh_source(), ListDlqStore()
    insert(source, 1)
    consume(make_spec(Handler(failing={1}, error=error), retry=retry), source, dlq=dlq)
    (entry,) = dlq.entries.values()
    assert entry.attempts == attempts


class AppError(Exception):
    pass


class Timeout(AppError):
    pass


def routed(decisions):
    """on_error routes recording which handler answered."""
    answered = []

    def route(label, action):
        def handler(exc, ctx):
            answered.append(label)
            return action

        return handler

    routes = tuple((types, route(label, action)) for label, types, action in decisions)
    return routes, answered


@pytest.mark.parametrize(
    ("error", "expected"),
    [(Timeout, "timeout"), (AppError, "app"), (KeyError, "catch-all")],
    ids=["exact", "parent", "catch-all"],
)
def test_error_handler_resolution_exact_then_parent_then_catch_all(error, expected):
    routes, answered = routed(
        [
            ("catch-all", (), ErrorAction.SKIP),
            ("app", (AppError,), ErrorAction.SKIP),
            ("timeout", (Timeout,), ErrorAction.SKIP),
        ]
    )
    source = fresh_source()
    insert(source, 1)
    consume(make_spec(Handler(failing={1}, error=error), on_error=routes), source)
    assert answered == [expected]


def test_skip_settles_without_dlq_or_retry():
    routes, _ = routed([("skip", (), ErrorAction.SKIP)])
    source, dlq = fresh_source(), ListDlqStore()
    events = insert(source, 1, 2)
    handler = Handler(failing={1})
    _, store = consume(
        make_spec(handler, retry=RetryPolicySpec(max_attempts=5), on_error=routes),
        source,
        dlq=dlq,
    )
    assert handler.calls == [(1, 1), (2, 1)] and not dlq.entries
    assert store.find("orders").last_processed_token == events[1]["_id"]


def test_dlq_action_bypasses_remaining_retries():
    routes, _ = routed([("dlq", (), ErrorAction.DLQ)])
    source, dlq = fresh_source(), ListDlqStore()
    insert(source, 1)
    handler = Handler(failing={1})
    consume(
        make_spec(handler, retry=RetryPolicySpec(max_attempts=5), on_error=routes), source, dlq=dlq
    )
    assert handler.calls == [(1, 1)] and len(dlq.entries) == 1


def test_retry_action_retries_even_no_retry_types_up_to_max_attempts():
    routes, _ = routed([("retry", (ValueError,), ErrorAction.RETRY)])
    source, dlq = fresh_source(), ListDlqStore()
    insert(source, 1)
    handler = Handler(failing={1}, error=ValueError)
    consume(
        make_spec(handler, retry=RetryPolicySpec(max_attempts=4), on_error=routes), source, dlq=dlq
    )
    assert [a for _, a in handler.calls] == [1, 2, 3, 4]
    assert next(iter(dlq.entries.values())).attempts == 4


def test_retry_action_without_a_retry_policy_goes_to_the_dlq():
    routes, _ = routed([("retry", (), ErrorAction.RETRY)])
    source, dlq = fresh_source(), ListDlqStore()
    insert(source, 1)
    handler = Handler(failing={1})
    consume(make_spec(handler, on_error=routes), source, dlq=dlq)
    assert handler.calls == [(1, 1)] and len(dlq.entries) == 1


def test_rethrow_and_a_failing_error_handler_fall_back_to_the_retry_policy():
    def broken(exc, ctx):
        raise LookupError("the error handler itself failed")

    for route in (lambda exc, ctx: ErrorAction.RETHROW, lambda exc, ctx: None, broken):
        source, dlq = fresh_source(), ListDlqStore()
        insert(source, 1)
        handler = Handler(failing={1})
        consume(
            make_spec(handler, retry=RetryPolicySpec(max_attempts=2), on_error=(((), route),)),
            source,
            dlq=dlq,
        )
        assert [a for _, a in handler.calls] == [1, 2] and len(dlq.entries) == 1


def test_without_a_dlq_a_failed_event_is_redelivered_not_dropped():
    source = fresh_source()
    events = insert(source, 1, 2)
    handler = Handler(failing={1})
    store = source.store
    consumer = Consumer(make_spec(handler, dlq=None), store, lambda s: source, sleep=Sleeps())
    thread = threading.Thread(target=consumer.run, kwargs={"burst": True})
    thread.start()
    try:
        # The stream restarts and meets the same event again: polled to a deadline, so
        # a consumer that stops (or never restarts) fails the test instead of hanging it.
        wait_until(
            lambda: consumer.restarts >= 2 or not thread.is_alive(), "the stream's second restart"
        )
        assert consumer.restarts >= 2, "the consumer stopped before restarting twice"
    finally:
        handler.failing.clear()  # the handler is fixed
        thread.join(60)
    assert not thread.is_alive()
    assert handler.handled == [1, 2]
    assert store.find("orders").last_processed_token == events[1]["_id"]


def test_a_failed_dlq_write_leaves_the_event_unsettled_and_it_is_redelivered():
    failures = []
    receiver = lambda sender, error, **kw: failures.append(error)  # noqa: E731
    metrics.event_dlq_failed.connect(receiver, sender="orders")
    try:
        source, dlq = fresh_source(), ListDlqStore()
        dlq.fail_next = 1
        events = insert(source, 1, 2)
        handler = Handler(failing={1})
        consumer, store = consume(make_spec(handler), source, dlq=dlq)
    finally:
        metrics.event_dlq_failed.disconnect(receiver, sender="orders")
    assert len(failures) == 1 and consumer.restarts == 1
    assert [c for c in handler.calls if c[0] == 1] == [(1, 1), (1, 1)]
    assert len(dlq.entries) == 1 and handler.handled == [2]
    assert store.find("orders").last_processed_token == events[1]["_id"]


def test_a_failing_filter_restarts_the_stream_and_the_event_is_redelivered():
    calls = []

    def flaky_filter(ctx):
        calls.append(ctx.full_document["_id"])
        if len(calls) == 1:
            raise KeyError("bad filter")
        return True

    source = fresh_source()
    insert(source, 1)
    handler = Handler()
    consumer, _ = consume(make_spec(handler, filter=flaky_filter), source)
    assert calls == [1, 1] and handler.handled == [1] and consumer.restarts == 1


def test_send_to_dlq_parks_a_manual_entry_and_the_handler_decides_settlement():
    def handler(doc, ctx):
        ctx.add_metadata("tenant", "acme")
        ctx.send_to_dlq("amount is negative")

    source, dlq = fresh_source(), ListDlqStore()
    events = insert(source, 1)
    _, store = consume(make_spec(handler, dlq=None), source, dlq=dlq)
    (entry,) = dlq.entries.values()
    assert entry.error.type == MANUAL_DLQ_TYPE and entry.error.message == "amount is negative"
    assert entry.error.stack_trace is None and entry.metadata == {"tenant": "acme"}
    assert dlq.policies == [DlqPolicy(0, True, True)] and entry.expires_at is None
    assert store.find("orders").last_processed_token == events[0]["_id"]


def test_asend_to_dlq_parks_a_manual_entry_from_an_async_handler():
    async def handler(doc, ctx):
        await ctx.asend_to_dlq("flagged")

    source, dlq = fresh_source(), ListDlqStore()
    events = insert(source, 1)
    _, store = consume(make_spec(handler, dlq=None), source, dlq=dlq)
    (entry,) = dlq.entries.values()
    assert entry.error.type == MANUAL_DLQ_TYPE and entry.error.message == "flagged"
    assert store.find("orders").last_processed_token == events[0]["_id"]


def test_send_to_dlq_failure_raises_into_the_handler():
    seen = []

    def handler(doc, ctx):
        try:
            ctx.send_to_dlq("no")
        except Exception as exc:
            seen.append(type(exc).__name__)

    source, dlq = fresh_source(), ListDlqStore()
    dlq.fail_next = 1
    insert(source, 1)
    consume(make_spec(handler), source, dlq=dlq)
    assert seen == ["DeadLetterWriteError"]


def test_include_flags_shape_the_entry():
    source, dlq = fresh_source(), ListDlqStore()
    insert(source, 1)
    queue = DeadLetterQueueSpec(
        retention_days=0, include_original_document=False, include_stack_trace=False
    )
    consume(make_spec(Handler(failing={1}), dlq=queue), source, dlq=dlq)
    (entry,) = dlq.entries.values()
    assert entry.full_document is None and entry.error.stack_trace is None
    assert entry.expires_at is None and entry.document_key == {"_id": 1}


def test_a_stop_during_the_backoff_leaves_the_event_unsettled():
    source = fresh_source()
    events = insert(source, 1, 2)
    handler = Handler(failing={2})
    store = source.store
    consumer = Consumer(
        make_spec(handler, retry=RetryPolicySpec(max_attempts=5)),
        store,
        lambda s: source,
        dlq_store=ListDlqStore(),
        sleep=lambda seconds: consumer.stop() or True,
    )
    consumer.run(burst=True)
    assert store.find("orders").last_processed_token == events[0]["_id"]


def test_metric_signals_follow_the_reference_emission_rules():
    received = []

    def record(signal_name):
        def receiver(sender, **kwargs):
            received.append((signal_name, kwargs.get("will_retry", kwargs.get("anchor"))))

        return receiver

    names = ["event_error", "event_sent_to_dlq", "checkpoint_saved", "event_processed"]
    receivers = {name: record(name) for name in names}
    for name, receiver in receivers.items():
        getattr(metrics, name).connect(receiver, sender="orders")
    try:
        source = fresh_source()
        insert(source, 1)
        consume(make_spec(Handler(failing={1}), retry=RetryPolicySpec(max_attempts=2)), source)
    finally:
        for name, receiver in receivers.items():
            getattr(metrics, name).disconnect(receiver, sender="orders")
    events = [r for r in received if r[0] != "checkpoint_saved" or r[1] == "processed"]
    assert events == [
        ("event_error", True),
        ("event_error", False),
        ("event_sent_to_dlq", None),
        ("checkpoint_saved", "processed"),
        ("event_processed", None),
    ]


def test_a_raising_metrics_receiver_never_disturbs_the_stream():
    def broken(sender, **kwargs):
        raise RuntimeError("receiver bug")

    metrics.event_received.connect(broken, sender="orders")
    try:
        source = fresh_source()
        insert(source, 1)
        handler = Handler()
        consume(make_spec(handler), source)
    finally:
        metrics.event_received.disconnect(broken, sender="orders")
    assert handler.handled == [1]


@pytest.mark.django_db(transaction=True)
def test_a_manual_save_rolled_back_with_a_failed_attempt_is_written_again():
    """Transactional: attempt 1 saves its anchor early, then fails (both roll back);
    attempt 2 succeeds, so its anchor must be committed with its effects."""
    from flowwarden_django.streams.backends.orm import OrmCheckpointStore
    from tests.testapp.models import Effect

    attempts = []

    def handler(doc, ctx):
        attempts.append(ctx.attempt_number)
        Effect.objects.create(order_id=doc["_id"], stream="orders")
        if ctx.attempt_number == 1:
            ctx.save_checkpoint_now()  # an early acknowledgement, then a failure
            raise ConnectionError("flaky downstream")

    source = fresh_source()
    store = OrmCheckpointStore()
    at = now_ms()
    store.save_seen("orders", source.initial_position(), at, heartbeat_at=at)
    events = insert(source, 1)
    consume(
        make_spec(handler, retry=RetryPolicySpec(max_attempts=2, jitter=False), transactional=True),
        source,
        store=store,
    )
    assert attempts == [1, 2]
    assert list(Effect.objects.values_list("order_id", flat=True)) == [1]
    assert store.find("orders").last_processed_token == events[0]["_id"]
