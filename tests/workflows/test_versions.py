"""Workflow versions (issue 30): runs record their version, continue on it, never
start over on code that lacks it, and move to another version by a declared upgrade."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from flowwarden_django.models import WorkflowRun
from flowwarden_django.workflows import (
    Completed,
    Hibernated,
    NeedsUpgrade,
    RunStatus,
    RunVersionError,
    VersionNotDefinedError,
    Workflow,
    advance,
    await_approval,
    hibernate,
    step,
    workflow_registry,
)
from flowwarden_django.workflows.backends.memory import InMemorySnapshotStore
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.operations.upgrades import (
    UPGRADE_METADATA,
    UpgradeError,
    WorkflowUpgrade,
    upgrade_registry,
    upgrade_runs,
)
from flowwarden_django.workflows.waiting.approvals import decide

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["memory", "orm"])
def store(request: pytest.FixtureRequest) -> Any:
    return InMemorySnapshotStore() if request.param == "memory" else OrmSnapshotStore()


@pytest.fixture
def name() -> Iterator[str]:
    """A workflow name of this test; its definitions and upgrades are forgotten after."""
    workflow = f"orders-{uuid.uuid4().hex[:8]}"
    yield workflow
    workflow_registry.unregister(workflow)
    upgrade_registry.unregister(workflow)


class Calls(Counter):
    """How many times each step ran."""


def counting(name: str, calls: Calls, outcome: Any = advance) -> Any:
    @step(name)
    def run(state: dict[str, Any]) -> Any:
        calls[name] += 1
        return outcome({**state, "path": [*state.get("path", []), name]})

    return run


def record(cid: str) -> WorkflowRun:
    return WorkflowRun.objects.get(pk=cid)


def deploy(name: str, steps: list[Any], store: Any, version: int) -> None:
    """What a deploy does to this process: its old definitions go, the new one comes."""
    workflow_registry.unregister(name)
    Workflow.define(name, steps, store, version=version)


def test_a_run_records_its_version_and_continues_on_it(name: str, store: Any) -> None:
    calls = Calls()
    Workflow.define(name, [counting("a", calls, hibernate), counting("b", calls)], store)
    Workflow.define(
        name, [counting("a2", calls, hibernate), counting("b2", calls)], store, version=2
    )
    assert workflow_registry.versions(name) == [1, 2]
    new = Workflow.start(name, {}).coordination_id  # the highest version
    old = workflow_registry.get(name, 1).start({}).coordination_id
    assert (record(new).workflow_version, record(old).workflow_version) == (2, 1)
    assert Workflow.for_coordination(old).version == 1
    assert isinstance(Workflow.for_coordination(old).resume(), Completed)
    assert isinstance(Workflow.for_coordination(new).resume(), Completed)
    assert calls == {"a": 1, "b": 1, "a2": 1, "b2": 1}
    # Another version's Workflow refuses the run, changing nothing.
    with pytest.raises(RunVersionError, match="version 1 of workflow"):
        workflow_registry.get(name, 2).workflow(old).run()


def test_a_deploy_that_removes_a_step_leaves_the_run_for_an_upgrade_that_continues_it_once(
    name: str, store: Any
) -> None:
    """The issue's story: v1 = [a, b, c], a run paused after a; v2 = [b2, c]."""
    calls = Calls()
    Workflow.define(
        name,
        [counting("a", calls, hibernate), counting("b", calls), counting("c", calls)],
        store,
    )
    cid = Workflow.start(name, {"amount": 5}).coordination_id
    assert record(cid).status == RunStatus.HIBERNATED

    deploy(name, [counting("b2", calls), counting("c", calls)], store, version=2)
    with pytest.raises(VersionNotDefinedError, match=f"run '{cid}' is on version 1"):
        Workflow.for_coordination(cid).resume()
    run = record(cid)
    assert (run.status, run.workflow_version) == (RunStatus.NEEDS_UPGRADE, 1)
    assert "version 1 of workflow" in run.failure_reason
    assert calls == {"a": 1}  # nothing ran again

    Workflow.define_upgrade(
        name,
        from_version=1,
        to_version=2,
        steps={"a": None},
        state=lambda state: {**state, "currency": "EUR"},
    )
    (dry,) = upgrade_runs(name, dry_run=True)
    assert (dry.upgraded, dry.from_step, dry.to_step, dry.to_version) == (True, "a", "", 2)
    assert record(cid).workflow_version == 1  # a dry run writes nothing

    (outcome,) = upgrade_runs(name, by="ops")
    assert outcome.upgraded and outcome.continued
    run = record(cid)
    assert (run.status, run.workflow_version) == (RunStatus.COMPLETED, 2)
    assert calls == {"a": 1, "b2": 1, "c": 1}
    history = Workflow.for_coordination(cid).history()
    assert [s.metadata["workflow.lastStep"] for s in history] == ["", "a", "", "b2", "c"]
    upgrade = json.loads(history[2].metadata[UPGRADE_METADATA])
    assert upgrade == {"from": 1, "to": 2, "step": "a", "by": "ops"}
    assert history[2].parent_id == history[1].id
    assert history[-1].state == {"amount": 5, "path": ["a", "b2", "c"], "currency": "EUR"}
    assert upgrade_runs(name) == []  # applied once


