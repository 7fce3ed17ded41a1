"""The Prometheus receivers of the per-event signals count into a per-stream tally that
each collection folds into the metrics: a scrape sees exactly what per-event counter
and histogram updates would have shown. Each thread counts into its own cells (no lock
on the event path); the cells of a thread that ended are folded and forgotten."""

import _thread
import math
import threading
import time

import pytest
from bson import Timestamp

pytest.importorskip("prometheus_client")

from flowwarden_django.integrations.prometheus import (
    DURATION_BUCKETS,
    FlowwardenCollector,
    SignalMetrics,
)
from flowwarden_django.streams import metrics

PER_EVENT = (
    "flowwarden_events_received",
    "flowwarden_events_processed",
    "flowwarden_event_duration_seconds",
)


def samples(signals: SignalMetrics) -> dict[tuple, float]:
    """The per-event metrics' samples as one collection sees them (``_created`` aside)."""
    found = {}
    for family in FlowwardenCollector(include_status=False, signals=signals).collect():
        if family.name not in PER_EVENT:
            continue
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def reference(events: list[tuple[str, str, object]]) -> dict[tuple, float]:
    """What per-event ``inc()``/``observe()`` calls would export for *events*:
    ("received", stream, None) or ("processed", stream, (success, duration))."""
    direct = SignalMetrics()
    for kind, stream, detail in events:
        if kind == "received":
            direct.events_received.labels(stream).inc()
        else:
            success, duration = detail
            direct.events_processed.labels(stream, "true" if success else "false").inc()
            direct.event_duration.labels(stream).observe(duration)
    found = {}
    for metric in (direct.events_received, direct.events_processed, direct.event_duration):
        for family in metric.collect():
            for sample in family.samples:
                if not sample.name.endswith("_created"):
                    found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def feed(signals: SignalMetrics, events) -> None:
    for kind, stream, detail in events:
        if kind == "received":
            signals.on_event_received(stream, cluster_time=Timestamp(1_700_000_000, 1))
        else:
            success, duration = detail
            signals.on_event_processed(stream, duration=duration, success=success)


def same(got: dict, expected: dict) -> bool:
    if got.keys() != expected.keys():
        return False
    return all(math.isclose(got[key], expected[key], rel_tol=1e-12, abs_tol=1e-12) for key in got)


EDGES = [*DURATION_BUCKETS[:-1], 0.0, 0.0051, 3.0, 11.0, 1e9]


def test_a_collection_sees_what_per_event_updates_would_show():
    events = [("received", "a", None)] * 3 + [("received", "b", None)]
    events += [("processed", "a", (True, duration)) for duration in EDGES]
    events += [("processed", "a", (False, 0.2)), ("processed", "b", (None, 0.01))]
    signals = SignalMetrics()
    feed(signals, events)
    assert same(samples(signals), reference(events))


def test_each_collection_adds_only_what_came_since_the_last():
    signals = SignalMetrics()
    first = [("received", "a", None), ("processed", "a", (True, 0.003))]
    feed(signals, first)
    assert same(samples(signals), reference(first))
    assert same(samples(signals), reference(first))  # nothing new: nothing added
    second = [("received", "a", None), ("processed", "a", (False, 0.7))] * 2
    feed(signals, second)
    assert same(samples(signals), reference(first + second))


def test_series_start_with_their_first_event():
    signals = SignalMetrics()
    # An initial sync sends event_processed alone: no received series for it.
    feed(signals, [("processed", "copy", (True, 0.001))])
    names = {name for name, _ in samples(signals)}
    assert "flowwarden_events_received_total" not in names
    labels = {dict(labels).get("success") for name, labels in samples(signals)}
    assert "false" not in labels  # no failure yet


