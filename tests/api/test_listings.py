"""The REST API's snapshot list at scale, on SQLite and PostgreSQL: no page reads a
state, and a user who may read a few runs pages through exactly their rows."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connections, router
from django.test.utils import CaptureQueriesContext

from flowwarden_django.models import Approval, SnapshotRecord
from flowwarden_django.workflows import WorkflowSnapshot, snapshot_stores
from tests.api.helpers import API, make_people, pending, postgres_lane, token_client

pytest_plugins = ["tests.api.helpers"]  # the refunds and on_lane fixtures
pytestmark = pytest.mark.django_db(transaction=True)

LANES = [pytest.param("sqlite", id="sqlite"), postgres_lane()]
T0 = datetime(2031, 1, 1, tzinfo=UTC)
STATE = re.compile(r'"flowwarden_django_snapshotrecord"\."state"')


def save_chain(coordination_id: str, count: int) -> list[WorkflowSnapshot]:
    """*count* snapshots a second apart from T0 (so runs tie at each second)."""
    store, saved, parent = snapshot_stores["default"], [], None
    for index in range(count):
        snapshot = WorkflowSnapshot(
            id=uuid.uuid4().hex,
            coordination_id=coordination_id,
            state={"secret": index},
            parent_id=parent,
            created_at=T0 + timedelta(seconds=index),
        )
        saved.append(store.save(snapshot))
        parent = snapshot.id
    return saved


def get_pages(client: Any, url: str) -> tuple[list[str], list[str]]:
    """Every row id following ``next`` from *url*, and the SQL of the pages."""
    ids, sql = [], []
    database = connections[router.db_for_read(SnapshotRecord)]
    while url:
        with CaptureQueriesContext(database) as captured:
            response = client.get(url)
        assert response.status_code == 200, response.content
        ids += [row["id"] for row in response.json()["results"]]
        sql += [q["sql"] for q in captured.captured_queries]
        url = response.json()["next"]
        assert len(ids) < 500
    return ids, sql


@pytest.mark.parametrize("lane", LANES)
def test_snapshot_pages_never_read_a_state(lane: str, on_lane: None, refunds: Any) -> None:
    people = make_people()
    mine = pending(refunds).coordination_id
    save_chain("other", 5)
    admin, alice = token_client(people.admin), token_client(people.alice)
    urls = [
        (admin, f"{API}/snapshots/?page_size=2"),
        (admin, f"{API}/snapshots/?order=oldest&page_size=3"),
        (admin, f"{API}/snapshots/?coordination=other&page_size=2"),
        (admin, f"{API}/snapshots/?agent=other&since=2031-01-01T00:00:00Z"),
        (alice, f"{API}/snapshots/?page_size=1"),
        (alice, f"{API}/snapshots/?coordination={mine}"),
    ]
    for client, url in urls:
        _ids, sql = get_pages(client, url)
        listed = [q for q in sql if "flowwarden_django_snapshotrecord" in q]
        assert listed, url
        assert not [q for q in listed if STATE.search(q)], url


@pytest.mark.parametrize("lane", LANES)
def test_an_approver_of_some_runs_pages_through_exactly_their_rows(
    lane: str, on_lane: None, refunds: Any
) -> None:
    people = make_people()
    runs = [pending(refunds).coordination_id for _ in range(3)]
    for cid in runs:
        save_chain(cid, 4)
    save_chain("hidden", 6)
    # alice is assigned every approval of the three runs (pending() assigns her).
    assert set(Approval.objects.values_list("coordination_id", flat=True)) == set(runs)
    rows = SnapshotRecord.objects.filter(coordination_id__in=runs)
    newest = rows.order_by("-created_at", "-coordination_id", "-seq").values_list("id", flat=True)
    ids, sql = get_pages(token_client(people.alice), f"{API}/snapshots/?page_size=4")
    assert ids == list(newest)
    oldest = rows.order_by("created_at", "coordination_id", "seq").values_list("id", flat=True)
    ids, _sql = get_pages(token_client(people.alice), f"{API}/snapshots/?order=oldest&page_size=5")
    assert ids == list(oldest)
    # PostgreSQL reads the page run by run (what it costs does not depend on where the
    # runs sit among the others); SQLite cannot limit the parts of a UNION.
    listed = [q for q in sql if "flowwarden_django_snapshotrecord" in q]
    assert all(("UNION ALL" in q) == (lane == "postgres") for q in listed)
