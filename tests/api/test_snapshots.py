"""The REST API: snapshots (list with keyset paging, detail, fork)."""

from __future__ import annotations

import dataclasses
import enum
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.test.utils import override_settings

from flowwarden_django.api.pagination import decode_cursor, encode_cursor
from flowwarden_django.api.serializers import json_safe
from flowwarden_django.models import SnapshotRecord
from flowwarden_django.workflows import Workflow, WorkflowSnapshot, snapshot_stores
from flowwarden_django.workflows.storage.snapshot import check_id
from tests.api.helpers import (
    API,
    WORKFLOW,
    People,
    field_errors,
    pending,
    post_json,
    token_client,
)

pytest_plugins = ["tests.api.helpers"]  # the people and refunds fixtures
pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def save_chain(coordination_id: str, count: int, start: datetime, agent: str = "bulk") -> list[Any]:
    """*count* snapshots of one coordination, one a minute from *start*."""
    store = snapshot_stores["default"]
    saved, parent = [], None
    for index in range(count):
        snapshot = WorkflowSnapshot(
            id=uuid.uuid4().hex,
            coordination_id=coordination_id,
            state={"n": index},
            parent_id=parent,
            agent_name=agent,
            metadata={"i": str(index)},
            created_at=start + timedelta(minutes=index),
        )
        saved.append(store.save(snapshot))
        parent = snapshot.id
    return saved


def walk(client: Client, url: str) -> tuple[list[list[str]], list[dict[str, Any]]]:
    """Follow ``next`` from *url*: the ids of each page, and every row."""
    pages, rows = [], []
    while url:
        response = client.get(url)
        assert response.status_code == 200, response.content
        body = response.json()
        pages.append([r["id"] for r in body["results"]])
        rows += body["results"]
        url = body["next"]
        assert len(pages) < 100
    return pages, rows


# -- the list --------------------------------------------------------------------------


def test_the_first_page_holds_the_newest_and_next_walks_everything_once(people: People) -> None:
    a = save_chain("coord-a", 70, T0)
    b = save_chain("coord-b", 65, T0 + timedelta(seconds=30))
    everything = sorted(a + b, key=lambda s: (s.created_at, s.coordination_id, s.seq))
    newest_first = [s.id for s in reversed(everything)]
    client = people.client("viewer")

    pages, rows = walk(client, f"{API}/snapshots/")
    assert [len(p) for p in pages] == [50, 50, 35]
    assert pages[0] == newest_first[:50]  # really the newest, newest first
    assert [r["id"] for r in rows] == newest_first
    assert "state" not in rows[0] and "metadata" not in rows[0]

    pages, rows = walk(client, f"{API}/snapshots/?order=oldest&page_size=40")
    assert [len(p) for p in pages] == [40, 40, 40, 15]
    assert [r["id"] for r in rows] == [s.id for s in everything]

    # One coordination: by seq.
    pages, rows = walk(client, f"{API}/snapshots/?coordination=coord-a&page_size=30")
    assert [r["seq"] for r in rows] == list(range(70, 0, -1))
    assert [len(p) for p in pages] == [30, 30, 10]


def test_paging_is_stable_while_snapshots_are_added(people: People) -> None:
    save_chain("coord-a", 10, T0)
    client = people.client("viewer")
    first = client.get(f"{API}/snapshots/?page_size=4").json()
    save_chain("coord-new", 3, T0 + timedelta(days=1))  # newer than everything
    _pages, rows = walk(client, first["next"])
    assert len(first["results"]) + len(rows) == 10
    assert not {r["id"] for r in rows} & {r["id"] for r in first["results"]}


def test_an_exact_last_page_has_no_next(people: People) -> None:
    save_chain("coord-a", 4, T0)
    body = people.client("viewer").get(f"{API}/snapshots/?page_size=4").json()
    assert len(body["results"]) == 4 and body["next"] is None


