"""Replay, acknowledge and discard through ``flowwarden_django.streams.operations.replay``, on
the in-memory DLQ store: concurrency and the edges of the status machine."""

import threading

import pytest
from django.utils import timezone

from flowwarden_django.streams import register_stream, stream_registry
from flowwarden_django.streams.dlq import DeadLetter, DlqPolicy, ErrorInfo
from flowwarden_django.streams.operations.replay import (
    acknowledge_dead_letter,
    discard_dead_letter,
    replay_dead_letter,
    replay_dead_letters,
    replay_stream,
)
from flowwarden_django.streams.stores import dlq_stores


@pytest.fixture
def store(settings):
    settings.FLOWWARDEN = {
        **settings.FLOWWARDEN,
        "DLQ_STORES": {
            "default": {"BACKEND": "flowwarden_django.streams.backends.memory.InMemoryDlqStore"}
        },
    }
    return dlq_stores["default"]


@pytest.fixture
def handled():
    calls = []
    register_stream("replayed", "orders", on_insert=lambda doc: calls.append(doc["n"]))
    yield calls
    stream_registry.unregister("replayed")


def park(store, n, *, minutes_ago=0):
    at = timezone.now() - timezone.timedelta(minutes=minutes_ago)
    entry = DeadLetter(
        id=f"e{n}",
        stream_name="replayed",
        operation_type="insert",
        error=ErrorInfo("RuntimeError", "boom"),
        attempts=1,
        created_at=at,
        first_attempt_at=at,
        last_attempt_at=at,
        document_key={"_id": n},
        full_document={"_id": n, "n": n},
        resume_token={"_data": f"{n:04d}"},
    )
    store.save(entry, DlqPolicy())
    return entry


def test_two_operators_replaying_one_entry_run_it_once(store, handled):
    park(store, 1)
    gate = threading.Barrier(8)
    outcomes = []

    def operator():
        gate.wait()
        outcomes.append(replay_dead_letter("e1", by="op"))

    threads = [threading.Thread(target=operator) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert handled == [1]
    assert sum(o.succeeded for o in outcomes) == 1


def test_a_replay_whose_entry_was_settled_meanwhile_reports_the_conflict(store):
    park(store, 1)

    def handler(doc):
        # Another operator discards the entry while this replay runs.
        assert discard_dead_letter("e1", by="other")

    register_stream("replayed", "orders", on_insert=handler)
    try:
        outcome = replay_dead_letter("e1", by="op")
    finally:
        stream_registry.unregister("replayed")
    assert not outcome.succeeded and outcome.status == "DISCARDED"
    assert store.find_by_id("e1").resolved_by == "other"


def test_a_stuck_replaying_entry_can_still_be_acknowledged(store):
    park(store, 1)
    assert store.transition("e1", "REPLAYING", at=timezone.now())  # its replay died
    assert not replay_dead_letter("e1").succeeded
    assert acknowledge_dead_letter("e1", by="op", note="handled by hand")
    entry = store.find_by_id("e1")
    assert (entry.status, entry.resolved_by, entry.note) == (
        "ACKNOWLEDGED",
        "op",
        "handled by hand",
    )


def test_replay_stream_runs_pending_entries_oldest_first(store, handled):
    park(store, 1, minutes_ago=3)
    park(store, 2, minutes_ago=2)
    park(store, 3, minutes_ago=1)
    acknowledge_dead_letter("e2")
    outcomes = replay_stream("replayed", by="op")
    assert handled == [1, 3] and [o.entry_id for o in outcomes] == ["e1", "e3"]
    assert replay_dead_letters(["e1", "missing"])[1].error == "no such dead letter"