def test_a_nan_duration_counts_in_the_sum_only_as_observe_does():
    events = [("processed", "a", (True, float("nan"))), ("processed", "a", (True, 0.5))]
    signals = SignalMetrics()
    feed(signals, events)
    got, expected = samples(signals), reference(events)
    assert got.keys() == expected.keys()
    for key in got:
        assert (math.isnan(got[key]) and math.isnan(expected[key])) or got[key] == expected[key]


def test_counts_are_exact_while_threads_count_and_a_scraper_collects():
    signals = SignalMetrics()
    per_thread, threads = 5000, 4
    done = threading.Event()

    def count():
        for _ in range(per_thread):
            signals.on_event_received("busy")
            signals.on_event_processed("busy", duration=0.001, success=True)

    def scrape():
        while not done.is_set():
            samples(signals)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    workers = [threading.Thread(target=count) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    done.set()
    scraper.join()
    got = samples(signals)
    total = per_thread * threads
    assert got[("flowwarden_events_received_total", (("stream", "busy"),))] == total
    assert got[
        ("flowwarden_events_processed_total", (("stream", "busy"), ("success", "true")))
    ] == (total)
    assert got[("flowwarden_event_duration_seconds_count", (("stream", "busy"),))] == total


def test_a_thread_that_ended_is_counted_once_and_its_cells_forgotten():
    signals = SignalMetrics()
    fast_received = signals.fast_received("short")
    fast_processed = signals.fast_processed("short")

    def count(events: int) -> None:
        for _ in range(events):
            fast_received(Timestamp(1_700_000_000, 1))
            fast_processed(True, 0.5)

    for events in (3, 4):
        worker = threading.Thread(target=count, args=(events,))
        worker.start()
        worker.join()
    tally = signals._tallies["short"]
    # The second thread's first count folded the first thread's cells (it had ended),
    # so a process nobody scrapes keeps no cells of its threads that come and go.
    assert len(tally._counts) == 1
    for _ in range(2):  # the second collection adds nothing: each event counts once
        got = samples(signals)
        assert got[("flowwarden_events_received_total", (("stream", "short"),))] == 7
        assert got[("flowwarden_event_duration_seconds_count", (("stream", "short"),))] == 7
        assert got[("flowwarden_event_duration_seconds_sum", (("stream", "short"),))] == 3.5
    assert tally._counts == {}


def test_a_thread_started_outside_threading_is_forgotten_once_it_ended():
    # threading's stand-in for such a thread (a _DummyThread) says it is alive forever.
    signals = SignalMetrics()
    fast_received = signals.fast_received("foreign")
    counted = threading.Event()

    def count() -> None:
        for _ in range(5):
            fast_received(Timestamp(1_700_000_000, 1))
        counted.set()

    _thread.start_new_thread(count, ())
    assert counted.wait(10)
    tally = signals._tallies["foreign"]
    deadline = time.monotonic() + 10
    while tally._counts and time.monotonic() < deadline:  # until the thread has ended
        samples(signals)
        time.sleep(0.01)
    assert tally._counts == {}
    got = samples(signals)
    assert got[("flowwarden_events_received_total", (("stream", "foreign"),))] == 5


def test_the_last_cluster_time_is_converted_when_read():
    signals = SignalMetrics()
    signals.on_event_received("a", cluster_time=Timestamp(1_700_000_000, 4))
    signals.on_event_received("a", cluster_time=None)  # keeps the last good one
    signals.on_event_received("a", cluster_time="not a time")
    assert signals.last_cluster_time == {"a": Timestamp(1_700_000_000, 4).as_datetime()}
    assert signals.last_cluster_time_of("a") == Timestamp(1_700_000_000, 4).as_datetime()
    assert signals.last_cluster_time_of("b") is None


def test_the_event_received_receiver_reads_only_the_cluster_time():
    signals = SignalMetrics()
    assert signals.on_event_received.flowwarden_reads == frozenset({"cluster_time"})
    assert not signals.on_event_received.flowwarden_reads & metrics.COSTLY_ARGUMENTS