def test_snapshot_filters(people: People) -> None:
    save_chain("coord-a", 5, T0, agent="one")
    save_chain("coord-b", 5, T0 + timedelta(seconds=30), agent="two")
    client = people.client("viewer")

    def ids(query: str) -> list[tuple[str, int]]:
        response = client.get(f"{API}/snapshots/{query}")
        assert response.status_code == 200, response.content
        return [(r["coordination_id"], r["seq"]) for r in response.json()["results"]]

    assert ids("?agent=two&order=oldest") == [("coord-b", n) for n in range(1, 6)]
    assert ids("?coordination=coord-a&agent=two") == []
    since = (T0 + timedelta(minutes=3)).isoformat()
    until = (T0 + timedelta(minutes=3, seconds=30)).isoformat()
    assert ids(f"?since={since.replace('+', '%2B')}&until={until.replace('+', '%2B')}") == [
        ("coord-b", 4),
        ("coord-a", 4),
    ]
    assert ids("?since=2030-01-01T00:04:00Z&order=oldest") == [
        ("coord-a", 5),
        ("coord-b", 5),
    ]
    assert ids("?until=2030-01-01T00:00:00Z") == [("coord-a", 1)]
    assert ids("?coordination=&agent=") != []  # blank means no filter


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("?since=yesterday", "since"),
        ("?until=2030-13-01T00:00:00Z", "until"),
        ("?since=2030-01-02T00:00:00Z&until=2030-01-01T00:00:00Z", "until"),
        ("?order=random", "order"),
        ("?store=nope", "store"),
        ("?cursor=not-a-cursor", "cursor"),
        ("?coordination=a%00b", "coordination"),
    ],
)
def test_bad_snapshot_filters_are_400(people: People, query: str, field: str) -> None:
    response = people.client("viewer").get(f"{API}/snapshots/{query}")
    assert response.status_code == 400
    body = response.json()
    assert field_errors(body) == [field] and isinstance(body[field], list), body


def test_the_store_alias(people: People) -> None:
    stores = {
        "default": {"BACKEND": "flowwarden_django.workflows.backends.orm.OrmSnapshotStore"},
        "memory": {"BACKEND": "flowwarden_django.workflows.backends.memory.InMemorySnapshotStore"},
    }
    with override_settings(FLOWWARDEN={"SNAPSHOT_STORES": stores}):
        snapshot_stores.reset()
        try:
            memory = snapshot_stores["memory"]
            kept = memory.save(WorkflowSnapshot.root("in-memory", {"x": 1}))
            save_chain("coord-a", 2, T0)
            client = people.client("forker")
            rows = client.get(f"{API}/snapshots/?store=memory").json()["results"]
            assert [r["id"] for r in rows] == [kept.id]
            assert client.get(f"{API}/snapshots/{kept.id}/").status_code == 404
            detail = client.get(f"{API}/snapshots/{kept.id}/?store=memory").json()
            assert detail["state"] == {"x": 1}
            forked = post_json(
                client, f"{API}/snapshots/{kept.id}/fork/?store=memory", {"state": 2}
            )
            assert forked.status_code == 201
            assert forked.headers["Location"].endswith("?store=memory")
            assert memory.load(forked.json()["id"]).parent_id == kept.id
            response = client.get(f"{API}/snapshots/{kept.id}/?store=gone")
            assert response.status_code == 400 and field_errors(response.json()) == ["store"]
        finally:
            snapshot_stores.reset()


