"""The workflow runs admin, through the Django test client: the runs, each run's
snapshot tree (with forks, paged for long runs), a snapshot's state and diff, and
forking a run from a snapshot."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils import timezone

from flowwarden_django.admin.runs import WorkflowRunAdmin
from flowwarden_django.admin.snapshots import DiffLine, build_forest, state_diff
from flowwarden_django.common.formatting import state_json
from flowwarden_django.models import Approval, SnapshotRecord, WorkflowRun
from flowwarden_django.workflows import (
    Completed,
    Workflow,
    WorkflowSnapshot,
    advance,
    await_approval,
    done,
    step,
    workflow_registry,
)
from flowwarden_django.workflows.backends.memory import InMemorySnapshotStore
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = reverse("admin:flowwarden_django_workflowrun_changelist")


def run_url(cid: str) -> str:
    return reverse("admin:flowwarden_django_workflowrun_change", args=[cid])


def tree_url(cid: str) -> str:
    return reverse("admin:flowwarden_django_workflowrun_tree", args=[cid])


def nodes_url(cid: str) -> str:
    return reverse("admin:flowwarden_django_workflowrun_tree_nodes", args=[cid])


def snapshot_url(cid: str, sid: str) -> str:
    return reverse("admin:flowwarden_django_workflowrun_snapshot", args=[cid, sid])


def fork_url(cid: str, sid: str) -> str:
    return reverse("admin:flowwarden_django_workflowrun_fork", args=[cid, sid])


def page(response: Any) -> str:
    return response.content.decode()


def staff(username: str, *codenames: str) -> User:
    """A staff user with the given ``flowwarden_django`` permissions."""
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="flowwarden_django", codename__in=codenames
        )
    )
    return user


@step
def reserve(state: dict[str, Any]) -> Any:
    return advance({**state, "reserved": True})


@step
def charge(state: dict[str, Any]) -> Any:
    return advance({**state, "charged": state["amount"]})


@step
def ship(state: dict[str, Any]) -> Any:
    return done({**state, "shipped": True})


@pytest.fixture
def orders() -> Any:
    """A registered three-step workflow on the ORM store."""
    definition = Workflow.define("admin-orders", [reserve, charge, ship], OrmSnapshotStore())
    yield definition
    workflow_registry.unregister("admin-orders")


def completed_run(definition: Any, amount: int = 10, **options: Any) -> tuple[str, list[Any]]:
    started = definition.start({"amount": amount}, **options)
    assert isinstance(started.result, Completed)
    history = definition.workflow(started.coordination_id).history()
    return started.coordination_id, history


def chain_run(cid: str, length: int, workflow: str = "admin-unregistered") -> list[Any]:
    """A run of *length* snapshots saved straight through the ORM store, its workflow
    not registered (so the admin reads the ``"default"`` alias)."""
    store = OrmSnapshotStore()
    head = store.save(WorkflowSnapshot.root(cid, {"n": 0}, metadata={"workflow.lastStep": ""}))
    chain = [head]
    for n in range(1, length):
        head = store.save(head.derive_with({"n": n}, metadata={"workflow.lastStep": f"s{n}"}))
        chain.append(head)
    now = timezone.now()
    WorkflowRun.objects.create(
        coordination_id=cid,
        workflow_name=workflow,
        status=WorkflowRun.Status.HIBERNATED,
        last_step=f"s{length - 1}",
        head_snapshot_id=head.id,
        created_at=now,
        updated_at=now,
    )
    return chain


# -- pure helpers ---------------------------------------------------------------------


def test_state_json_is_sorted_indented_and_total() -> None:
    assert state_json({"b": 1, "a": [1, 2]}) == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}'
    assert state_json({"when": timezone.datetime(2025, 1, 2)}) == (
        '{\n  "when": "2025-01-02 00:00:00"\n}'
    )
    assert '"1"' in state_json({1: "x", "a": "y"})  # mixed keys cannot be sorted as they are
    assert state_json({(1, 2): "t"}) == '{\n  "(1, 2)": "t"\n}'


def test_state_diff_marks_added_and_removed_lines() -> None:
    diff = state_diff(state_json({"a": 1, "b": 2}), state_json({"a": 1, "c": 3}))
    assert DiffLine("del", '-  "b": 2') in diff and DiffLine("add", '+  "c": 3') in diff
    assert diff[0].kind == "hunk"
    assert state_diff("{}", "{}") == []


def test_forest_continues_the_first_child_and_branches_the_others() -> None:
    root = WorkflowSnapshot.root("c", 0).replace(seq=1)
    a = root.derive_with(1, seq=2)
    b = a.derive_with(2, seq=3)
    fork = root.derive_with(3, seq=4)
    orphan = WorkflowSnapshot("orphan", "c", 4, parent_id="gone", seq=5)
    (start, detached) = build_forest([fork, b, root, a, orphan])
    assert [n.seq for n in start.chain] == [1, 2, 3]
    assert start.is_fork and [n.seq for n in start.branches[0].chain] == [4]
    assert detached.detached and detached.seq == 5


# -- the changelist ---------------------------------------------------------------------


class TestChangelist:
    def test_lists_runs_with_status_filters_and_search(self, admin_client, orders) -> None:
        cid, _ = completed_run(orders, idempotency_key="order-42")
        chain_run("legacy-run", 3)
        response = admin_client.get(CHANGELIST)
        assert response.status_code == 200
        body = page(response)
        assert "<h1>Select workflow run to view</h1>" in body
        for header in (
            "Coordination / key",
            "Workflow",
            "Status",
            "Last step",
            "Pending approval",
        ):
            assert header in body
        assert 'title="order-42">order-42</span>' in body  # what people know it by
        assert f'href="{run_url(cid)}"' in body and "legacy-run" in body
        assert 'data-status="completed"' in body and "icon-yes.svg" in body
        assert 'data-status="hibernated"' in body
        assert "<code>ship</code>" in body
        # Filters: status and workflow name; a date hierarchy on updated_at.
        assert 'href="?status__exact=completed"' in body
        assert 'href="?workflow_name=admin-orders"' in body
        assert "updated_at__year=" in body
        body = page(admin_client.get(CHANGELIST, {"workflow_name": "admin-orders"}))
        assert f'href="{run_url(cid)}?' in body and "legacy-run" not in body
        # Search by idempotency key or coordination id.
        body = page(admin_client.get(CHANGELIST, {"q": "order-42"}))
        assert f'href="{run_url(cid)}?' in body and "legacy-run" not in body
        body = page(admin_client.get(CHANGELIST, {"q": "legacy"}))
        assert run_url(cid) not in body and "legacy-run" in body

    def test_newest_updated_first(self, admin_client) -> None:
        chain_run("older", 1)
        chain_run("newer", 1)
        WorkflowRun.objects.filter(pk="older").update(
            updated_at=timezone.now() - timedelta(hours=1)
        )
        body = page(admin_client.get(CHANGELIST))
        assert body.index(run_url("newer")) < body.index(run_url("older"))

    def test_pending_approval_is_linked(self, admin_client) -> None:
        @step("ask")
        def ask(state: Any) -> Any:
            return await_approval(state, "Ship the order to Mars?", assignees=["alice"])

        Workflow.define("admin-ask", [ask, ship], OrmSnapshotStore())
        try:
            started = Workflow.start("admin-ask", {"amount": 1})
        finally:
            workflow_registry.unregister("admin-ask")
        assert WorkflowRun.objects.get(pk=started.coordination_id).status == "waiting"
        pending = Approval.objects.get(coordination_id=started.coordination_id)
        url = reverse("admin:flowwarden_django_approval_change", args=[pending.pk])
        body = page(admin_client.get(CHANGELIST))
        assert f'<a href="{url}" title="Ship the order to Mars?">' in body
        body = page(admin_client.get(run_url(started.coordination_id)))
        assert f'href="{url}" class="flowwarden-run-approval"' in body
        assert "Ship the order to Mars?" in body

    def test_read_only(self, admin_client, orders) -> None:
        cid, _ = completed_run(orders)
        body = page(admin_client.get(CHANGELIST))
        # The actions edit no run by hand: they apply the declared upgrades, or cancel.
        actions = re.findall(
            r'<option value="(\w+)"', body.split('name="action"')[1].split("</select>")[0]
        )
        assert actions == ["upgrade_selected", "cancel_selected"]
        assert "workflowrun/add/" not in body
        add = reverse("admin:flowwarden_django_workflowrun_add")
        assert admin_client.get(add).status_code == 403
        delete = reverse("admin:flowwarden_django_workflowrun_delete", args=[cid])
        assert admin_client.post(delete, {"post": "yes"}).status_code == 403
        assert admin_client.post(run_url(cid), {"status": "failed"}).status_code == 403
        assert WorkflowRun.objects.get(pk=cid).status == "completed"

    def test_run_page_links_the_tree_and_the_head(self, admin_client, orders) -> None:
        cid, history = completed_run(orders)
        body = page(admin_client.get(run_url(cid)))
        assert f'href="{tree_url(cid)}" class="flowwarden-run-tree">Snapshot tree</a>' in body
        assert f'href="{snapshot_url(cid, history[-1].id)}"' in body
        assert 'name="_save"' not in body


# -- the snapshot tree ------------------------------------------------------------------


class TestTree:
    def test_draws_the_chain_with_a_fork_as_a_branch(self, admin_client, orders) -> None:
        cid, history = completed_run(orders)
        seed, reserved, charged, shipped = history
        forked = orders.workflow(cid).fork(reserved.id, {"amount": 99, "reserved": True})
        response = admin_client.get(tree_url(cid))
        assert response.status_code == 200
        body = page(response)
        assert f"<h1>Snapshot tree of run {cid}</h1>" in body
        assert 'class="breadcrumbs"' in body and f'href="{run_url(cid)}"' in body
        # One chain seed → reserve → charge → ship; the fork is a branch under reserve.
        (chain,) = response.context["chains"]
        assert [item["snapshot"].id for item in chain] == [s.id for s in history]
        (branch,) = chain[1]["branches"]
        assert [item["snapshot"].id for item in branch] == [forked.id]
        position = {s.id: body.index(f'id="fw-node-{s.id}"') for s in [*history, forked]}
        assert position[reserved.id] < position[forked.id] < position[charged.id]
        branches = body.index('class="fw-branches"', position[reserved.id])
        assert position[reserved.id] < branches < position[forked.id]
        # Each node: seq, last step, time, badges; linked to its snapshot page.
        assert f'href="{snapshot_url(cid, reserved.id)}"' in body
        assert "<code>charge</code>" in body
        assert f'<time datetime="{seed.created_at.isoformat()}' in body
        assert body.count('class="fw-badge fw-badge-root"') == 1
        assert body.count('class="fw-badge fw-badge-fork"') == 1
        # The run's head is highlighted (the run record still points at "ship").
        assert f'class="fw-node fw-head" id="fw-node-{shipped.id}"' in body
        assert "flowwarden-load-more" not in body  # everything fits on one page

    def test_a_long_run_is_loaded_a_page_at_a_time(self, admin_client) -> None:
        chain = chain_run("long-run", 250)
        response = admin_client.get(tree_url("long-run"))
        body = page(response)
        assert body.count('class="fw-node') == 100
        assert (
            f'id="fw-node-{chain[99].id}"' in body and f'id="fw-node-{chain[100].id}"' not in body
        )
        assert f'data-nodes-url="{nodes_url("long-run")}" data-after="100"' in body
        assert f'href="{tree_url("long-run")}?after=100"' in body
        # The rest, through the JSON endpoint the "Load more" button uses.
        seen = [item["snapshot"].id for item in response.context["chains"][0]]
        after = 100
        while after is not None:
            data = admin_client.get(nodes_url("long-run"), {"after": after}).json()
            assert len(data["nodes"]) <= 100
            for node in data["nodes"]:
                assert node["html"].startswith('<li class="fw-node')
                assert node["parent_id"] == seen[-1]
                seen.append(node["id"])
            after = data["next_after"]
        assert seen == [s.id for s in chain]
        # Without JavaScript, the same pages are plain links.
        body = page(admin_client.get(tree_url("long-run"), {"after": 200}))
        assert body.count('class="fw-node') == 50
        assert f'href="{tree_url("long-run")}"' in body and "flowwarden-load-more" not in body
        # Node 201's parent is on an earlier page: it says so, with a link.
        assert f'parent: <a href="{snapshot_url("long-run", chain[199].id)}">' in body
        # The head (the last snapshot) is highlighted on its page.
        assert f'class="fw-node fw-head" id="fw-node-{chain[-1].id}"' in body

    def test_deeply_nested_forks_are_drawn_as_chains_of_their_own(self, admin_client) -> None:
        chain = chain_run("deep-run", 2)
        store = OrmSnapshotStore()
        source, forks = chain[0], []
        for n in range(20):  # each fork branches off the previous fork: 20 levels deep
            fork = store.fork(source.id, {"fork": n})
            store.save(fork.derive_with({"fork": n, "next": True}))
            forks.append(fork)
            source = fork
        response = admin_client.get(tree_url("deep-run"))
        assert response.status_code == 200
        body = page(response)
        assert body.count('class="fw-node') == 42
        # Branches nest 8 deep; the next one is a chain of its own, linked both ways.
        chains = response.context["chains"]
        assert len(chains) == 3
        assert chains[1][0]["snapshot"].id == forks[8].id
        assert (
            f'<a class="fw-moved" href="#fw-node-{forks[8].id}">branch #{forks[8].seq} below'
            in body
        )
        assert f'parent: <a href="{snapshot_url("deep-run", forks[7].id)}">' in body

    def test_reads_the_workflows_own_store(self, admin_client) -> None:
        memory = InMemorySnapshotStore()
        Workflow.define("admin-memory", [reserve, ship], memory)
        try:
            started = Workflow.start("admin-memory", {"amount": 3})
        finally:
            workflow_registry.unregister("admin-memory")
        cid = started.coordination_id
        assert not SnapshotRecord.objects.filter(coordination_id=cid).exists()
        Workflow.define("admin-memory", [reserve, ship], memory)
        try:
            body = page(admin_client.get(tree_url(cid)))
            assert body.count('class="fw-node') == 3
            assert "the store of workflow “admin-memory” (InMemorySnapshotStore)" in body
            head = memory.latest(cid)
            body = page(admin_client.get(snapshot_url(cid, head.id)))
            assert "&quot;shipped&quot;: true" in body
        finally:
            workflow_registry.unregister("admin-memory")

    def test_a_store_that_cannot_list_gets_a_hint(self, admin_client) -> None:
        class Unlistable(InMemorySnapshotStore):
            def list(self, query: Any = None) -> Any:
                raise NotImplementedError("no listing here")

        Workflow.define("admin-unlistable", [reserve, ship], Unlistable())
        try:
            cid = Workflow.start("admin-unlistable", {"amount": 3}).coordination_id
            response = admin_client.get(tree_url(cid))
        finally:
            workflow_registry.unregister("admin-unlistable")
        body = page(response)
        assert response.status_code == 200
        assert "cannot list a run's snapshots (no listing here)" in body
        head = WorkflowRun.objects.get(pk=cid).head_snapshot_id
        assert f'href="{snapshot_url(cid, head)}"' in body

    def test_unknown_run(self, admin_client) -> None:
        response = admin_client.get(tree_url("nope"), follow=True)
        assert "Workflow run with ID “nope” doesn\u2019t exist" in page(response)
        assert admin_client.get(nodes_url("nope")).status_code == 404


# -- one snapshot ----------------------------------------------------------------------


class TestSnapshot:
    def test_shows_fields_state_and_the_diff_against_its_parent(self, admin_client, orders):
        cid, (seed, reserved, charged, _) = completed_run(orders, amount=10)
        response = admin_client.get(snapshot_url(cid, charged.id))
        assert response.status_code == 200
        body = page(response)
        assert f"<h1>Snapshot #3 of run {cid}</h1>" in body
        assert f"<code>{charged.id}</code>" in body
        assert f'<a href="{snapshot_url(cid, reserved.id)}"><code>{reserved.id}</code></a>' in body
        assert f'<a href="{run_url(cid)}">{cid}</a>' in body
        assert "&quot;workflow.lastStep&quot;: &quot;charge&quot;" in body
        expected = state_json({"amount": 10, "charged": 10, "reserved": True})
        assert expected.replace('"', "&quot;") in body
        assert '<span class="fw-diff-line fw-diff-add">+  &quot;charged&quot;: 10,</span>' in body
        assert "Changes from the parent (#2)" in body
        # The root has no parent.
        body = page(admin_client.get(snapshot_url(cid, seed.id)))
        assert "root: no parent" in body and "fw-diff-add" not in body

    def test_removed_lines_and_escaping(self, admin_client, orders):
        cid, (_, reserved, *_rest) = completed_run(orders)
        forked = orders.workflow(cid).fork(reserved.id, {"note": "<script>alert(1)</script>"})
        body = page(admin_client.get(snapshot_url(cid, forked.id)))
        assert '<span class="fw-diff-line fw-diff-del">-  &quot;amount&quot;: 10,</span>' in body
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and "<script>alert" not in body

    def test_a_snapshot_of_another_run_is_not_shown(self, admin_client, orders):
        cid, _ = completed_run(orders)
        _, other = completed_run(orders)
        response = admin_client.get(snapshot_url(cid, other[0].id), follow=True)
        assert response.redirect_chain == [(tree_url(cid), 302)]
        assert f"has no snapshot “{other[0].id}”" in page(response)


# -- forking ---------------------------------------------------------------------------


class TestFork:
    def test_bad_json_redisplays_the_form_and_writes_nothing(self, admin_client, orders):
        cid, history = completed_run(orders)
        url = fork_url(cid, history[1].id)
        form = page(admin_client.get(url))
        assert "<h1>Fork snapshot #2 of run" in form
        assert 'name="state"' in form and "&quot;reserved&quot;: true" in form
        response = admin_client.post(url, {"state": '{"amount": 5,'})
        assert response.status_code == 200
        body = page(response)
        assert '<ul class="errorlist" id="id_state_error"><li>The state is not valid JSON:' in body
        assert "{&quot;amount&quot;: 5," in body  # what was typed is kept
        assert SnapshotRecord.objects.filter(coordination_id=cid).count() == 4

    def test_confirmation_then_fork(self, admin_client, orders):
        cid, history = completed_run(orders)
        url = fork_url(cid, history[1].id)
        state = {"amount": 77, "reserved": True}
        response = admin_client.post(url, {"state": json.dumps(state)})
        body = page(response)
        assert f"Fork snapshot #2 ({history[1].id}) of run {cid} with this state?" in body
        assert '<input type="hidden" name="post" value="yes">' in body
        assert '<span class="fw-diff-line fw-diff-add">+  &quot;amount&quot;: 77,</span>' in body
        assert SnapshotRecord.objects.filter(coordination_id=cid).count() == 4  # not yet
        response = admin_client.post(
            url, {"state": '{"amount":77,"reserved":true}', "post": "yes"}, follow=True
        )
        child = orders.workflow(cid).history()[-1]
        assert response.redirect_chain == [(snapshot_url(cid, child.id), 302)]
        assert (child.seq, child.parent_id, child.state) == (5, history[1].id, state)
        body = page(response)
        assert f"Forked snapshot #2 of run “{cid}”: new snapshot #5 ({child.id})." in body
        assert '<li class="success">' in body
        history_url = reverse("admin:flowwarden_django_workflowrun_history", args=[cid])
        assert f"Forked snapshot #2 as #5 ({child.id})." in page(admin_client.get(history_url))
        # The tree draws it as a branch under #2.
        tree = admin_client.get(tree_url(cid))
        (chain,) = tree.context["chains"]
        assert [item["snapshot"].id for item in chain[1]["branches"][0]] == [child.id]

    def test_an_unregistered_workflow_forks_through_the_store(self, admin_client):
        chain = chain_run("legacy-fork", 3)
        url = fork_url("legacy-fork", chain[0].id)
        admin_client.post(url, {"state": '{"n": 42}', "post": "yes"})
        child = OrmSnapshotStore().latest("legacy-fork")
        assert (child.seq, child.parent_id, child.state) == (4, chain[0].id, {"n": 42})

    def test_a_failing_fork_is_reported(self, admin_client, orders, monkeypatch):
        cid, history = completed_run(orders)

        def refuse(*args: Any) -> Any:
            raise RuntimeError("store is read-only")

        monkeypatch.setattr(OrmSnapshotStore, "fork", refuse)
        response = admin_client.post(fork_url(cid, history[1].id), {"state": "{}", "post": "yes"})
        assert response.status_code == 200
        assert "The fork failed: RuntimeError: store is read-only" in page(response)

    def test_needs_the_fork_permission(self, client, orders):
        cid, history = completed_run(orders)
        url = fork_url(cid, history[1].id)
        client.force_login(staff("viewer", "view_workflowrun", "view_snapshotrecord"))
        body = page(client.get(snapshot_url(cid, history[1].id)))
        assert "&quot;reserved&quot;: true" in body
        assert url not in body and "Fork from this snapshot" not in body
        assert client.get(url).status_code == 403
        assert client.post(url, {"state": "{}", "post": "yes"}).status_code == 403
        assert SnapshotRecord.objects.filter(coordination_id=cid).count() == 4

        client.force_login(
            staff("forker", "view_workflowrun", "view_snapshotrecord", "fork_workflowrun")
        )
        body = page(client.get(snapshot_url(cid, history[1].id)))
        assert f'href="{url}" class="flowwarden-fork"' in body
        assert client.get(url).status_code == 200

    def test_snapshot_pages_need_the_snapshot_permission(self, client, orders):
        """As in the API: ``view_workflowrun`` shows the run, not its states."""
        cid, history = completed_run(orders)
        client.force_login(staff("runs-only", "view_workflowrun", "fork_workflowrun"))
        body = page(client.get(run_url(cid)))
        assert tree_url(cid) not in body
        assert client.get(tree_url(cid)).status_code == 403
        assert client.get(nodes_url(cid)).status_code == 403
        response = client.get(snapshot_url(cid, history[1].id))
        assert response.status_code == 403 and b"reserved" not in response.content
        assert client.get(fork_url(cid, history[1].id)).status_code == 403
        client.force_login(staff("reader", "view_workflowrun", "view_snapshotrecord"))
        assert tree_url(cid) in page(client.get(run_url(cid)))
        assert client.get(snapshot_url(cid, history[1].id)).status_code == 200

    def test_without_view_permission_nothing_is_shown(self, client, orders):
        cid, history = completed_run(orders)
        client.force_login(staff("outsider", "fork_workflowrun"))
        assert client.get(CHANGELIST).status_code == 403
        assert client.get(tree_url(cid)).status_code == 403
        assert client.get(nodes_url(cid)).status_code == 403
        assert client.get(snapshot_url(cid, history[0].id)).status_code == 403
        assert (
            client.post(fork_url(cid, history[0].id), {"state": "{}", "post": "yes"}).status_code
            == 403
        )

    def test_csrf_is_required(self, orders):
        from django.test import Client

        cid, history = completed_run(orders)
        client = Client(enforce_csrf_checks=True)
        client.force_login(User.objects.create_superuser("root", "r@example.com", "pw"))
        response = client.post(fork_url(cid, history[1].id), {"state": "{}", "post": "yes"})
        assert response.status_code == 403
        assert SnapshotRecord.objects.filter(coordination_id=cid).count() == 4


def test_the_admin_is_registered() -> None:
    from django.contrib import admin

    assert isinstance(admin.site._registry[WorkflowRun], WorkflowRunAdmin)


# -- versions ------------------------------------------------------------------------


def test_the_upgrade_action_applies_declared_upgrades_for_who_may(client: Any) -> None:
    from django.contrib.admin.models import LogEntry

    from flowwarden_django.workflows import hibernate
    from flowwarden_django.workflows.operations.upgrades import upgrade_registry

    @step("first")
    def first(state: dict[str, Any]) -> Any:
        return hibernate({**state, "first": True})

    @step("last")
    def last(state: dict[str, Any]) -> Any:
        return done({**state, "last": True})

    store = OrmSnapshotStore()
    Workflow.define("admin-v", [first, last], store)
    try:
        cid = Workflow.start("admin-v", {}).coordination_id
        workflow_registry.unregister("admin-v")
        Workflow.define("admin-v", [last], store, version=2)
        Workflow.define_upgrade("admin-v", from_version=1, to_version=2, steps={"first": None})
        viewer = staff("viewer", "view_workflowrun")
        client.force_login(viewer)
        body = page(client.get(CHANGELIST))
        assert 'name="action"' not in body  # no action for a viewer
        assert "admin-v" in body and "v1</span>" in body

        operator = staff("operator", "view_workflowrun", "upgrade_workflowrun")
        client.force_login(operator)
        response = client.post(
            CHANGELIST,
            {"action": "upgrade_selected", "_selected_action": [cid]},
            follow=True,
        )
        assert "Upgraded 1 run." in page(response)
        run = WorkflowRun.objects.get(pk=cid)
        assert (run.workflow_version, run.status) == (2, "hibernated")
        entry = LogEntry.objects.get(object_id=cid)
        assert entry.user == operator and "to version 2" in entry.get_change_message()
        detail = page(client.get(run_url(cid)))
        assert "Version:" in detail or ">version<" in detail.lower()
    finally:
        workflow_registry.unregister("admin-v")
        upgrade_registry.unregister("admin-v")


def test_cancel_action_needs_its_permission_and_cancels_with_a_history_entry(client) -> None:
    """Issue 31: a viewer has no cancel action; an operator with
    ``cancel_workflowrun`` cancels the selected runs (a sleeping one and a completed
    one: only the first changes), each with a history entry; the list and the page
    show a sleeping run's wake time, the tree a step's duration and failed attempts."""
    from django.contrib.admin.models import LogEntry

    from flowwarden_django.workflows import sleep

    tries = {"n": 0}

    @step("flaky", max_retries=1, retry_delay=0)
    def flaky(state: dict[str, Any]) -> Any:
        tries["n"] += 1
        if tries["n"] == 1:
            raise ConnectionError("carrier down")
        return advance(state)

    @step("nap")
    def nap(state: dict[str, Any]) -> Any:
        return sleep(state, timedelta(hours=3))

    Workflow.define("admin-sleepy", [flaky, nap, step("after")(advance)], OrmSnapshotStore())
    Workflow.define("admin-quick", [step("only")(advance)], OrmSnapshotStore())
    try:
        sleeping = Workflow.start("admin-sleepy", {}).coordination_id
        finished = Workflow.start("admin-quick", {}).coordination_id
        viewer = staff("viewer", "view_workflowrun", "view_snapshotrecord")
        client.force_login(viewer)
        body = page(client.get(CHANGELIST))
        assert "cancel_selected" not in body
        assert "(wakes <time datetime=" in body
        detail = page(client.get(run_url(sleeping)))
        assert "Wakes at:" in detail
        tree = page(client.get(tree_url(sleeping)))
        assert 'class="fw-duration"' in tree
        assert "2 attempts" in tree and "#1 ConnectionError" in tree
        assert "carrier down" not in tree  # messages only where the state shows
        history = Workflow.for_coordination(sleeping).history()
        snapshot = page(client.get(snapshot_url(sleeping, history[1].id)))
        assert "carrier down" in snapshot

        operator = staff("operator", "view_workflowrun", "cancel_workflowrun")
        client.force_login(operator)
        response = client.post(
            CHANGELIST,
            {"action": "cancel_selected", "_selected_action": [sleeping, finished]},
            follow=True,
        )
        text = page(response)
        assert "Cancelled 1 run." in text and "1 selected run was already finished" in text
        assert WorkflowRun.objects.get(pk=sleeping).status == "cancelled"
        assert WorkflowRun.objects.get(pk=finished).status == "completed"
        entry = LogEntry.objects.get(object_id=sleeping)
        assert entry.user == operator and "Cancelled" in entry.get_change_message()
        client.force_login(viewer)
        assert "fw-badge-cancelled" in page(client.get(tree_url(sleeping)))
    finally:
        workflow_registry.unregister("admin-sleepy")
        workflow_registry.unregister("admin-quick")


def test_a_parent_s_page_and_tree_link_its_child_runs(client) -> None:
    from flowwarden_django.workflows import hibernate, spawn

    Workflow.define("admin-kid", [step("wait")(hibernate)], OrmSnapshotStore())
    Workflow.define(
        "admin-parent",
        [step("fan")(lambda s: spawn(s, [("admin-kid", {}), ("admin-kid", {})]))],
        OrmSnapshotStore(),
    )
    try:
        cid = Workflow.start("admin-parent", {}).coordination_id
        kids = sorted(
            WorkflowRun.objects.filter(parent_coordination_id=cid).values_list("pk", flat=True)
        )
        client.force_login(staff("viewer", "view_workflowrun", "view_snapshotrecord"))
        parent_page = page(client.get(run_url(cid)))
        assert "Child runs:" in parent_page and all(kid in parent_page for kid in kids)
        assert "Waiting for child runs" in parent_page
        kid_page = page(client.get(run_url(kids[0])))
        assert "Parent run:" in kid_page and run_url(cid) in kid_page
        assert "started 2 child runs" in page(client.get(tree_url(cid)))
    finally:
        workflow_registry.unregister("admin-parent")
        workflow_registry.unregister("admin-kid")
