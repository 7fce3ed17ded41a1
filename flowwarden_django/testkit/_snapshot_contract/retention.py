"""The snapshot contract: retention (``prune``)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ...workflows.storage.snapshot import CheckpointQuery, Deleted, SnapshotEvent, WorkflowSnapshot
from ...workflows.storage.store import SnapshotStore
from .part import SnapshotContractPart


class RetentionContract(SnapshotContractPart):
    """``prune``: by count, by age and both, never the newest snapshot, the ancestors of
    a kept fork or a run waiting for approval, per coordination or all of them.
    """

    # -- prune -------------------------------------------------------------------------

    def test_prune_keep_last_trims_a_chain(
        self, store: SnapshotStore, cid: str, events: list[SnapshotEvent]
    ) -> None:
        saved = self.chain(store, cid, 5)
        events.clear()
        assert store.prune(keep_last=2, coordination_id=cid) == 3
        left = store.list(CheckpointQuery(coordination_id=cid))
        assert self.ids(left) == self.ids(saved[3:])
        assert sorted(e.snapshot_id for e in events) == sorted(self.ids(saved[:3]))
        assert all(isinstance(e, Deleted) for e in events)
        assert store.prune(keep_last=2, coordination_id=cid) == 0

    def test_prune_never_removes_the_newest(self, store: SnapshotStore, cid: str) -> None:
        # Everything is older than the cutoff, and the newest is also the oldest by time.
        now = datetime.now(UTC)
        saved = self.chain(store, cid, 3, start=now - timedelta(days=400))
        newest = store.save(
            WorkflowSnapshot(
                uuid.uuid4().hex,
                cid,
                9,
                parent_id=saved[-1].id,
                created_at=now - timedelta(days=500),
            )
        )
        assert store.prune(older_than=timedelta(0), coordination_id=cid) == 3
        assert self.ids(store.list(CheckpointQuery(coordination_id=cid))) == [newest.id]
        assert store.latest(cid).id == newest.id

    def test_prune_by_age_keeps_younger_snapshots(self, store: SnapshotStore, cid: str) -> None:
        now = datetime.now(UTC)
        old = self.chain(store, cid, 3, start=now - timedelta(days=30))
        young = store.save(old[-1].derive_with({"young": 1}, created_at=now - timedelta(hours=1)))
        newest = store.save(young.derive_with({"young": 2}, created_at=now))
        assert store.prune(older_than=timedelta(days=1), coordination_id=cid) == 3
        left = self.ids(store.list(CheckpointQuery(coordination_id=cid)))
        assert left == [young.id, newest.id]

    def test_prune_with_both_rules_keeps_what_either_keeps(
        self, store: SnapshotStore, cid: str
    ) -> None:
        now = datetime.now(UTC)
        old = self.chain(store, cid, 4, start=now - timedelta(days=30))
        young = self.chain(store, f"{cid}-y", 4, start=now - timedelta(minutes=5))
        for coordination in (cid, f"{cid}-y"):
            store.prune(keep_last=2, older_than=timedelta(days=1), coordination_id=coordination)
        assert self.ids(store.list(CheckpointQuery(coordination_id=cid))) == self.ids(old[2:])
        left_young = store.list(CheckpointQuery(coordination_id=f"{cid}-y"))
        assert self.ids(left_young) == self.ids(young)

    def test_prune_keeps_the_ancestors_of_a_kept_fork(self, store: SnapshotStore, cid: str) -> None:
        s = self.chain(store, cid, 5)
        # A branch off s[1]: a kept fork keeps its line back to the root.
        fork = store.fork(s[1].id, {"branch": True})
        assert store.prune(keep_last=1, coordination_id=cid) == 3
        left = self.ids(store.list(CheckpointQuery(coordination_id=cid)))
        assert left == [s[0].id, s[1].id, fork.id]
        assert store.prune(keep_last=1, coordination_id=cid) == 0, "pruning again removes nothing"

    def test_prune_keeps_a_kept_branch_and_trims_the_rest(
        self, store: SnapshotStore, cid: str
    ) -> None:
        s = self.chain(store, cid, 4)
        branch = store.fork(s[1].id, {"branch": 1})
        tip = store.save(branch.derive_with({"branch": 2}))
        after = store.save(tip.derive_with({"branch": 3}))
        # Keep 3: after, tip, branch (a fork) -> branch's ancestors s[1], s[0] stay too.
        assert store.prune(keep_last=3, coordination_id=cid) == 2
        left = self.ids(store.list(CheckpointQuery(coordination_id=cid)))
        assert left == [s[0].id, s[1].id, branch.id, tip.id, after.id]
        # Keep 1: the branch point is no longer kept, so neither are its ancestors.
        assert store.prune(keep_last=1, coordination_id=cid) == 4
        assert self.ids(store.list(CheckpointQuery(coordination_id=cid))) == [after.id]

    def test_prune_keeps_a_snapshot_waiting_for_approval(
        self, store: SnapshotStore, cid: str
    ) -> None:
        s = self.chain(store, cid, 4)
        extra = self.mark_waiting(store, s[1])
        assert store.prune(keep_last=1, coordination_id=cid, **extra) == 2
        left = self.ids(store.list(CheckpointQuery(coordination_id=cid)))
        assert left == [s[1].id, s[3].id]

    def test_prune_is_limited_to_its_coordination(self, store: SnapshotStore, cid: str) -> None:
        self.chain(store, cid, 3)
        other = self.chain(store, f"{cid}-other", 3)
        assert store.prune(keep_last=1, coordination_id=cid) == 2
        assert len(store.list(CheckpointQuery(coordination_id=f"{cid}-other"))) == len(other)

    def test_prune_of_every_coordination(self, store: SnapshotStore, cid: str) -> None:
        a = self.chain(store, cid, 3)
        b = self.chain(store, f"{cid}-b", 2)
        store.prune(keep_last=1)
        assert self.ids(store.list(CheckpointQuery(coordination_id=cid))) == [a[-1].id]
        assert self.ids(store.list(CheckpointQuery(coordination_id=f"{cid}-b"))) == [b[-1].id]

    @pytest.mark.parametrize(
        "arguments",
        [{}, {"keep_last": 0}, {"keep_last": -1}, {"older_than": timedelta(seconds=-1)}],
        ids=["no-rule", "keep-0", "keep-negative", "negative-age"],
    )
    def test_prune_rejects_bad_rules(self, store: SnapshotStore, arguments: dict[str, Any]) -> None:
        with pytest.raises(ValueError):
            store.prune(**arguments)