def test_an_approver_lists_the_snapshots_of_their_runs_only(
    refunds: Any, people: People, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = pending(refunds).coordination_id
    save_chain("unrelated", 30, T0)
    client = people.client("alice")
    rows = client.get(f"{API}/snapshots/").json()["results"]
    assert {r["coordination_id"] for r in rows} == {mine} and len(rows) == 2
    assert client.get(f"{API}/snapshots/?coordination=unrelated").json() == {
        "next": None,
        "results": [],
    }
    assert people.client("carol").get(f"{API}/snapshots/").json()["results"] == []

    # The store filters: full pages of visible rows, every one exactly once.
    save_chain(mine, 12, T0 + timedelta(seconds=1), agent=WORKFLOW)
    pages, rows = walk(client, f"{API}/snapshots/?page_size=3")
    assert len(rows) == 14 and len({r["id"] for r in rows}) == 14
    assert {r["coordination_id"] for r in rows} == {mine}
    assert [len(page) for page in pages] == [3, 3, 3, 3, 2]
    expected = client.get(f"{API}/snapshots/?coordination={mine}&page_size=100").json()
    assert len(expected["results"]) == 14


# -- the detail ------------------------------------------------------------------------


def test_snapshot_detail(refunds: Any, people: People) -> None:
    approval = pending(refunds)
    response = people.client("alice").get(f"{API}/snapshots/{approval.snapshot_id}/")
    assert response.status_code == 200
    body = response.json()
    seed = Workflow.for_coordination(approval.coordination_id).history()[0]
    assert body == {
        "id": approval.snapshot_id,
        "coordination_id": approval.coordination_id,
        "parent_id": seed.id,
        "agent_name": WORKFLOW,
        "seq": 2,
        "is_root": False,
        "created_at": body["created_at"],
        "metadata": body["metadata"],
        "state": {"amount": 500, "review": "manual"},
        "error": None,
        "step": {"duration_ms": body["step"]["duration_ms"], "attempts": 1, "errors": []},
    }
    assert body["metadata"]["workflow.lastStep"] == "review"
    root = people.client("viewer").get(f"{API}/snapshots/{seed.id}/").json()
    assert root["is_root"] is True and root["parent_id"] is None and root["seq"] == 1


def test_hidden_and_unknown_snapshots_are_404(refunds: Any, people: People) -> None:
    approval = pending(refunds)
    other = save_chain("unrelated", 1, T0)[0]
    for client, snapshot_id in [
        (people.client("carol"), approval.snapshot_id),
        (people.client("alice"), other.id),
        (people.client("viewer"), "nope"),
        (people.client("viewer"), "x" * 65),
        (people.client("viewer"), "a%00b"),
    ]:
        response = client.get(f"{API}/snapshots/{snapshot_id}/")
        assert response.status_code == 404, snapshot_id
        assert response.json()["code"] == "snapshot_not_found"


def test_states_that_are_not_plain_json_are_shown_as_json(people: People) -> None:
    @dataclasses.dataclass
    class Point:
        x: int
        y: Decimal

    class Colour(enum.Enum):
        RED = "red"

    state = {
        "when": datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC),
        "day": date(2030, 1, 2),
        "price": Decimal("1.10"),
        "tags": ("a", "b"),
        "span": timedelta(minutes=2),
        "blob": b"\x00\x01",
        "point": Point(1, Decimal("2.5")),
        "colour": Colour.RED,
        "id": uuid.UUID(int=1),
        1: "int key",
        "nan": float("nan"),
    }
    assert json_safe(state) == {
        "when": "2030-01-02T03:04:05+00:00",
        "day": "2030-01-02",
        "price": "1.10",
        "tags": ["a", "b"],
        "span": 120.0,
        "blob": "AAE=",
        "point": {"x": 1, "y": "2.5"},
        "colour": "red",
        "id": "00000000-0000-0000-0000-000000000001",
        "1": "int key",
        "nan": "nan",
    }
    # Through the API, from a state the JSON serializer round-trips with its types.
    stored_state = {k: v for k, v in state.items() if k not in ("point", "colour", "nan")}
    saved = snapshot_stores["default"].save(WorkflowSnapshot.root("typed", stored_state))
    body = people.client("viewer").get(f"{API}/snapshots/{saved.id}/").json()
    assert body["state"]["when"] == "2030-01-02T03:04:05+00:00"
    assert body["state"]["1"] == "int key" and body["state"]["blob"] == "AAE="