def test_an_upgrade_maps_renamed_steps_and_keeps_a_paused_run_paused(name: str, store: Any) -> None:
    calls = Calls()
    Workflow.define(
        name, [counting("a", calls), counting("b", calls, hibernate), counting("c", calls)], store
    )
    cid = Workflow.start(name, {}).coordination_id
    deploy(name, [counting("a", calls), counting("b2", calls), counting("c", calls)], store, 2)
    Workflow.define_upgrade(name, from_version=1, to_version=2, steps={"b": "b2"})
    (outcome,) = upgrade_runs(name)
    assert (outcome.from_step, outcome.to_step, outcome.continued) == ("b", "b2", False)
    assert record(cid).status == RunStatus.HIBERNATED
    assert isinstance(Workflow.for_coordination(cid).resume(), Completed)
    assert calls == {"a": 1, "b": 1, "c": 1}  # after b2: c, and nothing before it


def test_an_upgrade_refuses_a_step_it_does_not_map_and_changes_nothing(
    name: str, store: Any
) -> None:
    calls = Calls()
    Workflow.define(name, [counting("a", calls, hibernate), counting("b", calls)], store)
    cid = Workflow.start(name, {}).coordination_id
    deploy(name, [counting("b", calls)], store, version=2)
    Workflow.define_upgrade(name, from_version=1, to_version=2)
    (outcome,) = upgrade_runs(name)
    assert not outcome.upgraded
    assert "step 'a' of version 1 is not a step of version 2" in outcome.reason
    assert record(cid).workflow_version == 1
    assert len(Workflow(name, cid, [counting("a", calls)], store).history()) == 2


def test_a_waiting_run_keeps_its_approval_through_an_upgrade(name: str) -> None:
    calls = Calls()

    @step("review")
    def review(state: dict[str, Any]) -> Any:
        calls["review"] += 1
        return await_approval(state, prompt="OK?")

    @step("ship")
    def ship(state: dict[str, Any], ctx: Any) -> Any:
        calls["ship"] += 1
        return advance({**state, "decision": ctx.decision.decision})

    Workflow.define(name, [review, ship])
    cid = Workflow.start(name, {}).coordination_id
    assert record(cid).status == RunStatus.WAITING

    @step("review_v2")
    def review_v2(state: dict[str, Any]) -> Any:  # pragma: no cover - never reached
        raise AssertionError("the upgraded run asked again")

    deploy(name, [review_v2, ship], OrmSnapshotStore(), version=2)
    Workflow.define_upgrade(name, from_version=1, to_version=2, steps={"review": "review_v2"})
    (outcome,) = upgrade_runs(name)
    assert outcome.upgraded and record(cid).status == RunStatus.WAITING
    from flowwarden_django.models import Approval

    approval = Approval.objects.get(coordination_id=cid)
    assert approval.snapshot_id == record(cid).head_snapshot_id
    assert approval.step_name == "review_v2"
    decide(approval.pk, "approved", None, check_permission=False)
    run = record(cid)
    assert (run.status, run.workflow_version) == (RunStatus.COMPLETED, 2)
    assert calls == {"review": 1, "ship": 1}
    final = Workflow.for_coordination(cid).history()[-1].state
    assert final["decision"] == "approved"


