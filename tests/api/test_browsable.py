"""DRF's browsable API (``?format=api``, ``Accept: text/html``) on every GET endpoint
of the served schema: a page for a person, never a 5xx, whatever the query."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from flowwarden_django.workflows import Workflow
from tests.api.helpers import API, People, make_people, pending, token_client

pytest_plugins = ["tests.api.helpers"]  # the refunds fixture
pytestmark = pytest.mark.django_db(transaction=True)

#: Odd queries a person's browser may send along (bad filters, cursors and pages).
HOSTILE_QUERIES = [
    "",
    "status=nope&workflow=%00&coordination=x",
    "cursor=forged&page=999999&order=sideways",
    "since=yesterday&until=%00&store=nope&agent=" + "a" * 300,
    "topic=%00&delivered=maybe&page_size=-1",
]


def get_operations(client: Client) -> list[str]:
    """The GET paths of the served schema, but the schema's own (it is YAML or JSON)."""
    schema = client.get(f"{API}/schema/?format=json").json()
    return [
        path
        for path, item in schema["paths"].items()
        if "get" in item and not path.endswith("/schema/")
    ]


def fill(path: str, ids: dict[str, str]) -> str:
    """*path* with its placeholders replaced by the ids of real objects."""
    if "{coordination_id}" in path:
        return path.replace("{coordination_id}", ids["run"])
    if "{id}" in path:
        kind = "snapshot" if "/snapshots/" in path else "approval"
        return path.replace("{id}", ids[kind])
    return path


def world(refunds: Any) -> tuple[People, dict[str, str]]:
    people = make_people()
    approval = pending(refunds)
    snapshot = Workflow.for_coordination(approval.coordination_id).history()[0]
    ids = {"run": approval.coordination_id, "snapshot": snapshot.id, "approval": str(approval.pk)}
    return people, ids


@pytest.mark.parametrize("how", ["format=api", "Accept: text/html"])
def test_every_get_endpoint_renders_for_a_browser(refunds: Any, how: str) -> None:
    people, ids = world(refunds)
    paths = get_operations(token_client(people.admin))
    lists = [path for path in paths if "{" not in path]
    assert {f"{API}/runs/", f"{API}/snapshots/", f"{API}/approvals/"} <= set(lists)
    # A run's messages and events are lists too.
    lists += [path for path in paths if path.endswith(("/messages/", "/events/"))]
    assert len(lists) >= 6
    failures = []
    for who in ("admin", "carol"):
        client = people.client(who)
        for path in paths:
            for query in HOSTILE_QUERIES if path in lists else [""]:
                if how == "format=api":
                    url = f"{fill(path, ids)}?{'&'.join(filter(None, ['format=api', query]))}"
                    response = client.get(url)
                else:
                    url = f"{fill(path, ids)}?{query}"
                    response = client.get(url, headers={"Accept": "text/html"})
                # The admin's plain requests are pages; nothing is ever a 5xx.
                page = not query and who == "admin"
                if response.status_code >= 500 or (page and response.status_code != 200):
                    failures.append(f"{who} GET {url}: {response.status_code}")
                elif page:
                    assert response["Content-Type"].startswith("text/html"), url
    assert not failures, failures


def test_an_anonymous_browser_gets_401_not_5xx() -> None:
    client = Client()
    for path in ("runs/", "snapshots/", "approvals/", "approvals/mine/"):
        response = client.get(f"{API}/{path}?format=api")
        assert response.status_code == 401, path
