"""The ORM snapshot store's listings at scale, on every database: a page of a few
runs is read run by run (the same rows, ties and all, whatever the number of runs),
a keyset page seeks to its mark, and no listing reads a state."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from flowwarden_django.workflows.backends import _orm_listing
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.storage.snapshot import CheckpointQuery, WorkflowSnapshot
from tests.support.lanes import lane_marks

BASE = datetime(2031, 3, 1, tzinfo=UTC)

ALIASES = [
    pytest.param("default", marks=pytest.mark.django_db(transaction=True), id="sqlite"),
    pytest.param("postgres", marks=lane_marks("postgres", databases=["postgres"]), id="postgres"),
    pytest.param("mariadb", marks=lane_marks("mariadb", databases=["mariadb"]), id="mariadb"),
]

#: The state column of the snapshot table in a query (any database's quoting).
STATE = re.compile(r"""["`]flowwarden_django_snapshotrecord["`]\.["`]state["`]""")


def build(store: OrmSnapshotStore, runs: int, per_run: int) -> list[WorkflowSnapshot]:
    """*runs* chains of *per_run* snapshots; run i's snapshot n is written at second
    n, so every second holds one row of each run (ties broken by coordination id)."""
    saved = []
    for run in range(runs):
        parent = None
        for n in range(per_run):
            snapshot = WorkflowSnapshot(
                id=uuid.uuid4().hex,
                coordination_id=f"list-{run:02d}",
                state={"run": run, "n": n},
                parent_id=parent,
                seq=n + 1,
                agent_name="listing",
                created_at=BASE + timedelta(seconds=n),
            )
            saved.append(store.save(snapshot))
            parent = snapshot.id
    return saved


def walk(store: OrmSnapshotStore, query: CheckpointQuery) -> list[str]:
    """Every id of *query*, following its pages."""
    seen: list[str] = []
    current: CheckpointQuery | None = query
    while current is not None:
        page = store.list(current)
        seen += [s.id for s in page]
        current = current.next_page(page)
        assert len(seen) < 1000
    return seen


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("newest_first", [False, True], ids=["oldest", "newest"])
@pytest.mark.parametrize("many", [False, True], ids=["run-by-run", "one-in-filter"])
def test_a_page_of_some_runs_holds_their_rows_in_order(
    alias: str, newest_first: bool, many: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if many:  # more runs than are read one by one: one IN filter
        monkeypatch.setattr(_orm_listing, "PER_COORDINATION_MAX", 2)
    store = OrmSnapshotStore(using=alias)
    saved = build(store, runs=5, per_run=4)
    wanted = frozenset({"list-00", "list-02", "list-03", "list-missing"})
    query = CheckpointQuery(
        coordination_ids=wanted, with_state=False, newest_first=newest_first, limit=3
    )
    expected = sorted(
        (s for s in saved if s.coordination_id in wanted), key=query.sort_key, reverse=newest_first
    )
    assert walk(store, query) == [s.id for s in expected]
    # Run by run where the database can limit each part of a UNION (not SQLite).
    with CaptureQueriesContext(connections[alias]) as captured:
        store.list(query)
    run_by_run = not many and connections[alias].vendor != "sqlite"
    assert ("UNION ALL" in captured.captured_queries[0]["sql"]) == run_by_run
    # One run, and filters with the runs.
    one = CheckpointQuery(coordination_ids=frozenset({"list-02"}), limit=2, newest_first=True)
    assert [s.seq for s in store.list(one)] == [4, 3]
    since = CheckpointQuery(
        coordination_ids=wanted, since=BASE + timedelta(seconds=3), agent_name="listing", limit=10
    )
    assert [(s.coordination_id, s.seq) for s in store.list(since)] == [
        ("list-00", 4),
        ("list-02", 4),
        ("list-03", 4),
    ]


@pytest.mark.parametrize("alias", ALIASES)
def test_keyset_pages_across_ties_visit_every_row_once(alias: str) -> None:
    store = OrmSnapshotStore(using=alias)
    saved = build(store, runs=3, per_run=5)
    for newest_first in (False, True):
        query = CheckpointQuery(newest_first=newest_first, limit=4, with_state=False)
        expected = sorted(saved, key=query.sort_key, reverse=newest_first)
        assert walk(store, query) == [s.id for s in expected]


@pytest.mark.parametrize("alias", ALIASES)
def test_listings_without_states_never_read_the_state_column(alias: str) -> None:
    store = OrmSnapshotStore(using=alias)
    saved = build(store, runs=3, per_run=3)
    mark = sorted(saved, key=CheckpointQuery().sort_key)[4]
    queries: list[CheckpointQuery] = [
        CheckpointQuery(),
        CheckpointQuery(newest_first=True, limit=2, after=mark),
        CheckpointQuery(coordination_id="list-01", newest_first=True, limit=2),
        CheckpointQuery(coordination_ids=frozenset({"list-00", "list-02"}), limit=2),
        CheckpointQuery(coordination_ids=frozenset({"list-00"}), after=mark, limit=2),
        CheckpointQuery(agent_name="listing", since=BASE, until=BASE + timedelta(seconds=1)),
    ]
    for query in queries:
        bare = CheckpointQuery(**{**query.__dict__, "with_state": False})
        with CaptureQueriesContext(connections[alias]) as captured:
            rows = store.list(bare)
        assert rows and all(s.state is None for s in rows)
        sql = " ".join(q["sql"] for q in captured.captured_queries)
        assert "flowwarden_django_snapshotrecord" in sql
        assert not STATE.search(sql), sql
        # The same rows as with their states.
        assert [s.id for s in rows] == [s.id for s in store.list(query)]
    with CaptureQueriesContext(connections[alias]) as captured:
        store.list(CheckpointQuery(limit=1))
    assert STATE.search(captured.captured_queries[0]["sql"])  # the check can fail


def test_a_deep_keyset_page_is_bounded_by_its_mark() -> None:
    """The mark's created_at is a condition of its own (an index range), besides the
    OR of its ties."""
    mark = WorkflowSnapshot(id="m", coordination_id="c", seq=3, created_at=BASE)
    condition: Any = _orm_listing.rows_after(mark, _orm_listing.LIST_ORDER, newest_first=True)
    assert ("created_at__lte", BASE) in condition.children
    condition = _orm_listing.rows_after(mark, _orm_listing.LIST_ORDER, newest_first=False)
    assert ("created_at__gte", BASE) in condition.children
    assert _orm_listing.rows_after(mark, ("seq",), newest_first=True).children == [("seq__lt", 3)]