def test_upgrades_chain_and_a_missing_target_version_refuses(name: str, store: Any) -> None:
    calls = Calls()
    Workflow.define(name, [counting("a", calls, hibernate), counting("b", calls)], store)
    cid = Workflow.start(name, {}).coordination_id
    Workflow.define_upgrade(name, from_version=1, to_version=2, steps={"a": "a2"})
    Workflow.define_upgrade(name, from_version=2, to_version=3, steps={"a2": "a3"})
    workflow_registry.unregister(name)
    Workflow.define(name, [counting("a3", calls), counting("b", calls)], store, version=3)
    (refused,) = upgrade_runs(name)
    assert "version 2 is not defined" in refused.reason and not refused.upgraded
    Workflow.define(name, [counting("a2", calls), counting("b", calls)], store, version=2)
    (outcome,) = upgrade_runs(name)
    assert (outcome.from_version, outcome.to_version, outcome.to_step) == (1, 3, "a3")
    assert record(cid).workflow_version == 3
    assert isinstance(Workflow.for_coordination(cid).resume(), Completed)
    assert calls == {"a": 1, "b": 1}


def test_declaring_a_bad_upgrade_or_version_is_an_error(name: str) -> None:
    with pytest.raises(UpgradeError, match="another version"):
        WorkflowUpgrade(name, 2, 2)
    with pytest.raises(UpgradeError, match="integer >= 1"):
        WorkflowUpgrade(name, 0, 2)
    with pytest.raises(UpgradeError, match="step names"):
        WorkflowUpgrade(name, 1, 2, steps={"a": 3})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="integer >= 1"):
        Workflow.define(name, [counting("a", Calls())], version=0)
    with pytest.raises(ValueError, match="integer >= 1"):
        Workflow.define(name, [counting("a", Calls())], version=True)  # type: ignore[arg-type]


def test_a_hibernated_run_of_a_version_defined_again_just_resumes(name: str, store: Any) -> None:
    calls = Calls()
    v1 = [counting("a", calls, hibernate), counting("b", calls)]
    Workflow.define(name, v1, store)
    cid = Workflow.start(name, {}).coordination_id
    deploy(name, [counting("x", calls)], store, version=2)
    with pytest.raises(VersionNotDefinedError):
        Workflow.for_coordination(cid)
    Workflow.define(name, v1, store, version=1)  # the old version, defined beside
    result = Workflow.for_coordination(cid).resume()
    assert isinstance(result, Completed) and not isinstance(result, Hibernated)
    assert calls == {"a": 1, "b": 1}


# -- before the deploy: the check and the commands ---------------------------------------


def stranded_messages(name: str) -> list[Any]:
    from flowwarden_django.checks import check_stranded_runs

    return [m for m in check_stranded_runs() if repr(name) in m.msg]


def test_check_names_the_runs_a_deploy_would_strand_in_one_query(
    name: str, store: Any, django_assert_num_queries: Any
) -> None:
    calls = Calls()
    Workflow.define(name, [counting("a", calls, hibernate), counting("b", calls)], store)
    for _ in range(3):
        Workflow.start(name, {})
    assert stranded_messages(name) == []

    deploy(name, [counting("b", calls)], store, version=2)
    with django_assert_num_queries(1):
        (message,) = stranded_messages(name)
    assert message.id == "flowwarden_django.W204"
    assert f"3 unfinished runs of workflow {name!r} are on version 1" in message.msg
    assert "declare an upgrade" in message.hint

    Workflow.define_upgrade(name, from_version=1, to_version=2, steps={"a": None})
    (message,) = stranded_messages(name)
    assert "apply the declared upgrade (to 2)" in message.hint

    # Version 1 changed in place: its runs stand after a step it no longer has.
    Workflow.define(name, [counting("a2", calls), counting("b", calls)], store, version=1)
    (message,) = stranded_messages(name)
    assert message.id == "flowwarden_django.W205"
    assert "'a' (3)" in message.msg


def test_check_says_a_workflow_not_defined_at_all_is_not_defined(name: str, store: Any) -> None:
    """Runs of a workflow this process does not define at all (defined in a shell,
    say, not in an app's workflows.py): W204 says that, not "a version is missing"."""
    Workflow.define(name, [counting("a", Calls(), hibernate), counting("b", Calls())], store)
    Workflow.start(name, {})
    workflow_registry.unregister(name)
    (message,) = stranded_messages(name)
    assert message.id == "flowwarden_django.W204"
    assert f"1 unfinished run of workflow {name!r}, which this process does not define" in (
        message.msg
    )
    assert "version" not in message.msg
    assert "workflows.py" in message.hint and "Keep version" not in message.hint


