"""The snapshot contract: ``seq`` under concurrent writers and explicit ``seq`` values."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import pytest

from ...workflows.storage.snapshot import CheckpointQuery, Saved, SnapshotEvent, WorkflowSnapshot
from ...workflows.storage.store import SnapshotConflictError, SnapshotStore
from .part import SnapshotContractPart


class SequenceContract(SnapshotContractPart):
    """``seq`` under real concurrent writers, explicit ``seq`` values and their
    conflicts, two runners at one ``seq``.
    """

    # -- seq under concurrency and explicit seqs ---------------------------------------

    def test_concurrent_saves_get_distinct_seqs(self, store: SnapshotStore, cid: str) -> None:
        saved: list[WorkflowSnapshot] = []
        lock = threading.Lock()

        def writer(number: int) -> Callable[[], None]:
            def run() -> None:
                for index in range(self.race_saves):
                    stored = store.save(WorkflowSnapshot.root(cid, {"w": number, "i": index}))
                    with lock:
                        saved.append(stored)

            return run

        self.run_threads(*(writer(n) for n in range(self.race_threads)))
        total = self.race_threads * self.race_saves
        assert sorted(s.seq for s in saved) == list(range(1, total + 1))
        listed = store.list(CheckpointQuery(coordination_id=cid))
        assert [s.seq for s in listed] == list(range(1, total + 1))
        assert {s.id for s in listed} == {s.id for s in saved}

    def test_explicit_seq_is_kept(self, store: SnapshotStore, cid: str) -> None:
        stored = store.save(WorkflowSnapshot(uuid.uuid4().hex, cid, 1, seq=10))
        assert stored.seq == 10
        assert store.load(stored.id).seq == 10
        assert store.save(WorkflowSnapshot.root(cid, 2)).seq == 11

    def test_explicit_seq_taken_by_another_snapshot_conflicts(
        self, store: SnapshotStore, cid: str, events: list[SnapshotEvent]
    ) -> None:
        first = store.save(WorkflowSnapshot.root(cid, 1))
        events.clear()
        intruder = WorkflowSnapshot(uuid.uuid4().hex, cid, 2, seq=first.seq)
        with pytest.raises(SnapshotConflictError):
            store.save(intruder)
        assert store.load(intruder.id) is None
        assert [e for e in events if isinstance(e, Saved)] == []
        # The same seq in another coordination is fine.
        assert store.save(intruder.replace(coordination_id=f"{cid}-2")).seq == first.seq

    def test_two_runners_at_one_seq_one_wins(self, store: SnapshotStore, cid: str) -> None:
        head = store.save(WorkflowSnapshot.root(cid, 0))
        outcomes: list[str] = []
        lock = threading.Lock()

        def runner(name: str) -> Callable[[], None]:
            def run() -> None:
                step = head.derive_with({"by": name}, seq=head.seq + 1)
                try:
                    store.save(step)
                    result = "saved"
                except SnapshotConflictError:
                    result = "conflict"
                with lock:
                    outcomes.append(result)

            return run

        self.run_threads(runner("a"), runner("b"))
        assert sorted(outcomes) == ["conflict", "saved"]
        assert len(store.list(CheckpointQuery(coordination_id=cid))) == 2
