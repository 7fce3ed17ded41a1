"""The snapshot contract: listing and ``latest``."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from ...workflows.storage.snapshot import CheckpointQuery, WorkflowSnapshot
from ...workflows.storage.store import SnapshotStore
from .part import SnapshotContractPart
from .values import BASE


class ListingContract(SnapshotContractPart):
    """Listing: filters, both orders, limits, keyset paging (also while rows are
    appended), and ``latest`` by ``seq`` whatever the clock says.
    """

    # -- list --------------------------------------------------------------------------

    def test_list_filters_by_coordination_and_agent(self, store: SnapshotStore, cid: str) -> None:
        other = f"{cid}-other"
        a = store.save(WorkflowSnapshot.root(cid, 1, agent_name="a"))
        b = store.save(WorkflowSnapshot.root(cid, 2, agent_name="b"))
        c = store.save(WorkflowSnapshot.root(other, 3, agent_name="a"))
        assert self.ids(store.list(CheckpointQuery(coordination_id=cid))) == [a.id, b.id]
        by_agent = store.list(CheckpointQuery(coordination_id=cid, agent_name="a"))
        assert self.ids(by_agent) == [a.id]
        everything = {s.id for s in store.list()}
        assert {a.id, b.id, c.id} <= everything
        assert store.list(CheckpointQuery(coordination_id=f"{cid}-none")) == []

    def test_since_and_until_are_inclusive(self, store: SnapshotStore, cid: str) -> None:
        s = self.chain(store, cid, 5)
        query = CheckpointQuery(coordination_id=cid, since=s[1].created_at, until=s[3].created_at)
        assert self.ids(store.list(query)) == self.ids(s[1:4])
        agent_query = CheckpointQuery(since=s[4].created_at, agent_name=None, coordination_id=cid)
        assert self.ids(store.list(agent_query)) == [s[4].id]

    def test_list_orders_a_coordination_by_seq_in_both_directions(
        self, store: SnapshotStore, cid: str
    ) -> None:
        # The clock goes backwards: the order is still the save order.
        s = self.chain(store, cid, 4, start=BASE)
        late = store.save(
            WorkflowSnapshot(uuid.uuid4().hex, cid, 4, created_at=BASE - timedelta(days=1))
        )
        expected = [*self.ids(s), late.id]
        assert self.ids(store.list(CheckpointQuery(coordination_id=cid))) == expected
        newest = store.list(CheckpointQuery(coordination_id=cid, newest_first=True))
        assert self.ids(newest) == expected[::-1]

    def test_limit_returns_the_oldest_or_the_newest(self, store: SnapshotStore, cid: str) -> None:
        s = self.chain(store, cid, 5)
        oldest = store.list(CheckpointQuery(coordination_id=cid, limit=2))
        assert self.ids(oldest) == self.ids(s[:2])
        newest = store.list(CheckpointQuery(coordination_id=cid, limit=2, newest_first=True))
        assert self.ids(newest) == [s[4].id, s[3].id]

    def test_list_across_coordinations_orders_by_created_at(
        self, store: SnapshotStore, cid: str
    ) -> None:
        agent = f"agent-{cid}"

        def save(coordination: str, number: int, seconds: int) -> WorkflowSnapshot:
            at = BASE + timedelta(seconds=seconds)
            where = f"{cid}-{coordination}"
            return store.save(
                WorkflowSnapshot(uuid.uuid4().hex, where, number, agent_name=agent, created_at=at)
            )

        first, second = save("b", 1, 0), save("a", 2, 1)
        # Same created_at: coordination id, then seq, break the tie.
        tie_a1, tie_a2, tie_b = save("a", 3, 2), save("a", 4, 2), save("b", 5, 2)
        expected = [first.id, second.id, tie_a1.id, tie_a2.id, tie_b.id]
        assert self.ids(store.list(CheckpointQuery(agent_name=agent))) == expected
        newest = store.list(CheckpointQuery(agent_name=agent, newest_first=True, limit=3))
        assert self.ids(newest) == expected[::-1][:3]

    @pytest.mark.parametrize("newest_first", [False, True], ids=["oldest-first", "newest-first"])
    def test_list_keeps_only_the_given_coordinations(
        self, store: SnapshotStore, cid: str, newest_first: bool
    ) -> None:
        agent = f"agent-{cid}"
        kept = self.chain(store, f"{cid}-a", 4, agent_name=agent)
        kept += self.chain(
            store, f"{cid}-c", 3, start=BASE + timedelta(seconds=1), agent_name=agent
        )
        self.chain(store, f"{cid}-b", 5, agent_name=agent)
        wanted = frozenset({f"{cid}-a", f"{cid}-c", f"{cid}-missing"})
        query = CheckpointQuery(
            agent_name=agent, coordination_ids=wanted, limit=2, newest_first=newest_first
        )
        expected = sorted(kept, key=query.sort_key, reverse=newest_first)
        visited: list[str] = []
        next_query: CheckpointQuery | None = query
        while next_query is not None:
            page = store.list(next_query)
            visited += [s.id for s in page]
            next_query = next_query.next_page(page)
        assert visited == self.ids(expected)
        assert store.list(CheckpointQuery(agent_name=agent, coordination_ids=frozenset())) == []
        with pytest.raises(ValueError):
            store.list(CheckpointQuery(coordination_ids=f"{cid}-a"))  # type: ignore[arg-type]

    def test_list_without_states_gives_the_same_rows(self, store: SnapshotStore, cid: str) -> None:
        saved = self.chain(store, cid, 4)
        full = store.list(CheckpointQuery(coordination_id=cid, newest_first=True))
        bare = store.list(CheckpointQuery(coordination_id=cid, newest_first=True, with_state=False))
        assert self.ids(bare) == self.ids(full) == self.ids(saved[::-1])
        assert all(s.state is None for s in bare)
        assert [(s.seq, s.parent_id, s.created_at) for s in bare] == [
            (s.seq, s.parent_id, s.created_at) for s in full
        ]

    @pytest.mark.parametrize("newest_first", [False, True], ids=["oldest-first", "newest-first"])
    @pytest.mark.parametrize("by", ["coordination", "agent"])
    def test_keyset_paging_visits_every_row_once(
        self, store: SnapshotStore, cid: str, newest_first: bool, by: str
    ) -> None:
        agent = f"agent-{cid}"
        saved = self.chain(store, cid, 7, agent_name=agent)
        # Two rows share a created_at with rows of another coordination.
        saved += self.chain(
            store, f"{cid}-z", 3, start=BASE + timedelta(seconds=2), agent_name=agent
        )
        if by == "coordination":
            query = CheckpointQuery(coordination_id=cid, limit=3, newest_first=newest_first)
            expected = [s for s in saved if s.coordination_id == cid]
        else:
            query = CheckpointQuery(agent_name=agent, limit=3, newest_first=newest_first)
            expected = saved
        expected = sorted(expected, key=query.sort_key, reverse=newest_first)
        pages = []
        next_query: CheckpointQuery | None = query
        while next_query is not None:
            page = store.list(next_query)
            pages.append(page)
            next_query = next_query.next_page(page)
        visited = [s.id for page in pages for s in page]
        assert visited == self.ids(expected)

    def test_keyset_paging_while_rows_are_appended(self, store: SnapshotStore, cid: str) -> None:
        initial = self.chain(store, cid, 20, start=datetime.now(UTC) - timedelta(minutes=1))
        appended: list[str] = []

        def append() -> None:
            for index in range(20):
                appended.append(store.save(WorkflowSnapshot.root(cid, {"late": index})).id)

        visited: list[str] = []

        def page_through() -> None:
            query: CheckpointQuery | None = CheckpointQuery(coordination_id=cid, limit=3)
            while query is not None:
                page = store.list(query)
                visited.extend(s.id for s in page)
                query = query.next_page(page)

        self.run_threads(append, page_through)
        assert len(visited) == len(set(visited)), "a row was visited twice"
        assert visited[: len(initial)] == self.ids(initial), "a row was skipped or reordered"
        assert set(visited) <= set(self.ids(initial)) | set(appended)

    # -- latest ------------------------------------------------------------------------

    def test_latest_is_the_highest_seq_when_the_clock_goes_back(
        self, store: SnapshotStore, cid: str
    ) -> None:
        first = store.save(WorkflowSnapshot(uuid.uuid4().hex, cid, 1, created_at=BASE))
        second = store.save(
            WorkflowSnapshot(uuid.uuid4().hex, cid, 2, created_at=BASE - timedelta(hours=1))
        )
        assert second.seq == first.seq + 1
        assert store.latest(cid).id == second.id

    def test_latest_when_created_at_ties(self, store: SnapshotStore, cid: str) -> None:
        saved = [
            store.save(WorkflowSnapshot(f"{cid}-{tag}", cid, tag, created_at=BASE))
            for tag in ("c", "a", "b")
        ]
        assert store.latest(cid).id == saved[-1].id

    def test_latest_of_unknown_coordination_is_none(self, store: SnapshotStore, cid: str) -> None:
        assert store.latest(cid) is None
