"""The snapshot contract: save, load, state round trips and fork."""

from __future__ import annotations

import uuid
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from ...workflows.storage.snapshot import (
    CheckpointQuery,
    Forked,
    Loaded,
    Saved,
    SnapshotEvent,
    WorkflowSnapshot,
)
from ...workflows.storage.store import SnapshotStore, UnknownSnapshotError
from .part import SnapshotContractPart
from .values import BASE, ContractLine, ContractOrder


class SavingContract(SnapshotContractPart):
    """Saving and loading: ``seq`` assignment, replacing, events, metadata, state round
    trips (plain, typed, registered dataclasses) and forks.
    """

    # -- save / load -------------------------------------------------------------------

    def test_save_assigns_seq_and_load_round_trips(self, store: SnapshotStore, cid: str) -> None:
        snapshot = WorkflowSnapshot(
            id=uuid.uuid4().hex,
            coordination_id=cid,
            state={"a": 1},
            agent_name="planner",
            metadata={"workflow.name": "orders", "note": "é ✓"},
            created_at=BASE,
        )
        stored = store.save(snapshot)
        assert stored.seq == 1
        assert stored == snapshot.replace(seq=1)
        loaded = store.load(snapshot.id)
        assert loaded == stored
        assert loaded.is_root

    def test_seqs_follow_save_order(self, store: SnapshotStore, cid: str) -> None:
        saved = self.chain(store, cid, 4)
        assert [s.seq for s in saved] == [1, 2, 3, 4]

    def test_same_id_replaces_and_keeps_seq(self, store: SnapshotStore, cid: str) -> None:
        first, second = self.chain(store, cid, 2)
        replaced = store.save(first.replace(state={"step": "again"}, seq=None))
        assert replaced.seq == first.seq
        assert store.load(first.id).state == {"step": "again"}
        listed = store.list(CheckpointQuery(coordination_id=cid))
        assert self.ids(listed) == [first.id, second.id]
        assert store.latest(cid).id == second.id

    def test_saving_an_id_into_another_coordination_moves_it(
        self, store: SnapshotStore, cid: str
    ) -> None:
        first, second = self.chain(store, cid, 2)
        moved = store.save(first.replace(coordination_id=f"{cid}-new", seq=None))
        assert moved.seq == 1
        assert self.ids(store.list(CheckpointQuery(coordination_id=cid))) == [second.id]
        assert store.latest(f"{cid}-new") == moved
        assert store.load(first.id).coordination_id == f"{cid}-new"

    def test_load_missing_returns_none_without_event(
        self, store: SnapshotStore, events: list[SnapshotEvent]
    ) -> None:
        assert store.load(uuid.uuid4().hex) is None
        assert events == []

    def test_save_and_load_emit_events(
        self, store: SnapshotStore, cid: str, events: list[SnapshotEvent]
    ) -> None:
        stored = store.save(WorkflowSnapshot.root(cid, {"x": 1}))
        store.load(stored.id)
        assert [(type(e), e.snapshot_id, e.coordination_id) for e in events] == [
            (Saved, stored.id, cid),
            (Loaded, stored.id, cid),
        ]

    def test_saved_is_emitted_after_the_write(self, store: SnapshotStore, cid: str) -> None:
        seen: list[WorkflowSnapshot | None] = []
        store.add_listener(lambda event: seen.append(store.latest(event.coordination_id)))
        stored = store.save(WorkflowSnapshot.root(cid, {"x": 1}))
        assert seen == [stored]

    def test_metadata_maps_strings_to_strings(self, store: SnapshotStore, cid: str) -> None:
        with pytest.raises(TypeError):
            WorkflowSnapshot.root(cid, metadata={"retries": 3})  # type: ignore[dict-item]
        with pytest.raises(TypeError):
            WorkflowSnapshot.root(cid, metadata={1: "one"})  # type: ignore[dict-item]
        stored = store.save(WorkflowSnapshot.root(cid, metadata={"": "", "k": "v\n\"'"}))
        loaded = store.load(stored.id)
        assert loaded.metadata == {"": "", "k": "v\n\"'"}
        loaded.metadata["k"] = "changed"
        assert store.load(stored.id).metadata["k"] == "v\n\"'", "a loaded copy is not the store"

    # -- state round trips -------------------------------------------------------------

    def test_nested_plain_state_round_trips(self, store: SnapshotStore, cid: str) -> None:
        state = {
            "list": [1, 2.5, "three", None, True, {"deep": [[], {}]}],
            "unicode": "zürich ✓ 東京",
            "empty": {},
            "big": 2**62,
        }
        stored = store.save(WorkflowSnapshot.root(cid, state))
        assert store.load(stored.id).state == state

    def test_typed_values_round_trip(self, store: SnapshotStore, cid: str) -> None:
        paris = timezone(timedelta(hours=2))
        state = {
            "at": datetime(2031, 1, 2, 3, 4, 5, 678901, tzinfo=paris),
            "day": date(2031, 2, 28),
            "amount": Decimal("1234.5600"),
            "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
            "pair": (1, "two"),
        }
        loaded = store.load(store.save(WorkflowSnapshot.root(cid, state)).id).state
        assert loaded == state
        assert loaded["at"].utcoffset() == timedelta(hours=2)
        assert str(loaded["amount"]) == "1234.5600"
        assert isinstance(loaded["pair"], tuple)

    def test_registered_dataclass_round_trips(self, store: SnapshotStore, cid: str) -> None:
        order = ContractOrder(
            number="A-1",
            total=Decimal("10.50"),
            placed_at=BASE,
            lines=[ContractLine("sku-1", 2), ContractLine("sku-2", 1)],
            tags=("rush",),
        )
        loaded = store.load(store.save(WorkflowSnapshot.root(cid, order)).id).state
        assert loaded == order
        assert type(loaded) is ContractOrder
        assert type(loaded.lines[0]) is ContractLine

    def test_none_state_round_trips(self, store: SnapshotStore, cid: str) -> None:
        stored = store.save(WorkflowSnapshot.root(cid, None))
        assert store.load(stored.id).state is None

    # -- fork --------------------------------------------------------------------------

    def test_fork_links_to_its_source_and_copies_it(
        self, store: SnapshotStore, cid: str, events: list[SnapshotEvent]
    ) -> None:
        source = store.save(
            WorkflowSnapshot.root(cid, {"v": 1}, agent_name="reviewer", metadata={"k": "v"})
        )
        events.clear()
        child = store.fork(source.id, {"v": 2})
        assert child.id != source.id
        assert child.parent_id == source.id
        assert (child.coordination_id, child.agent_name, child.metadata) == (
            cid,
            "reviewer",
            {"k": "v"},
        )
        assert child.state == {"v": 2}
        assert child.seq == 2
        assert store.load(child.id) == child
        assert store.load(source.id).state == {"v": 1}, "the source is unchanged"
        kinds = [(type(e), e.snapshot_id) for e in events[:2]]
        assert kinds == [(Saved, child.id), (Forked, child.id)]
        assert events[1].source_id == source.id

    def test_fork_of_unknown_source_raises(
        self, store: SnapshotStore, events: list[SnapshotEvent]
    ) -> None:
        missing = uuid.uuid4().hex
        with pytest.raises(UnknownSnapshotError, match=missing):
            store.fork(missing, {"v": 1})
        assert issubclass(UnknownSnapshotError, ValueError)
        assert events == []