def test_the_versions_and_upgrade_commands(name: str, store: Any) -> None:
    from io import StringIO

    from django.core.management import CommandError, call_command

    def run(*args: str) -> str:
        out = StringIO()
        call_command("flowwarden_workflows", *args, stdout=out)
        return out.getvalue()

    calls = Calls()
    Workflow.define(name, [counting("a", calls, hibernate), counting("b", calls)], store)
    first = Workflow.start(name, {}).coordination_id
    second = Workflow.start(name, {}).coordination_id
    deploy(name, [counting("b2", calls)], store, version=2)
    listed = run("versions")
    assert name in listed and "NO" in listed and "hibernated 2" in listed
    assert "neither defines nor upgrades" in listed

    Workflow.define_upgrade(name, from_version=1, to_version=2, steps={"a": None})
    dry = run("upgrade", "--workflow", name, "--dry-run")
    assert f"Would upgrade {first}: v1 after 'a' -> v2 after '(start)'" in dry
    assert "Would upgrade 2 of 2 run(s)." in dry
    assert record(first).workflow_version == 1

    done = run("upgrade", "--workflow", name, "--run", second)
    assert f"Upgraded {second}" in done and first not in done
    assert json.loads(run("upgrade", "--workflow", name, "--json"))[0]["upgraded"] is True
    assert {record(first).workflow_version, record(second).workflow_version} == {2}
    assert "No run to upgrade" in run("upgrade", "--workflow", name)
    with pytest.raises(CommandError, match="is not defined in this process"):
        run("upgrade", "--workflow", "no-such-workflow")
    # Resuming a run the code cannot continue says how to fix it.
    Workflow.define(name, [counting("a", calls, hibernate), counting("b", calls)], store)
    third = workflow_registry.get(name, 1).start({}).coordination_id
    workflow_registry.unregister(name, 1)
    with pytest.raises(CommandError, match="upgrade --dry-run"):
        run("resume", third)


# -- patching ------------------------------------------------------------------------------


def test_ctx_patched_is_true_for_runs_that_reach_the_change_and_never_flips(
    name: str, store: Any
) -> None:
    """v1 [a, ship (hibernates), notify]; the patched code of ``ship`` tracks the
    parcel and ``notify`` sends the tracking link only for runs whose ``ship`` ran it."""
    seen: list[tuple[str, str, bool]] = []

    def old_ship(state: dict[str, Any]) -> Any:
        return hibernate({**state, "shipped": True})

    @step("ship", patches=["tracked"])
    def new_ship(state: dict[str, Any], ctx: Any) -> Any:
        tracked = ctx.patched("tracked")
        seen.append((ctx.coordination_id, "ship", tracked))
        return hibernate({**state, "shipped": True, "tracking": "T1" if tracked else None})

    @step("notify")
    def notify(state: dict[str, Any], ctx: Any) -> Any:
        tracked = ctx.patched("tracked")
        seen.append((ctx.coordination_id, "notify", tracked))
        return advance({**state, "link": state["tracking"] if tracked else None})

    @step("a")
    def a(state: dict[str, Any]) -> Any:
        return hibernate(state)

    old = [a, step("ship")(old_ship), notify]
    Workflow.define(name, old, store)
    past = Workflow.start(name, {}).coordination_id  # will be past ship: old code
    Workflow.for_coordination(past).resume()
    before = Workflow.start(name, {}).coordination_id  # paused before ship
    # The patch is deployed (a compatible change: the same version).
    Workflow.define(name, [a, new_ship, notify], store)
    fresh = Workflow.start(name, {}).coordination_id
    for cid in (before, fresh):
        Workflow.for_coordination(cid).resume()  # a -> ship (hibernates)
    for cid in (past, before, fresh):
        result = Workflow.for_coordination(cid).resume()
        assert isinstance(result, Completed), result
    answers = {(cid, where): value for cid, where, value in seen}
    assert answers[(past, "notify")] is False  # its ship ran the old code
    assert answers[(before, "ship")] is True and answers[(before, "notify")] is True
    assert answers[(fresh, "ship")] is True and answers[(fresh, "notify")] is True
    head = Workflow.for_coordination(past).history()[-1]
    assert head.metadata["workflow.patches"] == '{"tracked":false}'
    assert Workflow.for_coordination(past).history()[-1].state["link"] is None
    assert Workflow.for_coordination(before).history()[-1].state["link"] == "T1"


