"""The run page's timeline, a workflow's diagram and the "Workflows" page, through
the Django test client: status codes, labelled bars, links and permissions."""

from __future__ import annotations

import re
import socket
from html.parser import HTMLParser

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from flowwarden_django.models import WorkflowRun
from tests.support.timeline_workflow import ORDERS, define_orders, drive_orders, forget_orders

pytestmark = pytest.mark.django_db(transaction=True)

WORKFLOWS = reverse("admin:flowwarden_django_definedworkflow_changelist")
CID = "obs-run-1"


def run_url(cid: str) -> str:
    return reverse("admin:flowwarden_django_workflowrun_change", args=[cid])


def diagram_url(name: str, version: int = 1) -> str:
    return reverse("admin:flowwarden_django_definedworkflow_diagram", args=[name, version])


class Elements(HTMLParser):
    """Every start tag of a page with its attributes."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str]]] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, {k: v or "" for k, v in attrs}))

    def having_class(self, name: str) -> list[dict[str, str]]:
        return [a for _, a in self.found if name in a.get("class", "").split()]


def staff(username: str, *codenames: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="flowwarden_django", codename__in=codenames
        )
    )
    return user


@pytest.fixture
def orders_run():
    define_orders()
    try:
        operator = User.objects.create_superuser("operator", "op@example.com", "pw")
        yield drive_orders(CID, operator), operator
    finally:
        forget_orders()


def test_the_run_page_draws_its_timeline_with_every_bar_labelled(client, orders_run):
    run, operator = orders_run
    client.force_login(operator)
    response = client.get(run_url(run.pk))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="flowwarden-timeline"' in html
    page = Elements(html)
    bars = page.having_class("fw-bar")
    assert len(bars) >= 10  # 6 attempts, 3 waits, 2 children
    for bar in bars:
        assert bar["role"] == "img" and bar["aria-label"] and bar["title"] == bar["aria-label"]
        assert re.fullmatch(r"left: [\d.]+%; width: [\d.]+%", bar["style"])
    labels = [bar["aria-label"] for bar in bars]
    assert any(label.startswith("reserve, failed, attempt 1, FlakyError") for label in labels)
    assert any(label.startswith("approval: approved, waited") for label in labels)
    assert any("current position" in label for label in labels)
    # Outcomes in words beside the colours, and the failed attempt's class.
    assert "✗</span> failed" in html and '<code class="fw-tl-error">FlakyError</code>' in html
    # The child lanes link to the children's pages.
    children = WorkflowRun.objects.filter(parent_coordination_id=run.pk)
    links = {a["href"] for a in page.having_class("fw-tl-child-link")}
    assert links == {run_url(child.pk) for child in children} and len(links) == 2
    for link in links:
        assert client.get(link).status_code == 200
    # The diagram, from the run's tools, marks nothing for a completed run.
    (diagram,) = page.having_class("flowwarden-run-diagram")
    assert diagram["href"] == f"{diagram_url(ORDERS)}?run={CID}"
    response = client.get(diagram["href"])
    assert response.status_code == 200
    assert "Run <strong>obs-run-1</strong> is completed." in response.content.decode()


def test_the_diagram_marks_where_a_waiting_run_stands(client, orders_run):
    _, operator = orders_run
    WorkflowRun.objects.filter(pk=CID).update(status="waiting", last_step="review")
    client.force_login(operator)
    html = client.get(f"{diagram_url(ORDERS)}?run={CID}").content.decode()
    page = Elements(html)
    steps = page.having_class("fw-step")
    assert [s["id"] for s in steps] == [
        "step-reserve",
        "step-review",
        "step-cool-off",
        "step-pack",
        "step-ship",
    ]
    current = [s for s in steps if s.get("aria-current") == "step"]
    assert [s["id"] for s in current] == ["step-review", "step-cool-off"]
    assert "this run is here" in html and "this run continues here" in html
    assert '<span class="fw-step-kind fw-kind-approval">approval</span>' in html
    assert 'href="#step-reserve">↺ reserve</a>' in html  # ship's declared loop
    boxes = page.having_class("fw-step-box")
    assert all(box["aria-label"].startswith("Step ") for box in boxes)


def test_the_workflows_page_lists_versions_and_runs_by_status(client, orders_run):
    _, operator = orders_run
    client.force_login(operator)
    index = client.get(reverse("admin:app_list", args=["flowwarden_django"])).content.decode()
    assert f'href="{WORKFLOWS}"' in index
    response = client.get(WORKFLOWS)
    assert response.status_code == 200
    page = Elements(response.content.decode())
    versions = [a["href"] for a in page.having_class("fw-version-link")]
    assert diagram_url(ORDERS) in versions
    counts = page.having_class("fw-status-count")
    completed = [a["href"] for a in counts if f"workflow_name={ORDERS}" in a["href"]]
    assert completed == [
        f"{reverse('admin:flowwarden_django_workflowrun_changelist')}"
        f"?workflow_name={ORDERS}&status__exact=completed"
    ]
    listed = client.get(completed[0])
    assert listed.status_code == 200 and CID in listed.content.decode()
    # A run's id under the page: its workflow's diagram.
    change = reverse("admin:flowwarden_django_definedworkflow_change", args=[CID])
    assert client.get(change)["Location"] == f"{diagram_url(ORDERS)}?run={CID}"
    assert client.get(diagram_url("no-such-workflow")).status_code == 404


def test_permissions(client, orders_run):
    run, _ = orders_run
    viewer = staff("viewer", "view_workflowrun")
    client.force_login(viewer)
    html = client.get(run_url(run.pk)).content.decode()
    assert 'id="flowwarden-timeline"' not in html  # snapshots are not theirs to read
    assert "flowwarden-run-diagram" in html
    assert client.get(WORKFLOWS).status_code == 200
    client.force_login(staff("stranger"))
    assert client.get(WORKFLOWS).status_code == 403
    assert client.get(diagram_url(ORDERS)).status_code == 403


def test_without_the_details_workers_are_shown_by_their_key(client, orders_run, settings):
    run, operator = orders_run
    settings.FLOWWARDEN = {**settings.FLOWWARDEN, "HEALTH_DETAILS": "none"}
    client.force_login(operator)
    html = client.get(run_url(run.pk)).content.decode()
    timeline = html.split('id="flowwarden-timeline"')[1]
    assert "inprocess @ " in timeline
    assert socket.gethostname() not in timeline
