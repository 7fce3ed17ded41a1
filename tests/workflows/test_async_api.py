"""The async API (``Workflow.astart``, ``arun``, ``aresume``, ``afork``; ``aapprove``,
``areject``): called from a coroutine running in an event loop, as in an ``async def``
view under ASGI, on SQLite and PostgreSQL.

Each test does the same thing twice, once through the sync twin (run where sync code
runs in async code: ``sync_to_async``) and once through the async variant, and
checks both give the same results, errors, snapshot signals and approval audit
events. No outer ``async_to_sync`` here, so the work runs in asgiref's
thread-sensitive executor, not the test's thread: the tests need
``transaction=True``, and the executor's connections are closed after each test.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group, User
from django.core.exceptions import SynchronousOnlyOperation
from django.db import connections

from flowwarden_django.models import Approval, ApprovalEvent, WorkflowRun
from flowwarden_django.workflows import (
    Completed,
    ConcurrentRunError,
    Hibernated,
    RunStatus,
    StepContext,
    UnknownSnapshotError,
    Workflow,
    WorkflowDefinition,
    advance,
    done,
    hibernate,
    step,
    workflow_registry,
)
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.runs.records import RunRecords, new_runner_token
from flowwarden_django.workflows.storage.signals import snapshot_forked, snapshot_saved
from flowwarden_django.workflows.waiting.approvals import (
    ApprovalConflictError,
    ApprovalPermissionError,
    DecisionResult,
    UnknownApprovalError,
    aapprove,
    adecide,
    approve,
    areject,
    reject,
)
from tests.support.lanes import lane_marks
from tests.support.refund_workflow import define_refunds

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anyio]

POSTGRES = pytest.param("postgres", marks=lane_marks("postgres", databases=["default", "postgres"]))
#: SQLite ("default") and PostgreSQL.
ALIASES = pytest.mark.parametrize("alias", ["default", POSTGRES])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
async def _close_executor_connections() -> AsyncIterator[None]:
    """The thread-sensitive executor keeps its connections; close them after the test
    (so the flush, and the test database's drop, find no other session)."""
    yield
    await sync_to_async(connections.close_all, thread_sensitive=True)()


def new_cid() -> str:
    return f"async-{uuid.uuid4().hex[:12]}"


def in_sync(function: Any, *args: Any, **kwargs: Any) -> Any:
    """Await the sync twin *function* where sync code runs in async code."""
    return sync_to_async(function, thread_sensitive=True)(*args, **kwargs)


class Events:
    """The snapshot signals sent (``saved``, ``forked``), per coordination."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []  # (coordination, kind, snapshot id)

    def saved(self, sender: Any, event: Any, **kwargs: Any) -> None:
        self.seen.append((event.coordination_id, "saved", event.snapshot_id))

    def forked(self, sender: Any, event: Any, **kwargs: Any) -> None:
        self.seen.append((event.coordination_id, "forked", event.snapshot_id))

    def of(self, cid: str) -> list[str]:
        return [kind for coordination, kind, _ in self.seen if coordination == cid]


@pytest.fixture
def events() -> Iterator[Events]:
    recorded = Events()
    snapshot_saved.connect(recorded.saved)
    snapshot_forked.connect(recorded.forked)
    yield recorded
    snapshot_saved.disconnect(recorded.saved)
    snapshot_forked.disconnect(recorded.forked)


#: The threads the steps ran in.
step_threads: list[str] = []


@step
def reserve(state: dict[str, Any]) -> Any:
    step_threads.append(threading.current_thread().name)
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no event loop in a step's thread: the sync ORM is allowed
        pass
    else:
        raise AssertionError("a step ran in the event loop's thread")
    return advance({**state, "reserved": True})


@step
def ask(state: dict[str, Any]) -> Any:
    return hibernate(state)


@step
def ship(state: dict[str, Any], ctx: StepContext) -> Any:
    return done({**state, "shipped": True, "input": ctx.input})


@pytest.fixture
def orders(alias: str) -> Iterator[WorkflowDefinition]:
    step_threads.clear()
    yield Workflow.define("async-orders", [reserve, ask, ship], OrmSnapshotStore(using=alias))
    workflow_registry.unregister("async-orders")


def run_of(alias: str, cid: str) -> WorkflowRun:
    return WorkflowRun.objects.using(alias).get(pk=cid)


def chain(workflow: Workflow) -> list[tuple[str, Any]]:
    return [(s.metadata.get("workflow.lastStep"), s.state) for s in workflow.history()]


# -- the problem the async API solves -------------------------------------------------------


@ALIASES
async def test_the_sync_api_refuses_an_event_loop_and_the_async_api_works(
    alias: str, orders: WorkflowDefinition
) -> None:
    with pytest.raises(SynchronousOnlyOperation):
        Workflow.start("async-orders", {"order": 1}, idempotency_key="refused")

    started = await Workflow.astart("async-orders", {"order": 1}, idempotency_key="k")
    assert started.created
    assert started.result == Hibernated(
        {"order": 1, "reserved": True}, started.coordination_id, "ask"
    )
    assert step_threads and threading.current_thread().name not in step_threads
    assert (
        await WorkflowRun.objects.using(alias).filter(idempotency_key="refused").aexists() is False
    )


# -- workflows -----------------------------------------------------------------------------


@ALIASES
async def test_astart_is_start(alias: str, orders: WorkflowDefinition, events: Events) -> None:
    sync = await in_sync(Workflow.start, "async-orders", {"order": 1}, idempotency_key="s")
    started = await Workflow.astart("async-orders", {"order": 1}, idempotency_key="a")
    for made in (sync, started):
        cid = made.coordination_id
        assert made.created
        assert made.result == Hibernated({"order": 1, "reserved": True}, cid, "ask")
        assert events.of(cid) == ["saved"] * 3  # the seed, reserve, ask (hibernated)
    assert (await sync_to_async(run_of)(alias, started.coordination_id)).status == (
        RunStatus.HIBERNATED
    )

    # Again with the key: the run that exists, nothing run.
    again = await Workflow.astart("async-orders", {"order": 2}, idempotency_key="a")
    sync_again = await in_sync(Workflow.start, "async-orders", {"order": 2}, idempotency_key="s")
    assert (again.created, again.coordination_id) == (False, started.coordination_id)
    assert (sync_again.created, sync_again.coordination_id) == (False, sync.coordination_id)
    assert again.result == started.result and sync_again.result == sync.result
    assert events.of(started.coordination_id) == ["saved"] * 3

    # The definition's own start, with a coordination id.
    cid = new_cid()
    by_definition = await orders.astart({"order": 3}, coordination_id=cid)
    assert by_definition.coordination_id == cid and by_definition.created

    # The same error for a name nobody defined.
    with pytest.raises(LookupError, match="no workflow named 'nope'"):
        await in_sync(Workflow.start, "nope")
    with pytest.raises(LookupError, match="no workflow named 'nope'"):
        await Workflow.astart("nope")


@ALIASES
async def test_arun_and_aresume_are_run_and_resume(
    alias: str, orders: WorkflowDefinition, events: Events
) -> None:
    sync_wf, async_wf = orders.workflow(new_cid()), orders.workflow(new_cid())

    sync_first = await in_sync(sync_wf.run, {"order": 1})
    first = await async_wf.arun({"order": 1})
    assert first == Hibernated({"order": 1, "reserved": True}, async_wf.coordination_id, "ask")
    assert sync_first == Hibernated({"order": 1, "reserved": True}, sync_wf.coordination_id, "ask")

    # Running a hibernated run again goes on after it: ask hibernates (already done),
    # so ship runs; resume hands it the input.
    sync_end = await in_sync(sync_wf.resume, {"ok": True})
    end = await async_wf.aresume({"ok": True})
    final = {"order": 1, "reserved": True, "shipped": True, "input": {"ok": True}}
    assert end == Completed(final, async_wf.coordination_id)
    assert sync_end == Completed(final, sync_wf.coordination_id)
    assert await async_wf.arun() == end  # a completed run runs nothing
    assert await sync_to_async(chain)(async_wf) == await sync_to_async(chain)(sync_wf)
    assert events.of(async_wf.coordination_id) == events.of(sync_wf.coordination_id)
    assert events.of(async_wf.coordination_id) == ["saved", "saved", "saved", "saved"]


@ALIASES
async def test_a_run_held_by_another_runner_is_refused_the_same_way(
    alias: str, orders: WorkflowDefinition
) -> None:
    wf = orders.workflow(new_cid())
    await wf.arun({"order": 1})
    holder = new_runner_token()
    await in_sync(RunRecords(alias).claim, wf.coordination_id, holder, timedelta(minutes=5))

    with pytest.raises(ConcurrentRunError, match=holder) as sync_error:
        await in_sync(wf.resume, {"ok": True})
    with pytest.raises(ConcurrentRunError, match=holder) as async_error:
        await wf.aresume({"ok": True})
    with pytest.raises(ConcurrentRunError, match=holder):
        await wf.arun()
    assert str(async_error.value) == str(sync_error.value)
    assert len(await sync_to_async(wf.history)()) == 3  # nothing written: seed, reserve, ask


@ALIASES
async def test_afork_is_fork(alias: str, orders: WorkflowDefinition, events: Events) -> None:
    sync_wf, async_wf = orders.workflow(new_cid()), orders.workflow(new_cid())
    for wf in (sync_wf, async_wf):
        await wf.arun({"order": 1})
    sync_seed = (await sync_to_async(sync_wf.history)())[0]
    async_seed = (await sync_to_async(async_wf.history)())[0]

    sync_child = await in_sync(sync_wf.fork, sync_seed.id, {"order": 2})
    async_child = await async_wf.afork(async_seed.id, {"order": 2})
    for made, seed in ((sync_child, sync_seed), (async_child, async_seed)):
        assert (made.parent_id, made.state, made.seq) == (seed.id, {"order": 2}, 4)
    assert events.of(async_wf.coordination_id) == events.of(sync_wf.coordination_id)
    assert events.of(async_wf.coordination_id) == ["saved"] * 4 + ["forked"]  # 3 + the child

    # The next run continues from the fork: reserve again.
    assert await async_wf.arun() == Hibernated(
        {"order": 2, "reserved": True}, async_wf.coordination_id, "ask"
    )

    with pytest.raises(UnknownSnapshotError) as sync_error:
        await in_sync(sync_wf.fork, async_seed.id, {})  # another coordination's snapshot
    with pytest.raises(UnknownSnapshotError) as async_error:
        await async_wf.afork(sync_seed.id, {})
    for error, wf, seed in ((sync_error, sync_wf, async_seed), (async_error, async_wf, sync_seed)):
        message = f"coordination {wf.coordination_id!r} has no snapshot {seed.id!r}"
        assert str(error.value) == message


# -- approvals -----------------------------------------------------------------------------


@pytest.fixture
def refunds(alias: str) -> Iterator[WorkflowDefinition]:
    yield define_refunds("async-refund", OrmSnapshotStore(using=alias), using=alias)
    workflow_registry.unregister("async-refund")


@pytest.fixture
def people(alias: str) -> dict[str, User]:
    finance = Group.objects.db_manager(alias).create(name="finance")
    made = {
        name: User.objects.db_manager(alias).create_user(name, password="pw")
        for name in ("alice", "bob", "carol")
    }
    made["bob"].groups.add(finance)
    return made


def pending(definition: WorkflowDefinition, alias: str) -> Approval:
    started = definition.start({"amount": 500})
    assert started.result.status == RunStatus.WAITING
    return Approval.objects.using(alias).get(coordination_id=started.coordination_id)


def audit(approval: Approval, alias: str) -> list[tuple[str, str]]:
    events = ApprovalEvent.objects.using(alias).filter(approval_id=approval.pk).order_by("id")
    return list(events.values_list("action", "actor"))


def outcome(result: DecisionResult) -> tuple[Any, ...]:
    """What a decision returns, without the ids that differ between two runs."""
    approval = result.approval
    run = result.run_result
    state = None if run is None else {**run.final_state}
    return (approval.status, approval.decided_by, approval.comment, approval.payload), (
        result.repeated,
        type(run).__name__,
        state,
    )


@ALIASES
async def test_aapprove_and_areject_are_approve_and_reject(
    alias: str, refunds: WorkflowDefinition, people: dict[str, User]
) -> None:
    for sync_decide, async_decide in ((approve, aapprove), (reject, areject)):
        sync_one = await in_sync(pending, refunds, alias)
        async_one = await in_sync(pending, refunds, alias)
        options = {"comment": "ok", "payload": {"note": "n"}, "using": alias}

        sync_result = await in_sync(sync_decide, sync_one.pk, people["alice"], **options)
        result = await async_decide(async_one.pk, people["alice"], **options)
        assert outcome(result) == outcome(sync_result)
        assert isinstance(result.run_result, Completed)
        verdict = "refunded" if sync_decide is approve else "rejected"
        assert result.run_result.final_state["outcome"] == verdict
        assert result.run_result.final_state["by"] == "alice"
        run = await WorkflowRun.objects.using(alias).aget(pk=async_one.coordination_id)
        assert run.status == RunStatus.COMPLETED

        # The same decision again: repeated, nothing resumed.
        sync_again = await in_sync(sync_decide, sync_one.pk, people["bob"], using=alias)
        again = await async_decide(async_one.pk, people["bob"], using=alias)
        assert again.repeated and again.run_result is None
        assert outcome(again) == outcome(sync_again)

        # The other decision: the same conflict.
        other = reject if sync_decide is approve else approve
        aother = areject if async_decide is aapprove else aapprove
        with pytest.raises(ApprovalConflictError) as sync_error:
            await in_sync(other, sync_one.pk, people["alice"], using=alias)
        with pytest.raises(ApprovalConflictError) as async_error:
            await aother(async_one.pk, people["alice"], using=alias)
        assert async_error.value.code == sync_error.value.code == "approval_already_decided"

        sync_audit = await in_sync(audit, sync_one, alias)
        assert await in_sync(audit, async_one, alias) == sync_audit
        decided = "approved" if sync_decide is approve else "rejected"
        assert sync_audit == [
            ("requested", ""),
            (decided, "alice"),
            ("repeated", "bob"),
            ("refused", "alice"),
        ]


@ALIASES
async def test_a_refused_decision_raises_the_same_error(
    alias: str, refunds: WorkflowDefinition, people: dict[str, User]
) -> None:
    sync_one = await in_sync(pending, refunds, alias)
    async_one = await in_sync(pending, refunds, alias)

    with pytest.raises(ApprovalPermissionError) as sync_error:
        await in_sync(approve, sync_one.pk, people["carol"], using=alias)
    with pytest.raises(ApprovalPermissionError) as async_error:
        await aapprove(async_one.pk, people["carol"], using=alias)
    assert async_error.value.code == sync_error.value.code == "approval_forbidden"
    assert await in_sync(audit, async_one, alias) == [("requested", ""), ("refused", "carol")]
    assert (await Approval.objects.using(alias).aget(pk=async_one.pk)).status == "pending"

    with pytest.raises(UnknownApprovalError):
        await in_sync(reject, uuid.uuid4(), people["bob"], using=alias)
    with pytest.raises(UnknownApprovalError):
        await areject(uuid.uuid4(), people["bob"], using=alias)
    with pytest.raises(ValueError, match="decision must be one of"):
        await adecide(async_one.pk, "maybe", people["bob"], using=alias)