def test_an_undeclared_patch_is_an_error_naming_the_fix(name: str, store: Any) -> None:
    from flowwarden_django.workflows import Failed

    @step("only")
    def only(state: Any, ctx: Any) -> Any:
        ctx.patched("nowhere")
        return advance(state)

    result = Workflow.define(name, [only], store).start({}).result
    assert isinstance(result, Failed)
    assert "no step declares patch 'nowhere'" in result.reason
    with pytest.raises(ValueError, match="list of patch ids"):
        step("x", patches="tracked")(lambda state: advance(state))


def test_an_upgrade_chain_that_stops_part_way_says_where(name: str, store: Any) -> None:
    calls = Calls()
    Workflow.define(name, [counting("a", calls, hibernate), counting("b", calls)], store)
    cid = Workflow.start(name, {}).coordination_id
    Workflow.define_upgrade(name, from_version=1, to_version=2, steps={"a": "a2"})
    Workflow.define_upgrade(name, from_version=2, to_version=3, steps={"a2": "a3"})
    workflow_registry.unregister(name)
    Workflow.define(name, [counting("a2", calls), counting("b", calls)], store, version=2)
    (outcome,) = upgrade_runs(name)
    assert outcome.upgraded and (outcome.from_version, outcome.to_version) == (1, 2)
    assert "stopped at version 2: version 3 is not defined" in outcome.reason
    assert record(cid).workflow_version == 2


def test_an_interrupted_upgrade_is_never_run_as_the_old_version_and_is_taken_up(
    name: str,
) -> None:
    """A store outside the run's database: the upgrade snapshot saved, then the
    process died before the run moved. The old version's engine must not read that
    snapshot's position as its own (it would start over); the next upgrade adopts it."""
    from flowwarden_django.workflows.operations.upgrades import _upgraded_metadata

    calls = Calls()
    store = InMemorySnapshotStore()
    Workflow.define(
        name, [counting("a", calls, hibernate), counting("b", calls), counting("c", calls)], store
    )
    cid = Workflow.start(name, {}).coordination_id
    upgrade = Workflow.define_upgrade(name, from_version=1, to_version=2, steps={"a": None})
    head = store.latest(cid)
    store.save(
        head.successor(
            head.state, agent_name=name, metadata=_upgraded_metadata(head, upgrade, "", "x")
        )
    )

    result = Workflow.for_coordination(cid).resume()
    assert isinstance(result, NeedsUpgrade) and "was interrupted" in result.reason
    assert calls == {"a": 1}

    Workflow.define(name, [counting("b2", calls), counting("c", calls)], store, version=2)
    (outcome,) = upgrade_runs(name)
    assert outcome.upgraded and outcome.from_step == "a" and outcome.continued
    history = Workflow.for_coordination(cid).history()
    assert [s.metadata["workflow.lastStep"] for s in history] == ["", "a", "", "b2", "c"]
    assert calls == {"a": 1, "b2": 1, "c": 1}


def test_runs_inserted_without_a_version_are_on_version_1() -> None:
    """The previous release leaves the column out of its INSERTs during a rollout."""
    from django.db import connection

    table = WorkflowRun._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO "{table}" (coordination_id, workflow_name, status, last_step, '
            "failure_reason, runner, attempts, created_at, updated_at) "
            "VALUES ('legacy-insert', 'w', 'running', '', '', '', 0, %s, %s)",
            [timezone_now(), timezone_now()],
        )
    assert record("legacy-insert").workflow_version == 1


def timezone_now() -> Any:
    from django.utils import timezone

    return timezone.now()


def test_a_failed_run_of_a_version_not_defined_keeps_its_failure(name: str, store: Any) -> None:
    @step("boom")
    def boom(state: Any) -> Any:
        raise RuntimeError("nope")

    Workflow.define(name, [boom], store)
    cid = Workflow.start(name, {}).coordination_id
    assert record(cid).status == RunStatus.FAILED
    deploy(name, [counting("x", Calls())], store, version=2)
    with pytest.raises(VersionNotDefinedError):
        Workflow.for_coordination(cid)
    assert record(cid).status == RunStatus.FAILED and "nope" in record(cid).failure_reason
