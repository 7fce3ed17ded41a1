"""``manage.py flowwarden_workflows`` through ``call_command``: the ORM snapshot store on
the SQLite default database (and the in-memory store where a path differs)."""

from __future__ import annotations

import io
import json
import re
import sys
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from flowwarden_django.management.commands import flowwarden_workflows
from flowwarden_django.management.workflows_cli import maintenance
from flowwarden_django.management.workflows_cli.listing import snapshot_tree
from flowwarden_django.models import SnapshotRecord, WorkflowRun
from flowwarden_django.workflows import (
    Pause,
    RunStatus,
    StepContext,
    Workflow,
    WorkflowSnapshot,
    advance,
    done,
    fail,
    hibernate,
    snapshot_stores,
    step,
    workflow_registry,
)
from flowwarden_django.workflows.definition.metadata import LAST_STEP
from flowwarden_django.workflows.runs.records import RunRecords, run_lease

pytestmark = pytest.mark.django_db(transaction=True)

ORDERS, APPROVAL, FLAKY = "cmd.orders", "cmd.approval", "cmd.flaky"
MEMORY = "flowwarden_django.workflows.backends.memory.InMemorySnapshotStore"
ORM = "flowwarden_django.workflows.backends.orm.OrmSnapshotStore"


class TTYInput(io.StringIO):
    def isatty(self) -> bool:
        return True


class AwaitDecision(Pause):
    """Pause until someone decides (status ``waiting``)."""

    status = RunStatus.WAITING


@step("reserve")
def reserve(state: dict[str, Any]) -> Any:
    return advance({**state, "reserved": True})


@step("ask")
def ask(state: dict[str, Any]) -> Any:
    return hibernate({**state, "asked": True})


@step("ship")
def ship(state: dict[str, Any], ctx: StepContext) -> Any:
    return done({**state, "shipped": True, "input": ctx.input})


@step("prepare")
def prepare(state: dict[str, Any]) -> Any:
    return advance({**state, "prepared": True})


@step("wait")
def wait(state: dict[str, Any]) -> Any:
    return AwaitDecision({**state, "waiting": True})


@step("decide")
def decide(state: dict[str, Any], ctx: StepContext) -> Any:
    return done({**state, "decision": ctx.input})


STOCK = {"available": False}


@step("pick")
def pick(state: dict[str, Any]) -> Any:
    if not STOCK["available"]:
        return fail("out of stock")
    return done({**state, "picked": True})


def until_blank(lines: list[str]) -> list[str]:
    """*lines* up to the first blank one (the end of a section of ``show``)."""
    return lines[: lines.index("")] if "" in lines else lines


@pytest.fixture(autouse=True)
def workflows() -> Any:
    STOCK["available"] = False
    Workflow.define(ORDERS, [reserve, ask, ship])
    Workflow.define(APPROVAL, [prepare, wait, decide])
    Workflow.define(FLAKY, [reserve, pick])
    yield
    for name in (ORDERS, APPROVAL, FLAKY):
        workflow_registry.unregister(name)


@pytest.fixture
def non_interactive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO())


