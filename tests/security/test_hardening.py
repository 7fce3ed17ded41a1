"""Regression tests of the hardening review (issue 11), on SQLite and PostgreSQL.

One test (or a few) per finding; each failed on the code before the fix. The fork
that skipped an approval is in ``workflows/test_fork_approval.py``, the health and
metrics exposure in ``health/test_health_exposure.py``, the Redis key collision in
``streams/test_redis_lock_keys.py``, the encryption findings in the snapshot store contract
(``flowwarden_django.testkit.SnapshotStoreContract``), and the hostile-input suite in
``test_hostile_inputs.py``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.models import Permission, User
from django.core import signing
from django.db import connections, router
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from flowwarden_django.api.pagination import CURSOR_SALT, encode_cursor
from flowwarden_django.common.sealing import seal, unseal
from flowwarden_django.models import Approval, ApprovalEvent, SnapshotRecord, WorkflowRun
from flowwarden_django.workflows import WorkflowSnapshot, snapshot_stores
from tests.api.helpers import (
    API,
    People,
    field_errors,
    pending,
    post_json,
    postgres_lane,
    token_client,
)

pytest_plugins = ["tests.api.helpers"]  # the people, refunds and on_lane fixtures
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.parametrize("lane", ["sqlite", postgres_lane()]),
]

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def db() -> str:
    return router.db_for_write(SnapshotRecord)


def save_chain(cid: str, count: int, start: datetime, state: Any = None) -> list[WorkflowSnapshot]:
    store = snapshot_stores["default"]
    saved: list[WorkflowSnapshot] = []
    for index in range(count):
        snapshot = WorkflowSnapshot(
            id=f"{cid[:40]}-{index:05d}",
            coordination_id=cid,
            state={"n": index} if state is None else state,
            parent_id=saved[-1].id if saved else None,
            created_at=start + timedelta(seconds=index),
        )
        saved.append(store.save(snapshot))
    return saved


def walk(client: Client, url: str) -> tuple[list[str], list[dict[str, Any]]]:
    """Follow ``next`` from *url*: the cursors met and every row."""
    cursors, rows = [], []
    while url:
        body = client.get(url).json()
        rows += body["results"]
        url = body["next"]
        if url:
            cursors.append(parse_qs(urlsplit(url).query)["cursor"][0])
        assert len(cursors) < 100
    return cursors, rows


def staff(username: str, *codenames: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="flowwarden_django", codename__in=codenames
        )
    )
    return user


# -- 3. the snapshot list reads no states and filters in SQL ----------------------------


def test_a_restricted_list_never_reads_other_runs_or_states(
    lane: str, on_lane: None, refunds: Any, people: People, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = pending(refunds).coordination_id
    save_chain("payroll:ceo-salary-2026", 300, T0, state={"salary": "x" * 2000})
    store = snapshot_stores["default"]
    # Decoding any state now fails: a listing must not need one.
    monkeypatch.setattr(store.serializer, "loads", _refuse)
    client = people.client("alice")
    with CaptureQueriesContext(connections[db()]) as queries:
        body = client.get(f"{API}/snapshots/?page_size=50").json()
    assert [r["coordination_id"] for r in body["results"]] == [mine, mine]
    assert body["next"] is None
    table = SnapshotRecord._meta.db_table
    listing = [q["sql"] for q in queries.captured_queries if table in q["sql"]]
    assert len(listing) == 1, listing
    assert '"state"' not in listing[0].replace('"state_type"', "")
    assert "IN (" in listing[0]


def assert_opaque(cursor: str, coordination_id: str) -> None:
    """Issue 24: the cursor was base64 and zlib of the ids, seq and time. Nothing of
    them shows in it now, decoded or not."""
    import base64
    import zlib

    raw = base64.urlsafe_b64decode(cursor.split(":")[0] + "=" * (-len(cursor) % 4))
    assert coordination_id.encode() not in raw and coordination_id not in cursor
    with pytest.raises(zlib.error):
        zlib.decompress(raw)


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a snapshot list decoded a state")


# -- 4. the paging cursor: signed, opaque, and never a hidden run's -----------------------


def test_cursors_name_visible_rows_only_and_are_tamper_evident(
    lane: str, on_lane: None, refunds: Any, people: People
) -> None:
    mine = pending(refunds).coordination_id
    save_chain(mine, 12, T0)
    save_chain("payroll:ceo-salary-2026", 40, T0 + timedelta(seconds=30))
    client = people.client("alice")
    cursors, rows = walk(client, f"{API}/snapshots/?page_size=5")
    assert len(rows) == 14 and {r["coordination_id"] for r in rows} == {mine}
    assert cursors
    for cursor in cursors:
        assert "payroll" not in json.dumps(json.loads(unseal(cursor, purpose=CURSOR_SALT)))
        assert_opaque(cursor, mine)
    # Tampered, forged with another key, of another purpose, or the readable signed
    # format of an earlier version: 400, not a page.
    with override_settings(SECRET_KEY="guess"):
        forged = seal(
            json.dumps(["x", "payroll:ceo-salary-2026", 1, "t"]).encode(), purpose=CURSOR_SALT
        )
    other_purpose = seal(json.dumps(["x", mine, 1, T0.isoformat()]).encode(), purpose="elsewhere")
    readable = signing.dumps(["x", mine, 1, T0.isoformat()], salt=CURSOR_SALT, compress=True)
    for bad in [cursors[0][:-2] + "xx", forged, other_purpose, readable, "e30"]:
        response = client.get(f"{API}/snapshots/", {"cursor": bad})
        assert response.status_code == 400 and field_errors(response.json()) == ["cursor"]


# -- 6. hostile input: 4xx, never 5xx ---------------------------------------------------


def test_a_cursor_at_the_end_of_time_is_a_400(lane: str, on_lane: None, people: People) -> None:
    snapshot = WorkflowSnapshot("x", "c", seq=1, created_at=T0)
    late = seal(
        json.dumps(["x", "c", 1, "9999-12-31T23:59:59-14:00"]).encode(), purpose=CURSOR_SALT
    )
    client = people.client("viewer")
    response = client.get(f"{API}/snapshots/", {"cursor": late})
    assert response.status_code == 400 and field_errors(response.json()) == ["cursor"]
    assert client.get(f"{API}/snapshots/", {"cursor": encode_cursor(snapshot)}).status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        '{"payload": {"x": 1e309}}',
        '{"payload": {"x": -1e400}}',
        '{"payload": {"x": NaN}}',
        '{"payload": ' + '{"a": ' * 500 + "1" + "}" * 500 + "}",
        '{"payload": [1, 2]}',
        '{"comment": "' + "c" * 2001 + '"}',
    ],
    ids=["1e309", "-1e400", "NaN", "500-deep", "array", "long-comment"],
)
def test_bad_decision_bodies_are_400_and_decide_nothing(
    lane: str, on_lane: None, refunds: Any, people: People, body: str
) -> None:
    approval = pending(refunds)
    client = token_client(people.alice)
    url = f"{API}/approvals/{approval.pk}/approve/"
    response = client.post(url, body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert {"code", "detail"} <= set(response.json())
    assert Approval.objects.using(db()).get(pk=approval.pk).status == "pending"


@pytest.mark.parametrize(
    "state",
    [
        "[" * 320 + "]" * 320,
        '{"a": 1e309}',
        '{"a": "\\u0000"}',
        '"' + "x" * (1024 * 1024 + 1) + '"',
    ],
    ids=["320-deep", "1e309", "nul", "over-1MiB"],
)
def test_bad_fork_states_are_400_and_fork_nothing(
    lane: str, on_lane: None, refunds: Any, people: People, state: str
) -> None:
    approval = pending(refunds)
    before = SnapshotRecord.objects.using(db()).count()
    client = token_client(people.forker)
    url = f"{API}/snapshots/{approval.snapshot_id}/fork/"
    response = client.post(url, '{"state": ' + state + "}", content_type="application/json")
    assert response.status_code == 400 and {"code", "detail"} <= set(response.json())
    assert SnapshotRecord.objects.using(db()).count() == before


def test_an_unreadable_row_is_reported_in_its_row(
    lane: str, on_lane: None, refunds: Any, people: People
) -> None:
    approval = pending(refunds)
    cid = approval.coordination_id
    rows = SnapshotRecord.objects.using(db()).filter(pk=approval.snapshot_id)
    rows.update(metadata="enc:v2:AAAA", state="enc:v2:AAAA")  # tampered, or a lost key
    body = people.client("viewer").get(f"{API}/snapshots/").json()
    by_id = {row["id"]: row for row in body["results"]}
    assert by_id[approval.snapshot_id]["error"]["code"] == "snapshot_unreadable"
    assert [row["error"] for row in body["results"] if row["id"] != approval.snapshot_id] == [None]
    assert all(row["coordination_id"] == cid for row in body["results"])
    detail = people.client("viewer").get(f"{API}/snapshots/{approval.snapshot_id}/")
    assert detail.status_code == 409 and detail.json()["code"] == "snapshot_unreadable"
    # Someone who may read only some runs cannot tell it exists.
    hidden = people.client("carol").get(f"{API}/snapshots/{approval.snapshot_id}/")
    assert hidden.status_code == 404
    # The approval's own page still answers, without the state.
    response = token_client(people.alice).get(f"{API}/approvals/{approval.pk}/")
    assert response.status_code == 200 and response.json()["state"] is None


# -- 5. admin snapshot pages need view_snapshotrecord -----------------------------------


def test_admin_snapshot_pages_need_the_snapshot_permission(
    lane: str, on_lane: None, refunds: Any, client: Client
) -> None:
    approval = pending(refunds)
    cid = approval.coordination_id
    client.force_login(staff("runs-only", "view_workflowrun"))
    pages = [
        reverse("admin:flowwarden_django_workflowrun_tree", args=[cid]),
        reverse("admin:flowwarden_django_workflowrun_tree_nodes", args=[cid]),
        reverse("admin:flowwarden_django_workflowrun_snapshot", args=[cid, approval.snapshot_id]),
    ]
    for url in pages:
        response = client.get(url)
        assert response.status_code == 403 and b"manual" not in response.content
    run_page = client.get(reverse("admin:flowwarden_django_workflowrun_change", args=[cid]))
    assert run_page.status_code == 200 and pages[0].encode() not in run_page.content
    client.force_login(staff("reader", "view_workflowrun", "view_snapshotrecord"))
    assert all(client.get(url).status_code == 200 for url in pages)


# -- 8. refused decisions are audited, from the API and the admin ------------------------


def refusals(approval: Approval) -> list[tuple[str, str]]:
    events = ApprovalEvent.objects.using(db()).filter(approval_id=approval.pk, action="refused")
    return [(e.actor, e.detail.split(":")[0]) for e in events.order_by("at", "id")]


def test_refused_decisions_are_audited(
    lane: str, on_lane: None, refunds: Any, people: People, client: Client
) -> None:
    approval = pending(refunds)
    response = post_json(
        token_client(people.auditor), f"{API}/approvals/{approval.pk}/approve/", {}
    )
    assert response.status_code == 403 and response.json()["code"] == "approval_forbidden"
    # Refused before the body is judged: a bad body from a non-decider is a 403 too.
    response = post_json(
        token_client(people.auditor), f"{API}/approvals/{approval.pk}/reject/", {"payload": 1}
    )
    assert response.status_code == 403
    viewer = staff("approval-viewer", "view_approval")
    client.force_login(viewer)
    url = reverse("admin:flowwarden_django_approval_approve", args=[approval.pk])
    assert client.post(url, {"post": "yes"}).status_code == 403
    assert refusals(approval) == [
        ("auditor", "approval_forbidden"),
        ("auditor", "approval_forbidden"),
        ("approval-viewer", "approval_forbidden"),
    ]
    assert Approval.objects.using(db()).get(pk=approval.pk).status == "pending"


# -- 10. the admin forms are as strict as the API ---------------------------------------


@pytest.mark.parametrize(
    ("payload", "comment"),
    [("[1,2]", ""), ('{"x": NaN}', ""), ('{"x": 1e309}', ""), ("", "c" * 2001)],
    ids=["array", "NaN", "1e309", "long-comment"],
)
def test_the_admin_decision_form_refuses_what_the_api_refuses(
    lane: str,
    on_lane: None,
    refunds: Any,
    people: People,
    client: Client,
    payload: str,
    comment: str,
) -> None:
    approval = pending(refunds)
    client.force_login(people.admin)
    url = reverse("admin:flowwarden_django_approval_approve", args=[approval.pk])
    response = client.post(url, {"post": "yes", "payload": payload, "comment": comment})
    assert response.status_code == 200 and b'class="errorlist"' in response.content
    assert Approval.objects.using(db()).get(pk=approval.pk).status == "pending"
    assert WorkflowRun.objects.using(db()).get(pk=approval.coordination_id).status == "waiting"


@pytest.mark.parametrize(
    "state", ['{"a": NaN}', '{"a": "\\u0000"}', "[" * 100 + "]" * 100], ids=["NaN", "nul", "deep"]
)
def test_the_admin_fork_form_refuses_what_the_api_refuses(
    lane: str, on_lane: None, refunds: Any, people: People, client: Client, state: str
) -> None:
    approval = pending(refunds)
    before = SnapshotRecord.objects.using(db()).count()
    client.force_login(people.admin)
    url = reverse(
        "admin:flowwarden_django_workflowrun_fork",
        args=[approval.coordination_id, approval.snapshot_id],
    )
    response = client.post(url, {"state": state, "post": "yes"})
    assert response.status_code == 200 and b'class="errorlist"' in response.content
    assert SnapshotRecord.objects.using(db()).count() == before
