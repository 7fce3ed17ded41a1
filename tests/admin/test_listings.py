"""The admin's lists at scale: the runs and approvals changelists never count a long
list to its end (an estimate on PostgreSQL, said "about"), their date hierarchy and
workflow filter probe an index instead of reading every row, and the snapshot tree
never reads a state."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.auth.models import User
from django.db import connections, router
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from flowwarden_django.admin import base
from flowwarden_django.admin.base import (
    EstimatedCountPaginator,
    distinct_values,
    probed_datetimes,
)
from flowwarden_django.models import Approval, WorkflowRun
from flowwarden_django.workflows import WorkflowSnapshot
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from tests.api.helpers import postgres_lane
from tests.support.lanes import lane_marks

pytest_plugins = ["tests.api.helpers"]  # the on_lane fixture
pytestmark = pytest.mark.django_db(transaction=True)

RUNS = reverse("admin:flowwarden_django_workflowrun_changelist")
APPROVALS = reverse("admin:flowwarden_django_approval_changelist")
LANES = [pytest.param("sqlite", id="sqlite"), postgres_lane()]
ALIASES = [
    pytest.param("default", id="sqlite"),
    pytest.param(
        "postgres",
        marks=lane_marks("postgres", databases=["default", "postgres"]),
        id="postgres",
    ),
    pytest.param(
        "mariadb", marks=lane_marks("mariadb", databases=["default", "mariadb"]), id="mariadb"
    ),
]
STATE = re.compile(r'"flowwarden_django_snapshotrecord"\."state"')
#: Moments around a year's end and a daylight-saving change in Paris (2031-03-30 02:00).
MOMENTS = [
    datetime(2030, 12, 31, 23, 30, tzinfo=UTC),
    datetime(2031, 1, 1, 0, 30, tzinfo=UTC),
    datetime(2031, 3, 29, 23, 30, tzinfo=UTC),
    datetime(2031, 3, 30, 0, 30, tzinfo=UTC),
    datetime(2031, 3, 30, 22, 30, tzinfo=UTC),
    datetime(2031, 3, 31, 12, 0, tzinfo=UTC),
    datetime(2031, 4, 1, 0, 0, tzinfo=UTC),
    datetime(2033, 7, 4, 10, 0, tzinfo=UTC),
]


def make_approvals(using: str, moments: list[datetime], workflows: tuple[str, ...]) -> None:
    for index, moment in enumerate(moments):
        Approval.objects.using(using).create(
            id=uuid.uuid4(),
            coordination_id=f"run-{index}",
            workflow_name=workflows[index % len(workflows)],
            step_name="review",
            snapshot_id=uuid.uuid4().hex,
            prompt=f"Approve {index}?",
            requested_at=moment,
        )


def chain_run(cid: str, length: int) -> None:
    """A run of *length* snapshots (with states), its workflow not registered."""
    store = OrmSnapshotStore()
    head = store.save(WorkflowSnapshot.root(cid, {"secret": 0}))
    for n in range(1, length):
        head = store.save(head.derive_with({"secret": n}, metadata={"workflow.lastStep": "s"}))
    now = timezone.now()
    WorkflowRun.objects.create(
        coordination_id=cid,
        workflow_name="listing",
        status=WorkflowRun.Status.HIBERNATED,
        head_snapshot_id=head.id,
        created_at=now,
        updated_at=now,
    )


def page(response: Any) -> str:
    assert response.status_code == 200
    return response.content.decode()


# -- the changelists ------------------------------------------------------------------


def test_the_changelists_count_once_and_look_like_django(admin_client: Client) -> None:
    for n in range(3):
        chain_run(f"run-{n}", 1)
    make_approvals("default", MOMENTS[:3], ("orders",))
    for url, plural in ((RUNS, "workflow runs"), (APPROVALS, "approvals")):
        with CaptureQueriesContext(connections["default"]) as captured:
            body = page(admin_client.get(url))
        counts = [q["sql"] for q in captured.captured_queries if "COUNT(" in q["sql"]]
        assert len(counts) == 1, counts  # no "N total" count of the whole table
        # Django's paginator text, and its "Show all" beside the search box.
        assert re.search(rf'<p class="paginator">\s*3 {plural}\s', body), body
        assert ">Show all</a>)" in body
        assert "about" not in body


def test_the_snapshot_tree_never_reads_a_state(admin_client: Client) -> None:
    chain_run("tree-run", 5)
    tree = reverse("admin:flowwarden_django_workflowrun_tree", args=["tree-run"])
    nodes = reverse("admin:flowwarden_django_workflowrun_tree_nodes", args=["tree-run"])
    for url in (tree, f"{nodes}?after=2"):
        with CaptureQueriesContext(connections["default"]) as captured:
            body = page(admin_client.get(url))
        assert "fw-node" in body
        listed = [q["sql"] for q in captured.captured_queries if "snapshotrecord" in q["sql"]]
        assert listed and not [sql for sql in listed if STATE.search(sql)]


@pytest.mark.parametrize("lane", LANES)
def test_a_long_list_is_estimated_on_postgresql(
    lane: str, on_lane: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(EstimatedCountPaginator, "exact_up_to", 3)
    db = router.db_for_read(Approval)
    make_approvals(db, MOMENTS, ("orders", "refunds"))
    rows = Approval.objects.using(db).order_by("-requested_at", "id")
    paginator = EstimatedCountPaginator(rows, 2)
    if lane == "postgres":
        assert paginator.estimated is False  # until counted
        assert paginator.count >= 4 and paginator.estimated
    else:  # other databases count
        assert (paginator.count, paginator.estimated) == (8, False)
    # A list no longer than exact_up_to is counted exactly everywhere.
    small = EstimatedCountPaginator(rows.filter(workflow_name="orders")[:3], 2)
    assert (small.count, small.estimated) == (3, False)
    few = EstimatedCountPaginator(rows.filter(requested_at__year=2033), 2)
    assert (few.count, few.estimated) == (1, False)

    admin = User.objects.create_superuser("root", password="pw")
    client = Client()
    client.force_login(admin)
    with CaptureQueriesContext(connections[db]) as captured:
        body = page(client.get(APPROVALS))
    sql = [q["sql"] for q in captured.captured_queries]
    # The year links of the date hierarchy, and both workflows in the filter.
    for year in (2030, 2031, 2033):
        assert f"?requested_at__year={year}" in body
    assert "?workflow_name=orders" in body and "?workflow_name=refunds" in body
    body_filtered = page(client.get(f"{APPROVALS}?requested_at__year=2031"))
    for month in (1, 3, 4):
        assert f"requested_at__month={month}" in body_filtered
    if lane == "postgres":
        assert re.search(r'<p class="paginator">.*about \d+\s*</span> approvals', body, re.S)
        assert ">about " in body and "results (<a" in body
        assert not [q for q in sql if "DISTINCT" in q]  # probed, not read row by row
    else:
        assert re.search(r'<p class="paginator">.*\s8 approvals', body, re.S)


# -- the probes -----------------------------------------------------------------------


def period_starts(moments: list[datetime], kind: str, zone: ZoneInfo) -> list[datetime]:
    """The periods of *moments* computed in Python, as ``QuerySet.datetimes`` gives them."""
    starts = set()
    for moment in moments:
        local = moment.astimezone(zone).replace(tzinfo=None)
        fields = {"year": 1, "month": 2, "day": 3}[kind]
        parts = (local.year, local.month, local.day)[:fields]
        start = datetime(*parts, *([1] * (3 - fields)))  # type: ignore[misc]
        starts.add(start.replace(tzinfo=zone))
    return sorted(starts)


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("zone", ["UTC", "Europe/Paris"])
def test_probed_dates_are_the_dates_django_reads(alias: str, zone: str) -> None:
    make_approvals(alias, MOMENTS, ("orders",))
    rows = Approval.objects.using(alias).all()
    # MariaDB without time zone tables cannot convert to Paris time (nor Django's query).
    ask_django = alias != "mariadb" or zone == "UTC"
    later = datetime(2031, 1, 1, tzinfo=UTC)
    with timezone.override(ZoneInfo(zone)):
        for kind in ("year", "month", "day"):
            expected = period_starts(MOMENTS, kind, ZoneInfo(zone))
            assert probed_datetimes(rows, "requested_at", kind) == expected, kind
            in_2031 = rows.filter(requested_at__gte=later)
            assert probed_datetimes(in_2031, "requested_at", kind) == period_starts(
                [m for m in MOMENTS if m >= later], kind, ZoneInfo(zone)
            )
            if ask_django:
                assert expected == list(rows.datetimes("requested_at", kind))
        assert probed_datetimes(rows.none(), "requested_at", "day") == []


@pytest.mark.parametrize("alias", ALIASES)
def test_probing_gives_up_on_too_many_periods(alias: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "MAX_PROBED_PERIODS", 2)
    make_approvals(alias, MOMENTS, ("orders",))
    rows = Approval.objects.using(alias).all()
    with timezone.override(ZoneInfo("UTC")):
        expected = list(rows.datetimes("requested_at", "day"))
        assert len(expected) > 2
        assert probed_datetimes(rows, "requested_at", "day") == expected


@pytest.mark.parametrize(
    "alias",
    [pytest.param("postgres", marks=lane_marks("postgres", databases=["postgres"]))],
)
def test_distinct_values_are_the_values_django_reads(alias: str) -> None:
    make_approvals(alias, MOMENTS, ("b", "a", "c", "a b", "B"))
    rows = Approval.objects.using(alias).all()
    expected = list(
        rows.distinct().order_by("workflow_name").values_list("workflow_name", flat=True)
    )
    assert distinct_values(rows, "workflow_name") == expected
    assert distinct_values(rows.filter(pk=None), "workflow_name") == expected  # the table's
    Approval.objects.using(alias).all().delete()
    assert distinct_values(rows, "workflow_name") == []


@pytest.mark.parametrize("model", ["approval", "workflowrun"])
def test_select_all_says_about_when_the_count_is_an_estimate(model: str) -> None:
    from types import SimpleNamespace

    from django.template.loader import render_to_string

    def actions(estimated: bool) -> str:
        cl = SimpleNamespace(
            result_count=100000,
            result_list=list(range(100)),
            paginator=SimpleNamespace(estimated=estimated),
        )
        context = {
            "cl": cl,
            "actions_selection_counter": True,
            "action_form": [],
            "module_name": "approvals",
            "selection_note": "0 of 100 selected",
            "selection_note_all": "All 100000 selected",
        }
        return " ".join(
            render_to_string(f"admin/flowwarden_django/{model}/actions.html", context).split()
        )

    estimated = actions(True)
    assert "Select all of about 100000 approvals" in estimated
    assert "All of about 100000 selected" in estimated
    counted = actions(False)
    assert "Select all 100000 approvals" in counted and "All 100000 selected" in counted
    assert "about" not in counted


@pytest.mark.parametrize("lane", [postgres_lane()])
def test_the_admin_searches_are_read_through_trigram_indexes_on_postgresql(
    lane: str, on_lane: None
) -> None:
    """The admin's "contains" searches of approvals and runs (``icontains`` on each
    search field) match the expressions of migration 0017's trigram indexes, so a
    search of a large table reads an index instead of every row."""
    from django.contrib import admin
    from django.test import RequestFactory

    db = router.db_for_read(Approval)
    make_approvals(db, MOMENTS, ("orders",))
    chain_run("search-run", 1)
    request = RequestFactory().get("/", {"q": "ORD-0042"})
    request.user = User(is_superuser=True, is_staff=True)
    connection = connections[db]
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")  # a tiny table: plan as for a large one
    try:
        for model, indexes in (
            (Approval, ("fw_approval_prompt_search", "fw_approval_coordination_search")),
            (WorkflowRun, ("fw_run_coordination_search", "fw_run_key_search")),
        ):
            model_admin = admin.site._registry[model]
            rows = model._default_manager.using(db).all()
            found, _duplicates = model_admin.get_search_results(request, rows, "ORD-0042")
            plan = found.order_by().explain()  # the filter's plan, not the order's
            for index in indexes:
                assert index in plan, plan
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET enable_seqscan")


# -- the rows of a page ---------------------------------------------------------------


@pytest.mark.parametrize("lane", LANES)
def test_a_deep_page_reads_its_keys_first_and_shows_the_rows_django_would(
    lane: str, on_lane: None, admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = router.db_for_read(Approval)
    moments = [datetime(2031, 1, 1, tzinfo=UTC).replace(minute=n) for n in range(30)]
    # Two approvals at one moment: the order's tie is broken by the id.
    make_approvals(db, [*moments, moments[7]], ("orders", "refunds"))
    monkeypatch.setattr(EstimatedCountPaginator, "keys_first_from", 4)
    rows = Approval.objects.using(db).order_by("-requested_at", "id")
    for number, query in ((1, ""), (3, "?p=3"), (3, "?p=3&workflow_name=refunds")):
        listed = rows.filter(workflow_name="refunds") if "refunds" in query else rows
        expected = [str(pk) for pk in listed.values_list("pk", flat=True)[(number - 1) * 5 :][:5]]
        with monkeypatch.context() as small_pages:
            small_pages.setattr(admin.site._registry[Approval], "list_per_page", 5)
            with CaptureQueriesContext(connections[db]) as captured:
                body = page(admin_client.get(f"{APPROVALS}{query}"))
        shown = re.findall(r'name="_selected_action" value="([^"]+)"', body)
        assert shown == expected
        keys_first = [q["sql"] for q in captured.captured_queries if "OFFSET" in q["sql"]]
        if number == 1:
            assert not keys_first
        else:  # the skipped rows are read as keys only
            assert len(keys_first) == 1 and '"prompt"' not in keys_first[0], keys_first


def test_the_rows_links_and_checkboxes_are_the_ones_django_makes(admin_client: Client) -> None:
    from django.contrib.admin import ModelAdmin

    make_approvals("default", MOMENTS[:2], ("orders",))
    chain_run("run/with?odd_chars", 1)
    for model, url in ((Approval, APPROVALS), (WorkflowRun, RUNS)):
        model_admin = admin.site._registry[model]
        for obj in model._default_manager.all():
            assert model_admin.action_checkbox(obj) == ModelAdmin.action_checkbox(model_admin, obj)
        body = page(admin_client.get(f"{url}?o=1"))  # a filtered list: links keep its filters
        for obj in model._default_manager.all():
            change = reverse(
                f"admin:flowwarden_django_{model._meta.model_name}_change", args=[quote(obj.pk)]
            )
            assert f'href="{change}?_changelist_filters=o%3D1"' in body, (change, body)


def test_reverse_for_key_is_reverse() -> None:
    for key in ("plain", "a/b?c_d%e f", uuid.uuid4(), 42):
        for name in ("workflowrun_change", "approval_change", "workflowrun_tree"):
            viewname = f"admin:flowwarden_django_{name}"
            expected = reverse(viewname, args=[quote(key)], current_app="admin")
            assert base.reverse_for_key(viewname, key, current_app="admin") == expected


def test_icon_urls_follow_the_static_settings() -> None:
    from django.test import override_settings

    icon = "admin/img/icon-yes.svg"
    before = base.icon_url(icon)
    with override_settings(STATIC_URL="/elsewhere/"):
        assert base.icon_url(icon) == "/elsewhere/" + icon
    assert base.icon_url(icon) == before
