"""The journal bridge: events recorded as one parent-linked chain per coordination."""

import itertools
import threading

import pytest

from flowwarden_django.workflows.backends.memory import InMemorySnapshotStore
from flowwarden_django.workflows.operations.journal import (
    CheckpointingJournal,
    JournalEvent,
    event_summary,
    on_kinds,
)
from flowwarden_django.workflows.storage.snapshot import CheckpointQuery


class ListJournal:
    """The decorated journal: keeps every event it is given."""

    def __init__(self):
        self.events = []

    def record(self, event):
        self.events.append(event)


def chain(store, coordination_id):
    """The coordination's snapshots, each checked to link to the one before it."""
    snapshots = store.list(CheckpointQuery.for_coordination(coordination_id))
    for previous, current in itertools.pairwise(snapshots):
        assert current.parent_id == previous.id
    assert snapshots[0].is_root
    return snapshots


def test_events_become_a_chain_per_coordination():
    store, delegate = InMemorySnapshotStore(), ListJournal()
    journal = CheckpointingJournal(store, delegate=delegate)
    for kind in ("started", "dispatched", "completed"):
        journal.record(JournalEvent("a", kind, agent_name="intake", data={"kind": kind}))
    journal.record(JournalEvent("b", "started"))
    snapshots = chain(store, "a")
    assert [s.state for s in snapshots] == [
        {"kind": k} for k in ("started", "dispatched", "completed")
    ]
    assert [s.metadata["journal.kind"] for s in snapshots][-1] == "completed"
    assert journal.last_snapshot("a") == snapshots[-1].id
    assert len(chain(store, "b")) == 1 and len(delegate.events) == 4


def test_filter_and_extractor():
    store = InMemorySnapshotStore()
    journal = CheckpointingJournal(
        store, snapshot_filter=on_kinds("completed", "failed"), extractor=event_summary
    )
    assert journal.record(JournalEvent("a", "started", agent_name="x")) is None
    saved = journal.record(JournalEvent("a", "completed", agent_name="x"))
    assert saved.state == "COMPLETED x" and saved.agent_name == "x"


def test_after_a_restart_it_reattaches_to_the_newest_snapshot():
    store = InMemorySnapshotStore()
    first = CheckpointingJournal(store)
    for kind in ("one", "two", "three"):
        first.record(JournalEvent("a", kind))
    restarted = CheckpointingJournal(store)  # a new process: an empty cache
    restarted.record(JournalEvent("a", "four"))
    snapshots = chain(store, "a")
    assert [s.metadata["journal.kind"] for s in snapshots] == ["one", "two", "three", "four"]


def test_a_store_failure_is_logged_and_the_delegate_still_gets_the_event(caplog):
    class Broken(InMemorySnapshotStore):
        def save(self, snapshot):
            raise ConnectionError("store down")

    delegate = ListJournal()
    journal = CheckpointingJournal(Broken(), delegate=delegate)
    assert journal.record(JournalEvent("a", "started")) is None
    assert len(delegate.events) == 1
    assert "recording started" in caplog.text


@pytest.mark.parametrize("threads", [8])
def test_threads_recording_one_coordination_make_one_chain(threads):
    store = InMemorySnapshotStore()
    journal = CheckpointingJournal(store)
    gate = threading.Barrier(threads)

    def record(n):
        gate.wait()
        for i in range(20):
            journal.record(JournalEvent("a", f"t{n}-{i}"))

    workers = [threading.Thread(target=record, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(chain(store, "a")) == threads * 20
