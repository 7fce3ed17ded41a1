"""The per-event signals through an ``EventAnnouncer`` (issue 52): receivers looked up
once and again after a connect or disconnect, fast paths called in place of their
receivers, every other receiver still sent the signal."""

import gc
import uuid

from bson import Timestamp

from flowwarden_django.streams import metrics
from flowwarden_django.streams.announcer import EventAnnouncer, announcer_for

EVENT = {
    "_id": {"_data": "01"},
    "operationType": "insert",
    "ns": {"db": "app", "coll": "orders"},
    "documentKey": {"_id": 1},
    "clusterTime": Timestamp(1_700_000_000, 1),
}


class Counting:
    """A receiver of both signals with a fast path: counts what reaches it, and how."""

    def __init__(self) -> None:
        self.fast_received: list[object] = []
        self.fast_processed: list[tuple[object, float]] = []
        self.signalled = 0

    @metrics.fast_path(lambda self, stream: self.fast_received.append)
    def on_received(self, sender, **kwargs):
        self.signalled += 1

    @metrics.fast_path(
        lambda self, stream: lambda ok, duration: self.fast_processed.append((ok, duration))
    )
    def on_processed(self, sender, **kwargs):
        self.signalled += 1


def name() -> str:
    return f"announced-{uuid.uuid4().hex[:8]}"


def test_a_receiver_connected_after_the_first_event_gets_the_next_one():
    stream, seen = name(), []
    announcer = EventAnnouncer(stream)
    assert announcer.received(EVENT, "insert") is None  # nobody listens: no event id

    def receiver(sender, event_id, **kwargs):
        seen.append((sender, event_id, kwargs["operation_type"], kwargs["collection"]))

    metrics.event_received.connect(receiver, sender=stream, weak=False)
    try:
        event_id = announcer.received(EVENT, "insert")
    finally:
        metrics.event_received.disconnect(receiver, sender=stream)
    assert seen == [(stream, event_id, "insert", "orders")] and event_id
    announcer.received(EVENT, "insert")  # disconnected: not called again
    assert len(seen) == 1


def test_fast_paths_replace_their_receivers_and_others_still_get_the_signal():
    stream, counting, plain = name(), Counting(), []
    metrics.event_received.connect(counting.on_received, sender=stream, weak=False)
    metrics.event_processed.connect(counting.on_processed, sender=stream, weak=False)

    def on_processed(sender, duration, success, **kwargs):
        plain.append((sender, success))

    metrics.event_processed.connect(on_processed, sender=stream, weak=False)
    try:
        announcer = announcer_for(stream)
        for outcome in (True, False):
            announcer.received(EVENT, "insert")
            announcer.processed(0.0, outcome)
    finally:
        metrics.event_received.disconnect(counting.on_received, sender=stream)
        metrics.event_processed.disconnect(counting.on_processed, sender=stream)
        metrics.event_processed.disconnect(on_processed, sender=stream)
    assert counting.fast_received == [EVENT["clusterTime"]] * 2
    assert [ok for ok, _ in counting.fast_processed] == [True, False]
    assert all(duration > 0 for _, duration in counting.fast_processed)
    assert counting.signalled == 0  # reached through the fast paths only
    assert plain == [(stream, True), (stream, False)]


def test_weak_receivers_are_looked_up_for_each_event_and_die_quietly():
    stream, seen = name(), []

    class Holder:
        def on_received(self, sender, **kwargs):
            seen.append(sender)

    holder = Holder()
    metrics.event_received.connect(holder.on_received, sender=stream)  # weak
    announcer = EventAnnouncer(stream)
    announcer.received(EVENT, "insert")
    del holder
    gc.collect()
    announcer.received(EVENT, "insert")
    assert seen == [stream]