@pytest.fixture
def answer(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(sys, "stdin", TTYInput())

    def set_answer(text: str) -> None:
        monkeypatch.setattr("builtins.input", lambda *args: text)

    return set_answer


def run(*args: str, **options: Any) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("flowwarden_workflows", *args, stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


def start(name: str, state: Any = None) -> str:
    return Workflow.start(name, state if state is not None else {"order": 7}).coordination_id


def history(cid: str) -> list[WorkflowSnapshot]:
    return Workflow.for_coordination(cid).history()


def make_run(cid: str, name: str, created_at: Any, status: str = RunStatus.COMPLETED) -> None:
    WorkflowRun.objects.create(
        coordination_id=cid,
        workflow_name=name,
        status=status,
        created_at=created_at,
        updated_at=created_at,
    )


# -- list ------------------------------------------------------------------------------


def test_list_without_runs() -> None:
    assert run("list")[0] == "No workflow runs.\n"
    out, _ = run("list", "--status", "failed", "--workflow", ORDERS)
    assert out == f"No workflow runs with status 'failed' and workflow '{ORDERS}'.\n"


def test_list_shows_runs_newest_first_with_status_step_snapshots_and_age() -> None:
    hibernated = start(ORDERS)
    failed = start(FLAKY)
    waiting = start(APPROVAL)

    out, _ = run("list")

    header, *lines = out.splitlines()
    assert header.split() == [
        "COORDINATION",
        "WORKFLOW",
        "STATUS",
        "LAST",
        "STEP",
        "SNAPSHOTS",
        "STARTED",
        "UPDATED",
    ]
    assert [line.split()[0] for line in lines] == [waiting, failed, hibernated]
    assert lines[0].split()[1:5] == [APPROVAL, "waiting", "wait", "3"]
    assert lines[1].split()[1:5] == [FLAKY, "failed", "reserve", "2"]
    assert lines[2].split()[1:5] == [ORDERS, "hibernated", "ask", "3"]
    assert lines[2].split()[5:] == ["0s", "ago", "0s", "ago"]


def test_list_filters_and_limits() -> None:
    now = timezone.now()
    for number in range(5):
        make_run(f"old-{number}", ORDERS, now - timedelta(days=5 - number))
    make_run("other", FLAKY, now, status=RunStatus.FAILED)

    out, _ = run("list", "--workflow", ORDERS, "--limit", "2")
    lines = out.splitlines()
    assert [line.split()[0] for line in lines[1:3]] == ["old-4", "old-3"]
    assert lines[3] == "(the newest 2; --limit 0 shows all)"
    assert "1d ago" in lines[1] and "2d ago" in lines[2]

    out, _ = run("list", "--status", "failed")
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["other"]
    out, _ = run("list", "--limit", "0")
    assert len(out.splitlines()) == 7


def test_list_json() -> None:
    cid = start(ORDERS)
    out, _ = run("list", "--json")
    [item] = json.loads(out)
    assert item["coordination_id"] == cid
    assert item["workflow_name"] == ORDERS
    assert (item["status"], item["last_step"], item["snapshots"]) == ("hibernated", "ask", 3)
    assert item["head_snapshot_id"] == history(cid)[-1].id
    assert item["runner"] == "" and item["claimed_until"] is None
    assert item["created_at"].endswith("+00:00")


def test_list_counts_snapshots_of_unregistered_workflows_in_the_default_store() -> None:
    cid = start(ORDERS)
    workflow_registry.unregister(ORDERS)
    [item] = json.loads(run("list", "--json")[0])
    assert item["coordination_id"] == cid and item["snapshots"] == 3


def test_list_bad_arguments() -> None:
    with pytest.raises(CommandError, match="invalid choice: 'asleep'"):
        run("list", "--status", "asleep")
    with pytest.raises(CommandError, match="must be at least 0, not -1"):
        run("list", "--limit", "-1")
    with pytest.raises(CommandError, match="'many' is not a whole number"):
        run("list", "--limit", "many")


def test_an_unknown_store_alias_names_the_configured_ones() -> None:
    start(ORDERS)
    with pytest.raises(
        CommandError, match=r"No snapshot store 'nope'.*configured aliases: default"
    ):
        run("show", "whatever", "--store", "nope")


# -- show ------------------------------------------------------------------------------


def test_show_a_run_and_its_chain() -> None:
    cid = start(ORDERS)
    snapshots = history(cid)

    out, _ = run("show", cid)

    lines = out.splitlines()
    fields = dict(line.split(":", 1) for line in lines[: lines.index("")])
    fields = {label: value.strip() for label, value in fields.items()}
    assert fields["Coordination"] == cid
    assert fields["Workflow"] == ORDERS
    assert fields["Status"] == "hibernated"
    assert fields["Last step"] == "ask"
    assert fields["Head snapshot"] == snapshots[-1].id
    assert fields["Runner"] == "—"
    assert "Failure reason" not in fields
    tree = until_blank(lines[lines.index("") + 1 :])
    assert tree[0] == "Snapshots (3):"
    assert [line.split()[:3] for line in tree[1:]] == [
        ["#1", "(start)", snapshots[0].id],
        ["#2", "reserve", snapshots[1].id],
        ["#3", "ask", snapshots[2].id],
    ]
    assert all(line.startswith("  #") for line in tree[1:])
    assert tree[-1].endswith("(head)")
    assert "state:" not in out


def test_show_draws_forks_as_an_indented_tree() -> None:
    cid = start(ORDERS)
    first, second, third = history(cid)
    workflow = Workflow.for_coordination(cid)
    fork = workflow.fork(second.id, {"order": 8})  # seq 4, off #2
    fork_child = workflow.store.save(fork.derive_with({"order": 9}))  # seq 5
    other_fork = workflow.fork(first.id, {"order": 10})  # seq 6, off #1

    out, _ = run("show", cid, "--state")

    tree = until_blank(out.splitlines()[out.splitlines().index("Snapshots (6):") + 1 :])
    entries = [line for line in tree if "state:" not in line]
    assert [re.search(r"(└─ )?#\d+", line).group(0) for line in entries] == [
        "#1",
        "└─ #6",
        "#2",
        "└─ #4",
        "#5",
        "#3",
    ]
    assert entries[0].startswith("  #1")
    assert entries[1].startswith("      └─ #6") and "(fork of #1, head)" in entries[1]
    assert entries[2].startswith("  #2")
    assert entries[3].startswith("      └─ #4") and "(fork of #2)" in entries[3]
    assert entries[4].startswith("         #5") and fork_child.id in entries[4]
    assert entries[5].startswith("  #3") and third.id in entries[5]
    states = [line.strip() for line in tree if "state:" in line]
    assert states[0] == 'state: {"order": 7}'
    assert states[1] == 'state: {"order": 10}'
    assert other_fork.seq == 6


def test_show_json() -> None:
    cid = start(ORDERS)
    first, second, third = history(cid)
    fork = Workflow.for_coordination(cid).fork(first.id, {"order": 1})

    value = json.loads(run("show", cid, "--json")[0])
    assert value["run"]["coordination_id"] == cid
    assert value["run"]["status"] == "hibernated"
    snapshots = value["snapshots"]
    assert [s["seq"] for s in snapshots] == [1, 2, 3, 4]
    assert [s["id"] for s in snapshots] == [first.id, second.id, third.id, fork.id]
    assert [s["step"] for s in snapshots] == ["", "reserve", "ask", ""]
    assert [(s["depth"], s["fork"]) for s in snapshots] == [
        (0, False),
        (0, False),
        (0, False),
        (1, True),
    ]
    assert snapshots[3]["parent_id"] == first.id
    assert "state" not in snapshots[0]
    with_state = json.loads(run("show", cid, "--json", "--state")[0])
    assert with_state["snapshots"][2]["state"] == {"order": 7, "reserved": True, "asked": True}


def test_show_a_failed_run_of_an_unregistered_workflow() -> None:
    cid = start(FLAKY)
    workflow_registry.unregister(FLAKY)

    out, _ = run("show", cid)

    assert f"{FLAKY} (not defined in this process)" in out
    assert "Failure reason:   out of stock" in out
    assert "Snapshots (2):" in out


def test_show_snapshots_without_a_run() -> None:
    store = snapshot_stores["default"]
    root = store.save(WorkflowSnapshot.root("loose", {"x": 1}))
    store.save(root.derive_with({"x": 2}))

    out, _ = run("show", "loose")

    assert "no WorkflowRun" in out
    assert "Snapshots (2):" in out
    assert out.splitlines()[-1].split()[:2] == ["#2", "—"]


def test_show_marks_snapshots_whose_parent_is_gone() -> None:
    cid = start(ORDERS)
    first = history(cid)[0]
    snapshot_stores["default"].delete(first.id)

    out, _ = run("show", cid)

    assert f"(parent {first.id} is gone)" in out


def test_show_unknown_coordination() -> None:
    with pytest.raises(CommandError) as caught:
        run("show", "nope")
    assert str(caught.value) == (
        "No workflow run 'nope' and no snapshots of it in snapshot store 'default'. "
        "Run `manage.py flowwarden_workflows list` to see the runs, or pass --store ALIAS "
        "to look in another store."
    )


def test_snapshot_tree_keeps_orphans_and_survives_a_parent_cycle() -> None:
    a = WorkflowSnapshot("a", "c", parent_id="b", seq=1)
    b = WorkflowSnapshot("b", "c", parent_id="a", seq=2)
    lonely = WorkflowSnapshot("z", "c", parent_id="gone", seq=3)
    assert snapshot_tree([a, b, lonely]) == [(0, False, lonely), (0, False, a), (0, False, b)]


# -- resume ----------------------------------------------------------------------------


def test_resume_a_hibernated_run_with_input_shows_progress() -> None:
    cid = start(ORDERS)

    out, _ = run("resume", cid, "--input", '{"carrier": "ups"}')

    lines = out.splitlines()
    assert lines[0] == (
        f"Resuming run '{cid}' of workflow '{ORDERS}' (hibernated, after step 'ask') with input..."
    )
    assert lines[1].startswith("  step 'ship' done (")
    assert lines[2] == f"Run '{cid}' completed (1 step in {lines[2].split(' in ')[1]}"
    run_record = WorkflowRun.objects.get(pk=cid)
    assert run_record.status == RunStatus.COMPLETED
    assert history(cid)[-1].state["input"] == {"carrier": "ups"}


def test_resume_a_waiting_run() -> None:
    cid = start(APPROVAL)

    out, _ = run("resume", cid)
    assert "is waiting for approval after step 'wait' (0 steps" in out
    assert f"resume {cid} --input" in out
    assert WorkflowRun.objects.get(pk=cid).status == RunStatus.WAITING

    out, _ = run("resume", cid, "--input", '"yes"')
    assert f"Run '{cid}' completed (1 step" in out
    assert history(cid)[-1].state["decision"] == "yes"


def test_resume_a_completed_run_runs_nothing() -> None:
    cid = start(ORDERS)
    run("resume", cid)
    out, _ = run("resume", cid)
    assert out == f"Run '{cid}' is completed: nothing to resume.\n"


def test_resume_a_failed_run() -> None:
    cid = start(FLAKY)
    with pytest.raises(CommandError) as caught:
        run("resume", cid)
    assert str(caught.value).startswith(f"Run '{cid}' failed at step 'pick' (0 steps in ")
    assert str(caught.value).endswith(
        f"out of stock. Fix the cause, then `manage.py flowwarden_workflows resume {cid}` "
        "runs the step again."
    )
    STOCK["available"] = True
    out, _ = run("resume", cid)
    assert "step 'pick' done" in out and "completed (1 step" in out


def test_resume_bad_input() -> None:
    cid = start(ORDERS)
    with pytest.raises(CommandError) as caught:
        run("resume", cid, "--input", "{approved: true}")
    message = str(caught.value)
    assert message.startswith("--input is not valid JSON: Expecting property name")
    assert "'{approved: true}'" in message
    assert "Quote it for the shell" in message and "--input '{\"approved\": true}'" in message
    assert WorkflowRun.objects.get(pk=cid).status == RunStatus.HIBERNATED


def test_resume_an_unknown_run() -> None:
    with pytest.raises(CommandError) as caught:
        run("resume", "nope")
    assert str(caught.value) == (
        "No workflow run 'nope'. Run `manage.py flowwarden_workflows list` to see the runs."
    )


def test_resume_a_run_of_an_unregistered_workflow_names_the_registered_ones() -> None:
    cid = start(ORDERS)
    workflow_registry.unregister(ORDERS)
    with pytest.raises(CommandError) as caught:
        run("resume", cid)
    assert APPROVAL in workflow_registry.names()
    assert str(caught.value).startswith(
        f"Run '{cid}' is a run of workflow '{ORDERS}', which is not defined in this process "
        f"(defined: {', '.join(workflow_registry.names())}). Define it with Workflow.define()"
    )


def test_resume_a_run_another_runner_holds() -> None:
    cid = start(ORDERS)
    RunRecords().claim(cid, "elsewhere", run_lease())
    with pytest.raises(CommandError, match=r"being run by elsewhere until .* then resume again"):
        run("resume", cid)
    assert WorkflowRun.objects.get(pk=cid).status == RunStatus.HIBERNATED


# -- fork ------------------------------------------------------------------------------


def test_fork_with_yes_and_resume_from_the_fork() -> None:
    cid = start(ORDERS)
    second = history(cid)[1]

    out, _ = run("fork", second.id, "--state", '{"order": 8, "reserved": true}', "--yes")

    assert f"Fork snapshot {second.id} (#2, after step 'reserve') of coordination '{cid}'" in out
    assert 'current state: {"order": 7, "reserved": true}' in out
    assert 'new state:     {"order": 8, "reserved": true}' in out
    assert "The fork becomes the newest snapshot (#4, after #3)" in out
    fork = history(cid)[-1]
    assert (fork.parent_id, fork.seq, fork.state) == (second.id, 4, {"order": 8, "reserved": True})
    assert f"Forked {second.id} as {fork.id} (#4) in coordination '{cid}'." in out
    assert f"Continue the run from it with `manage.py flowwarden_workflows resume {cid}`." in out

    run("resume", cid)  # continues after 'reserve': ask (hibernates) on the fork's state
    latest = history(cid)[-1]
    assert latest.parent_id == fork.id and latest.metadata[LAST_STEP] == "ask"
    assert latest.state == {"order": 8, "reserved": True, "asked": True}


def test_fork_asks_for_confirmation(answer: Any) -> None:
    cid = start(ORDERS)
    second = history(cid)[1]

    answer("no")
    out, _ = run("fork", second.id, "--state", "{}")
    assert out.endswith("Type 'yes' to continue: Fork cancelled.\n")
    assert len(history(cid)) == 3

    answer("yes")
    out, _ = run("fork", second.id, "--state", "{}")
    assert "Forked" in out and len(history(cid)) == 4


def test_fork_without_a_terminal_needs_yes(non_interactive: None) -> None:
    cid = start(ORDERS)
    with pytest.raises(CommandError) as caught:
        run("fork", history(cid)[1].id, "--state", "{}")
    assert str(caught.value) == (
        "Fork needs a confirmation but stdin is not interactive; pass --yes to proceed "
        "without asking."
    )
    assert len(history(cid)) == 3
    run("fork", history(cid)[1].id, "--state", "{}", "--no-input")
    assert len(history(cid)) == 4


def test_fork_warns_when_a_runner_holds_the_run() -> None:
    cid = start(ORDERS)
    RunRecords().claim(cid, "elsewhere", run_lease())
    out, _ = run("fork", history(cid)[0].id, "--state", "1", "--yes")
    assert "Runner elsewhere holds the run until" in out


def test_fork_bad_input() -> None:
    cid = start(ORDERS)
    with pytest.raises(CommandError, match=r"--state is not valid JSON: .*Quote it for the shell"):
        run("fork", history(cid)[0].id, "--state", "nope", "--yes")
    with pytest.raises(CommandError) as caught:
        run("fork", "missing", "--state", "{}", "--yes")
    assert str(caught.value) == (
        "No snapshot 'missing' in snapshot store 'default'. `manage.py flowwarden_workflows "
        "show COORDINATION` lists a run's snapshot ids; pass --store ALIAS for another store."
    )
    with pytest.raises(CommandError, match="the following arguments are required: --state"):
        run("fork", history(cid)[0].id)


# -- prune -----------------------------------------------------------------------------


def chain(cid: str, length: int, *, days_old: int = 0) -> list[WorkflowSnapshot]:
    """A chain of *length* snapshots written directly to the default store."""
    store = snapshot_stores["default"]
    created = timezone.now() - timedelta(days=days_old)
    head = store.save(WorkflowSnapshot.root(cid, 0).replace(created_at=created))
    saved = [head]
    for number in range(1, length):
        head = store.save(head.derive_with(number, created_at=created))
        saved.append(head)
    return saved


def remaining(cid: str) -> list[int]:
    return sorted(SnapshotRecord.objects.filter(coordination_id=cid).values_list("seq", flat=True))


def test_prune_needs_a_rule_and_valid_values() -> None:
    with pytest.raises(CommandError) as caught:
        run("prune", "--yes")
    assert str(caught.value) == (
        "prune needs --keep-last N, --older-than AGE or both, for example "
        "`manage.py flowwarden_workflows prune --keep-last 10 --older-than 30d`."
    )
    with pytest.raises(CommandError) as caught:
        run("prune", "--older-than", "a month", "--yes")
    assert str(caught.value) == (
        "--older-than 'a month' is not an age: use a number with s, m, h, d or w, for example "
        "--older-than 30d or --older-than 12h."
    )
    with pytest.raises(CommandError, match="must be at least 1, not 0"):
        run("prune", "--keep-last", "0", "--yes")


def test_prune_dry_run_deletes_nothing() -> None:
    chain("a", 5)
    chain("b", 2)

    out, _ = run("prune", "--keep-last", "2", "--dry-run")

    assert out.splitlines() == [
        "Dry run: keep the last 2 of each coordination; nothing is deleted.",
        "  a: would delete 3 of 5 snapshots",
        "Would delete 3 snapshots from 1 of 2 coordinations in snapshot store 'default'.",
    ]
    assert remaining("a") == [1, 2, 3, 4, 5]


def test_prune_keep_last_with_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flowwarden_workflows.Command, "progress_interval", 0)
    for name in ("a", "b", "c"):
        chain(name, 4)

    out, _ = run("prune", "--keep-last", "1", "--yes")

    lines = out.splitlines()
    assert lines[0].startswith(
        "Prune snapshots of every coordination in snapshot store 'default': keep the last 1 "
        "of each coordination. Never deleted:"
    )
    assert [line.split("(")[0] for line in lines[2:4]] == [
        "  1/3 coordinations, 3 snapshots deleted ",
        "  2/3 coordinations, 6 snapshots deleted ",
    ]
    assert lines[-1] == "Deleted 9 snapshots from 3 coordinations in snapshot store 'default'."
    assert [remaining(name) for name in ("a", "b", "c")] == [[4], [4], [4]]


def test_prune_older_than_one_coordination() -> None:
    chain("old", 3, days_old=40)
    chain("also-old", 3, days_old=40)
    chain("new", 3)

    out, _ = run("prune", "--older-than", "30d", "--coordination", "old", "--yes")

    assert out.splitlines()[-1] == (
        "Deleted 2 snapshots from 1 coordination in snapshot store 'default'."
    )
    assert (remaining("old"), remaining("also-old"), remaining("new")) == (
        [3],
        [1, 2, 3],
        [1, 2, 3],
    )


def test_prune_keeps_the_head_of_a_waiting_run_and_a_forks_ancestors() -> None:
    waiting = start(APPROVAL)  # seed, prepare, wait: waiting at #3
    forked = start(ORDERS)
    # #4, off #1. Workflow.fork would end the wait (the run hibernates, its approval is
    # cancelled); a fork made in the store alone leaves the run waiting at #3.
    store = Workflow.for_coordination(waiting).store
    store.fork(history(waiting)[0].id, {"x": 1})
    Workflow.for_coordination(forked).fork(history(forked)[0].id, {"x": 1})

    out, _ = run("prune", "--keep-last", "1", "--dry-run")
    assert "Would delete 3 snapshots from 2 of 2 coordinations" in out

    out, _ = run("prune", "--keep-last", "1", "--yes")

    assert out.splitlines()[-1].startswith("Deleted 3 snapshots")
    # #4 is the newest and a fork of #1; #3 is the head of the run waiting for approval.
    assert remaining(waiting) == [1, 3, 4]
    assert remaining(forked) == [1, 4]


def test_prune_without_a_terminal_needs_yes(non_interactive: None) -> None:
    chain("a", 3)
    with pytest.raises(CommandError, match=r"Prune needs a confirmation .* pass --yes"):
        run("prune", "--keep-last", "1")
    assert remaining("a") == [1, 2, 3]


def test_prune_asks_for_confirmation(answer: Any) -> None:
    chain("a", 3)
    answer("nope")
    out, _ = run("prune", "--keep-last", "1")
    assert out.endswith("Prune cancelled.\n")
    assert remaining("a") == [1, 2, 3]


@override_settings(
    FLOWWARDEN={
        "SNAPSHOT_STORES": {
            "default": {"BACKEND": ORM},
            "mem": {"BACKEND": MEMORY, "OPTIONS": {"max_snapshots": 100_000}},
        }
    }
)
def test_prune_and_show_on_the_in_memory_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(maintenance, "PAGE", 3)  # several list pages
    store = snapshot_stores["mem"]
    cids = [f"m-{uuid.uuid4().hex[:6]}" for _ in range(3)]
    for cid in cids:
        head = store.save(WorkflowSnapshot.root(cid, 0))
        for number in range(1, 4):
            head = store.save(head.derive_with(number))

    out, _ = run("show", cids[0], "--store", "mem")
    assert "Snapshots (4):" in out

    out, _ = run("prune", "--keep-last", "2", "--store", "mem", "--dry-run")
    assert out.splitlines()[-1] == (
        "Would delete 6 snapshots from 3 of 3 coordinations in snapshot store 'mem'."
    )
    out, _ = run("prune", "--keep-last", "2", "--store", "mem", "--yes")
    assert out.splitlines()[-1] == (
        "Deleted 6 snapshots from 3 coordinations in snapshot store 'mem'."
    )
    assert sorted(s.seq for s in store.list() if s.coordination_id == cids[1]) == [3, 4]


# -- recover ---------------------------------------------------------------------------


def test_recover_continues_a_stalled_run_and_leaves_the_others() -> None:
    hibernated = start(ORDERS)  # paused on purpose: never touched by recover
    stalled = start(FLAKY)  # failed at "pick"; made to look like a run whose process died
    long_ago = timezone.now() - timedelta(hours=1)
    WorkflowRun.objects.filter(pk=stalled).update(
        status=RunStatus.RUNNING, runner="", claimed_until=None, updated_at=long_ago
    )
    STOCK["available"] = True

    out, _ = run("recover", "--dry-run")
    assert stalled in out and hibernated not in out and "1 stalled run(s)" in out
    assert WorkflowRun.objects.get(pk=stalled).status == RunStatus.RUNNING

    out, _ = run("recover")
    assert f"Continuing {stalled}" in out and "Completed" in out
    assert WorkflowRun.objects.get(pk=stalled).status == RunStatus.COMPLETED
    assert WorkflowRun.objects.get(pk=hibernated).status == RunStatus.HIBERNATED
    assert "0 stalled run(s) continued." in run("recover")[0]


@pytest.mark.parametrize("interval", ["0s", "-1", "soon", "2d"])
def test_recover_every_refuses_what_is_not_an_interval(interval: str) -> None:
    with pytest.raises(CommandError, match=r"--every .* is not an interval: .* --every 2s"):
        run("recover", "--every", interval)


def test_resume_of_a_run_waiting_for_its_approval_points_to_the_approvals_command() -> None:
    from flowwarden_django.models import Approval
    from flowwarden_django.workflows import await_approval

    @step("ask")
    def ask_for_approval(state: dict[str, Any]) -> Any:
        return await_approval(state, "Ship it?")

    name = f"fw-cmd-approval-{uuid.uuid4().hex[:6]}"
    Workflow.define(name, [ask_for_approval, ship])
    try:
        cid = start(name)
        approval = Approval.objects.get(coordination_id=cid)
        with pytest.raises(CommandError) as refused:
            run("resume", cid, "--input", '{"approved": true}')
    finally:
        workflow_registry.unregister(name)
    message = str(refused.value)
    assert "a resume input is no decision" in message
    assert f"manage.py flowwarden_approvals approve {approval.pk} --by USER" in message
    assert WorkflowRun.objects.get(pk=cid).status == RunStatus.WAITING


# -- cancel ----------------------------------------------------------------------------


def test_cancel_asks_cancels_and_leaves_finished_runs(non_interactive: None) -> None:
    hibernated = start(ORDERS)
    STOCK["available"] = True
    completed = start(FLAKY)
    assert WorkflowRun.objects.get(pk=completed).status == RunStatus.COMPLETED
    # No terminal: --yes is needed, and nothing changes without it.
    with pytest.raises(CommandError, match="pass --yes"):
        run("cancel", hibernated)
    assert WorkflowRun.objects.get(pk=hibernated).status == RunStatus.HIBERNATED
    out, _ = run("cancel", hibernated, completed, "--reason", "withdrawn", "--yes")
    assert f"Cancelled {hibernated!r}." in out
    assert f"Run {completed!r} is already completed: left alone." in out
    assert "1 run(s) cancelled." in out
    record = WorkflowRun.objects.get(pk=hibernated)
    assert (record.status, record.failure_reason) == (RunStatus.CANCELLED, "withdrawn")
    assert "by" in json.loads(history(hibernated)[-1].metadata["workflow.cancelled"])


def test_show_a_cancelled_run_labels_the_cancel_and_its_reason() -> None:
    """The cancel's snapshot is no step's (it repeats the position it cancelled at) and
    the run's reason is why it was cancelled, not a failure."""
    cid = start(ORDERS)
    run("cancel", cid, "--reason", "withdrawn", "--yes")
    snapshots = history(cid)

    out, _ = run("show", cid)

    lines = out.splitlines()
    fields = dict(line.split(":", 1) for line in lines[: lines.index("")])
    fields = {label: value.strip() for label, value in fields.items()}
    assert fields["Status"] == "cancelled"
    assert fields["Cancel reason"] == "withdrawn"
    assert "Failure reason" not in fields
    tree = until_blank(lines[lines.index("") + 2 :])
    assert [line.split()[:3] for line in tree] == [
        ["#1", "(start)", snapshots[0].id],
        ["#2", "reserve", snapshots[1].id],
        ["#3", "ask", snapshots[2].id],
        ["#4", "(cancel)", snapshots[3].id],
    ]


def test_cancel_of_an_unknown_run_changes_nothing() -> None:
    known = start(ORDERS)
    with pytest.raises(CommandError, match="No workflow run 'nope'; nothing was cancelled"):
        run("cancel", known, "nope", "--yes")
    assert WorkflowRun.objects.get(pk=known).status == RunStatus.HIBERNATED