def test_cursors_round_trip() -> None:
    snapshot = WorkflowSnapshot(
        id="abc", coordination_id="c:1", seq=7, created_at=T0 + timedelta(microseconds=5)
    )
    mark = decode_cursor(encode_cursor(snapshot))
    assert (mark.id, mark.coordination_id, mark.seq, mark.created_at) == (
        "abc",
        "c:1",
        7,
        snapshot.created_at,
    )
    assert check_id(mark.id) == "abc"


# -- fork ------------------------------------------------------------------------------


def test_fork(refunds: Any, people: People, monkeypatch: pytest.MonkeyPatch) -> None:
    through_workflow: list[str] = []
    original = Workflow.fork

    def spy(self: Workflow, snapshot_id: str, new_state: Any) -> Any:
        through_workflow.append(snapshot_id)
        return original(self, snapshot_id, new_state)

    monkeypatch.setattr(Workflow, "fork", spy)
    approval = pending(refunds)
    cid = approval.coordination_id
    seed = Workflow.for_coordination(cid).history()[0]
    client = people.client("forker", csrf=True)
    client.get("/admin/login/")  # sets the CSRF cookie
    url = f"{API}/snapshots/{seed.id}/fork/"
    assert post_json(client, url, {"state": {"amount": 7}}).status_code == 403  # no CSRF token
    response = post_json(
        client, url, {"state": {"amount": 7}}, X_CSRFToken=client.cookies["csrftoken"].value
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["parent_id"] == seed.id and body["coordination_id"] == cid
    assert body["state"] == {"amount": 7} and body["seq"] == 3 and body["is_root"] is False
    assert response.headers["Location"] == f"http://testserver{API}/snapshots/{body['id']}/"
    assert Workflow.for_coordination(cid).history()[-1].id == body["id"]  # the run's latest
    assert through_workflow == [seed.id]  # the run's workflow is defined here


def test_fork_with_a_token_and_any_json_state(refunds: Any, people: People) -> None:
    approval = pending(refunds)
    client = token_client(people.forker)  # no CSRF with a token
    url = f"{API}/snapshots/{approval.snapshot_id}/fork/"
    for state in (None, [1, "two"], "text", 3.5, {"nested": {"a": [True]}}):
        response = post_json(client, url, {"state": state})
        assert response.status_code == 201, response.content
        assert response.json()["state"] == state


def test_fork_of_a_run_whose_workflow_is_not_defined_here(
    people: People, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Workflow, "fork", None)  # not called: the store forks
    source = save_chain("legacy", 2, T0)[-1]
    response = post_json(
        token_client(people.admin), f"{API}/snapshots/{source.id}/fork/", {"state": {"a": 1}}
    )
    assert response.status_code == 201
    assert SnapshotRecord.objects.get(pk=response.json()["id"]).parent_id == source.id


def test_fork_refusals(refunds: Any, people: People) -> None:
    approval = pending(refunds)
    url = f"{API}/snapshots/{approval.snapshot_id}/fork/"
    # Visible but not allowed: 403.
    response = post_json(token_client(people.viewer), url, {"state": 1})
    assert response.status_code == 403
    assert response.json()["code"] == "fork_forbidden"
    response = post_json(token_client(people.alice), url, {"state": 1})
    assert response.status_code == 403
    # Not visible: 404, whatever the permission.
    assert post_json(token_client(people.carol), url, {"state": 1}).status_code == 404
    forker = token_client(people.forker)
    assert post_json(forker, f"{API}/snapshots/nope/fork/", {"state": 1}).status_code == 404
    # Bad bodies: 400.
    response = post_json(forker, url, {})
    assert response.status_code == 400 and field_errors(response.json()) == ["state"]
    response = post_json(forker, url, [1, 2])
    assert response.status_code == 400 and field_errors(response.json()) == ["non_field_errors"]
    response = forker.post(url, "{nope", content_type="application/json")
    assert response.status_code == 400 and response.json()["code"] == "parse_error"
    response = forker.post(url, "state=1", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415
    assert SnapshotRecord.objects.filter(coordination_id=approval.coordination_id).count() == 2
