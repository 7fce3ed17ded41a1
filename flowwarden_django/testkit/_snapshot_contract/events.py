"""The snapshot contract: deletes, listeners and Django signals."""

from __future__ import annotations

from typing import Any

from ...workflows.storage import signals
from ...workflows.storage.snapshot import (
    CheckpointQuery,
    Deleted,
    Saved,
    SnapshotEvent,
    WorkflowSnapshot,
)
from ...workflows.storage.store import SnapshotStore
from .part import SnapshotContractPart


class DeleteAndEventContract(SnapshotContractPart):
    """Deletes and their events, and listeners and Django signals (failing ones are
    swallowed, removed ones are not called).
    """

    # -- delete ------------------------------------------------------------------------

    def test_delete_returns_whether_it_removed(
        self, store: SnapshotStore, cid: str, events: list[SnapshotEvent]
    ) -> None:
        stored = store.save(WorkflowSnapshot.root(cid, 1))
        events.clear()
        assert store.delete(stored.id) is True
        assert store.load(stored.id) is None
        assert [(type(e), e.snapshot_id, e.coordination_id) for e in events] == [
            (Deleted, stored.id, cid)
        ]
        events.clear()
        assert store.delete(stored.id) is False
        assert events == []

    def test_delete_coordination_emits_deleted_per_snapshot(
        self, store: SnapshotStore, cid: str, events: list[SnapshotEvent]
    ) -> None:
        saved = self.chain(store, cid, 3)
        survivor = store.save(WorkflowSnapshot.root(f"{cid}-other", 1))
        events.clear()
        assert store.delete_coordination(cid) == 3
        assert store.list(CheckpointQuery(coordination_id=cid)) == []
        assert store.latest(cid) is None
        assert all(isinstance(e, Deleted) and e.coordination_id == cid for e in events)
        assert sorted(e.snapshot_id for e in events) == sorted(self.ids(saved))
        assert store.load(survivor.id) is not None
        events.clear()
        assert store.delete_coordination(cid) == 0
        assert events == []

    def test_seqs_continue_after_a_delete(self, store: SnapshotStore, cid: str) -> None:
        saved = self.chain(store, cid, 3)
        store.delete(saved[0].id)
        assert store.save(WorkflowSnapshot.root(cid, 4)).seq == 4

    # -- listeners and signals ---------------------------------------------------------

    def test_failing_listeners_and_receivers_are_swallowed(
        self, store: SnapshotStore, cid: str
    ) -> None:
        seen: list[SnapshotEvent] = []
        received: list[SnapshotEvent] = []

        def broken(event: SnapshotEvent) -> None:
            raise RuntimeError("listener bug")

        def receiver(sender: Any, event: SnapshotEvent, **kwargs: Any) -> None:
            if event.coordination_id == cid:
                received.append(event)

        def broken_receiver(sender: Any, event: SnapshotEvent, **kwargs: Any) -> None:
            raise RuntimeError("receiver bug")

        store.add_listener(broken)
        store.add_listener(seen.append)
        signals.snapshot_saved.connect(broken_receiver, weak=False)
        signals.snapshot_saved.connect(receiver, weak=False)
        signals.snapshot_deleted.connect(receiver, weak=False)
        try:
            stored = store.save(WorkflowSnapshot.root(cid, 1))
            assert store.delete(stored.id)
        finally:
            for signal in (signals.snapshot_saved, signals.snapshot_deleted):
                signal.disconnect(receiver)
            signals.snapshot_saved.disconnect(broken_receiver)
            store.remove_listener(broken)
            store.remove_listener(seen.append)
        assert [type(e) for e in seen] == [Saved, Deleted]
        assert [type(e) for e in received] == [Saved, Deleted]

    def test_removed_listener_is_not_called(self, store: SnapshotStore, cid: str) -> None:
        seen: list[SnapshotEvent] = []
        store.add_listener(seen.append)
        store.remove_listener(seen.append)
        store.remove_listener(seen.append)  # removing twice is harmless
        store.save(WorkflowSnapshot.root(cid, 1))
        assert seen == []
