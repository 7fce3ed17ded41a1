"""The ``SnapshotStore`` contract: what every workflow snapshot store must do.

Covers save/load/replace, fork, listing (filters, both orders, limits, keyset
paging while rows are added), ``latest`` by ``seq`` whatever the clock says, ``seq``
assignment under real concurrent writers, explicit-``seq`` conflicts, deletes and
their events, listeners and Django signals, state round trips, retention (``prune``)
and, for stores that encrypt, failing closed without the right key.

Subclass :class:`SnapshotStoreContract` with a name pytest collects and implement
:meth:`~SnapshotStoreContract.make_store`; override the optional hooks to enable
the waiting-run and encryption tests.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from ..workflows.storage import signals
from ..workflows.storage.serializers import workflow_state
from ..workflows.storage.snapshot import (
    CheckpointQuery,
    Deleted,
    Forked,
    Loaded,
    Saved,
    SnapshotEvent,
    UnreadableSnapshot,
    WorkflowSnapshot,
)
from ..workflows.storage.store import SnapshotConflictError, SnapshotStore, UnknownSnapshotError
from ._async_driven import async_driven


@workflow_state
@dataclass(frozen=True)
class ContractLine:
    """A registered dataclass nested in :class:`ContractOrder` (state round trips)."""

    sku: str
    quantity: int


@workflow_state
@dataclass
class ContractOrder:
    """A registered dataclass the contract stores as state."""

    number: str
    total: Decimal
    placed_at: datetime
    lines: list[ContractLine] = field(default_factory=list)
    tags: tuple[str, ...] = ()


#: A fixed, timezone-aware base time for snapshots whose created_at matters.
BASE = datetime(2031, 5, 17, 9, 30, tzinfo=UTC)


class SnapshotStoreContract:
    """Behaviour every ``SnapshotStore`` must have.

    Required: :meth:`make_store`. Optional: :meth:`teardown_store`,
    :meth:`thread_finished`, :meth:`mark_waiting` (how a run waits for approval in
    this backend), :meth:`make_encrypting_store` and :meth:`raw_texts` (the
    encryption tests skip without them).

    Tests use coordination ids of their own, but some list or prune the whole store:
    run the contract against a test database, not one holding data you keep.
    """

    #: Threads and saves per thread of the concurrent ``seq`` test.
    race_threads: int = 8
    race_saves: int = 5

    def make_store(self) -> SnapshotStore:
        """Return the store under test."""
        raise NotImplementedError("Subclasses return the store under test")

    def teardown_store(self, store: SnapshotStore) -> None:
        """Release the store after each test (``store.close()`` by default)."""
        store.close()

    def thread_finished(self) -> None:
        """Called at the end of every worker thread (closes its Django connections)."""
        from django.db import connections

        connections.close_all()

    def mark_waiting(self, store: SnapshotStore, snapshot: WorkflowSnapshot) -> dict[str, Any]:
        """Make *snapshot* the head of a run waiting for approval; return extra
        ``prune`` arguments. By default: ``{"protected_ids": {snapshot.id}}``."""
        return {"protected_ids": {snapshot.id}}

    def make_encrypting_store(self, keys: list[str] | None, **options: Any) -> SnapshotStore | None:
        """A store on the same storage as :meth:`make_store` with these encryption keys
        (``None``: no encryption) and *options* (``require_encryption``), or ``None``
        when the backend does not encrypt."""
        return None

    def raw_texts(self, store: SnapshotStore, snapshot_id: str) -> tuple[str, str] | None:
        """The stored (state, metadata) text of a snapshot, or ``None`` if unknown."""
        return None

    def move_row(self, store: SnapshotStore, snapshot_id: str, coordination_id: str) -> bool:
        """Move a stored snapshot to another coordination behind the store's back, as
        someone with write access to the storage could; False if unsupported."""
        return False

    # -- fixtures and helpers ----------------------------------------------------------

    @pytest.fixture
    def store(self) -> Iterator[SnapshotStore]:
        store = self.make_store()
        yield store
        self.teardown_store(store)

    @pytest.fixture
    def cid(self) -> str:
        return f"contract-{uuid.uuid4().hex[:12]}"

    @pytest.fixture
    def events(self, store: SnapshotStore) -> Iterator[list[SnapshotEvent]]:
        seen: list[SnapshotEvent] = []
        store.add_listener(seen.append)
        yield seen
        store.remove_listener(seen.append)

    def run_threads(self, *targets: Callable[[], None]) -> None:
        """Run *targets* in threads, wait for all, and re-raise the first error."""
        errors: list[BaseException] = []
        start = threading.Barrier(len(targets))

        def wrap(target: Callable[[], None]) -> Callable[[], None]:
            def run() -> None:
                try:
                    start.wait(timeout=60)
                    target()
                except BaseException as exc:  # re-raised below, in the test's thread
                    errors.append(exc)
                finally:
                    self.thread_finished()

            return run

        threads = [threading.Thread(target=wrap(t), daemon=True) for t in targets]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
            assert not thread.is_alive(), "a worker thread did not finish within 600 s"
        if errors:
            raise errors[0]

    @staticmethod
    def chain(
        store: SnapshotStore, cid: str, count: int, *, start: datetime = BASE, **fields: Any
    ) -> list[WorkflowSnapshot]:
        """Save *count* snapshots, each the child of the one before, a second apart."""
        saved: list[WorkflowSnapshot] = []
        for index in range(count):
            parent = saved[-1].id if saved else None
            snapshot = WorkflowSnapshot(
                id=uuid.uuid4().hex,
                coordination_id=cid,
                state={"step": index},
                parent_id=parent,
                created_at=start + timedelta(seconds=index),
                **fields,
            )
            saved.append(store.save(snapshot))
        return saved

    @staticmethod
    def ids(snapshots: list[WorkflowSnapshot]) -> list[str]:
        return [s.id for s in snapshots]

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
        first = store.save(
            WorkflowSnapshot(uuid.uuid4().hex, f"{cid}-b", 1, agent_name=agent, created_at=BASE)
        )
        second = store.save(
            WorkflowSnapshot(
                uuid.uuid4().hex,
                f"{cid}-a",
                2,
                agent_name=agent,
                created_at=BASE + timedelta(seconds=1),
            )
        )
        # Same created_at: coordination id, then seq, break the tie.
        tie_a1 = store.save(
            WorkflowSnapshot(
                uuid.uuid4().hex,
                f"{cid}-a",
                3,
                agent_name=agent,
                created_at=BASE + timedelta(seconds=2),
            )
        )
        tie_a2 = store.save(
            WorkflowSnapshot(
                uuid.uuid4().hex,
                f"{cid}-a",
                4,
                agent_name=agent,
                created_at=BASE + timedelta(seconds=2),
            )
        )
        tie_b = store.save(
            WorkflowSnapshot(
                uuid.uuid4().hex,
                f"{cid}-b",
                5,
                agent_name=agent,
                created_at=BASE + timedelta(seconds=2),
            )
        )
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

    # -- encryption at rest (stores that encrypt) --------------------------------------

    def _encrypting(self, keys: list[str] | None, **options: Any) -> SnapshotStore:
        store = self.make_encrypting_store(keys, **options)
        if store is None:
            pytest.skip("this store does not encrypt at rest")
        return store

    @staticmethod
    def _keys() -> tuple[str, str]:
        pytest.importorskip("cryptography")
        from ..workflows.storage.encryption import generate_key

        return generate_key(), generate_key()

    def test_encrypted_rows_are_unreadable_without_the_key(self, cid: str) -> None:
        from ..workflows.storage.encryption import SnapshotDecryptionError

        key, _ = self._keys()
        encrypting = self._encrypting([key])
        assert encrypting.encrypts_at_rest
        stored = encrypting.save(
            WorkflowSnapshot.root(cid, {"secret": "s3cr3t-state"}, metadata={"pin": "s3cr3t-meta"})
        )
        raw = self.raw_texts(encrypting, stored.id)
        if raw is not None:
            assert all(text.startswith("enc:v2:") for text in raw)
            assert "s3cr3t" not in "".join(raw)
        plain = self._encrypting(None)
        assert not plain.encrypts_at_rest
        with pytest.raises(SnapshotDecryptionError):
            plain.load(stored.id)
        with pytest.raises(SnapshotDecryptionError):
            plain.latest(cid)
        assert encrypting.load(stored.id) == stored

    def test_a_wrong_key_fails_closed(self, cid: str) -> None:
        from ..workflows.storage.encryption import SnapshotDecryptionError

        key, wrong = self._keys()
        stored = self._encrypting([key]).save(WorkflowSnapshot.root(cid, {"v": 1}))
        other = self._encrypting([wrong])
        with pytest.raises(SnapshotDecryptionError):
            other.load(stored.id)
        # A listing reports the row it cannot read instead of failing as a whole.
        for with_state in (True, False):
            query = CheckpointQuery(coordination_id=cid, with_state=with_state)
            (row,) = other.list(query)
            assert isinstance(row, UnreadableSnapshot) and row.error
            assert (row.id, row.seq, row.state) == (stored.id, stored.seq, None)

    def test_plaintext_rows_are_refused_by_an_encrypting_store(self, cid: str) -> None:
        from ..workflows.storage.encryption import SnapshotDecryptionError

        key, _ = self._keys()
        planted = self._encrypting(None).save(WorkflowSnapshot.root(cid, {"v": "planted"}))
        encrypting = self._encrypting([key])
        with pytest.raises(SnapshotDecryptionError, match="plaintext"):
            encrypting.load(planted.id)
        with pytest.raises(SnapshotDecryptionError):
            encrypting.latest(cid)
        (row,) = encrypting.list(CheckpointQuery(coordination_id=cid))
        assert isinstance(row, UnreadableSnapshot)

    def test_an_encrypted_row_moved_to_another_coordination_does_not_decrypt(
        self, cid: str
    ) -> None:
        from ..workflows.storage.encryption import SnapshotDecryptionError

        key, _ = self._keys()
        encrypting = self._encrypting([key])
        secret = encrypting.save(WorkflowSnapshot.root(cid, {"v": "approved amount"}))
        if not self.move_row(encrypting, secret.id, f"{cid}-other"):
            pytest.skip("this contract cannot rewrite stored rows")
        with pytest.raises(SnapshotDecryptionError):
            encrypting.load(secret.id)

    def test_plaintext_rows_stay_readable_after_enabling(self, cid: str) -> None:
        key, _ = self._keys()
        old = self._encrypting(None).save(
            WorkflowSnapshot.root(cid, {"v": "plain"}, metadata={"m": "1"})
        )
        encrypting = self._encrypting([key], require_encryption=False)
        assert encrypting.load(old.id) == old
        new = encrypting.save(old.derive_with({"v": "sealed"}))
        assert self.ids(encrypting.list(CheckpointQuery(coordination_id=cid))) == [old.id, new.id]
        child = encrypting.fork(old.id, {"v": "forked"})
        assert encrypting.load(child.id).metadata == {"m": "1"}

    def test_rotated_keys_read_old_rows(self, cid: str) -> None:
        from ..workflows.storage.encryption import SnapshotDecryptionError

        old_key, new_key = self._keys()
        before = self._encrypting([old_key]).save(WorkflowSnapshot.root(cid, {"v": 1}))
        rotated = self._encrypting([new_key, old_key])
        assert rotated.load(before.id) == before
        after = rotated.save(before.derive_with({"v": 2}))
        with pytest.raises(SnapshotDecryptionError):
            self._encrypting([old_key]).load(after.id)
        assert self._encrypting([new_key]).load(after.id) == after


#: The operations :class:`AsyncSnapshotStoreContract` drives through their ``a…`` twins.
SNAPSHOT_OPERATIONS = (
    "save",
    "load",
    "list",
    "latest",
    "fork",
    "delete",
    "delete_coordination",
    "prune",
)


class AsyncSnapshotStoreContract(SnapshotStoreContract):
    """The same contract through the async API (``asave``, ``aload``, ``alatest``…).

    Every test of :class:`SnapshotStoreContract` runs against a stand-in whose sync
    operations await the store's ``a…`` variants on an event loop
    (``testkit/_async_driven.py``): the same values, errors, events and signals, from
    async code. The encrypting stores of :meth:`make_encrypting_store` are driven the
    same way when this class comes first in front of the class that defines it::

        class TestMyStoreAsync(AsyncSnapshotStoreContract, TestMyStore):
            pass

    Then a test of its own awaits many saves at once.
    """

    @pytest.fixture
    def store(self) -> Iterator[SnapshotStore]:
        store = self.make_store()
        yield async_driven(store, SNAPSHOT_OPERATIONS)
        self.teardown_store(store)

    def make_encrypting_store(self, keys: list[str] | None, **options: Any) -> SnapshotStore | None:
        store = super().make_encrypting_store(keys, **options)
        return None if store is None else async_driven(store, SNAPSHOT_OPERATIONS)

    def test_async_variants_are_coroutine_functions(self, store: Any) -> None:
        for operation in SNAPSHOT_OPERATIONS:
            assert inspect.iscoroutinefunction(getattr(store.driven, f"a{operation}")), operation

    def test_gathered_async_saves_get_distinct_seqs(self, store: Any, cid: str) -> None:
        real: SnapshotStore = store.driven

        async def scenario() -> tuple[list[WorkflowSnapshot], WorkflowSnapshot | None]:
            saved = await asyncio.gather(
                *(real.asave(WorkflowSnapshot.root(cid, {"n": n})) for n in range(6))
            )
            return list(saved), await real.alatest(cid)

        saved, latest = async_to_sync(scenario)()
        assert sorted(s.seq for s in saved) == list(range(1, 7))
        assert latest is not None and latest.seq == 6
