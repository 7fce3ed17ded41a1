"""Transactional steps (``@step(transactional=True)``) on PostgreSQL: a step's writes
commit with its snapshot, so a runner whose save the fence refuses leaves none behind.

Two runners of one run race in threads: the first is held in its step while its
lease runs out and a second takes the run over. Whichever order the two saves come
in, the loser's ``Effect`` row is rolled back with its refused snapshot: one row for
the step, one snapshot per ``seq``.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.utils import timezone

from flowwarden_django.models import WorkflowRun
from flowwarden_django.workflows import (
    Completed,
    ConcurrentRunError,
    Failed,
    LeaseLostError,
    SnapshotConflictError,
    StepContext,
    Workflow,
    advance,
    fail,
    step,
)
from flowwarden_django.workflows.backends.memory import InMemorySnapshotStore
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.definition.metadata import LAST_STEP
from tests.support.lanes import lane_marks
from tests.support.polling import wait_until
from tests.testapp.models import Effect

DB = "postgres"

pytestmark = lane_marks("postgres", databases=[DB])

#: The tests of one runner also run on SQLite (``default``).
BOTH = pytest.mark.parametrize(
    "db",
    [
        pytest.param("default", marks=pytest.mark.django_db(transaction=True)),
        pytest.param(DB, marks=lane_marks("postgres", databases=[DB])),
    ],
)


def new_cid() -> str:
    return f"txn-{uuid.uuid4().hex[:12]}"


def store(db: str = DB) -> OrmSnapshotStore:
    return OrmSnapshotStore(using=db)


def effects(cid: str, db: str = DB) -> list[str]:
    rows = Effect.objects.using(db).filter(stream__startswith=f"{cid}:")
    return sorted(rows.values_list("stream", flat=True))


def assert_chain(cid: str, steps: list[str]) -> None:
    """One snapshot per ``seq``, each the child of the one before."""
    history = sorted((s for s in store().list() if s.coordination_id == cid), key=lambda s: s.seq)
    assert [s.seq for s in history] == list(range(1, len(steps) + 2))
    assert [s.metadata[LAST_STEP] for s in history] == ["", *steps]
    assert all(b.parent_id == a.id for a, b in itertools.pairwise(history))


class Held:
    """Step ``one`` writes an ``Effect`` row (labelled with its call number) and, on
    the calls named in *hold*, waits until the test lets it go."""

    def __init__(self, cid: str, transactional: bool = True, hold: tuple[int, ...] = (1,)) -> None:
        self.cid = cid
        self.calls: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.in_step = {n: threading.Event() for n in hold}
        self.go = {n: threading.Event() for n in hold}

        @step("one", transactional=transactional)
        def one(state: list[str], ctx: StepContext) -> Any:
            with self.lock:
                self.calls["one"] += 1
                call = self.calls["one"]
            Effect.objects.using(DB).create(order_id=call, stream=f"{cid}:one:{call}")
            if call in self.in_step:
                self.in_step[call].set()
                assert self.go[call].wait(30), "never let go"
            return advance([*state, "one"])

        @step("two")
        def two(state: list[str]) -> Any:
            with self.lock:
                self.calls["two"] += 1
            return advance([*state, "two"])

        self.workflow = Workflow("txn-race", cid, [one, two], store(), using=DB)

    def in_thread(self, errors: list[BaseException], results: list[Any]) -> threading.Thread:
        def body() -> None:
            try:
                results.append(self.workflow.run([]))
            except BaseException as exc:
                errors.append(exc)
            finally:
                connections.close_all()

        thread = threading.Thread(target=body)
        thread.start()
        return thread

    def lease_runs_out(self) -> None:
        WorkflowRun.objects.using(DB).filter(pk=self.cid).update(
            claimed_until=timezone.now() - timedelta(seconds=1)
        )


@pytest.mark.parametrize(("transactional", "rows"), [(True, 1), (False, 2)])
def test_a_late_save_after_the_takeover_rolls_the_steps_writes_back(
    transactional: bool, rows: int
) -> None:
    """The first runner saves after the second finished: its snapshot's ``seq`` is
    taken. Its ``Effect`` row goes with it when the step is transactional, and stays
    (a second row) when it is not."""
    cid = new_cid()
    held = Held(cid, transactional)
    errors: list[BaseException] = []
    thread = held.in_thread(errors, [])
    try:
        assert held.in_step[1].wait(30)
        held.lease_runs_out()
        assert held.workflow.run([]) == Completed(["one", "two"], cid)
    finally:
        held.go[1].set()
        thread.join(30)

    assert len(errors) == 1 and isinstance(errors[0], ConcurrentRunError)
    assert isinstance(errors[0].__cause__, SnapshotConflictError)
    assert held.calls == {"one": 2, "two": 1}
    assert_chain(cid, ["one", "two"])
    assert len(effects(cid)) == rows
    if transactional:
        assert effects(cid) == [f"{cid}:one:2"]  # the second runner's


def test_a_late_save_before_the_new_runner_saves_is_refused_by_the_fence() -> None:
    """The first runner saves while the second is still in the step: the ``seq`` is
    free, but the run is no longer the first runner's (``LeaseLostError``): its
    snapshot and its ``Effect`` row are rolled back together, and the second runner's
    save goes through."""
    cid = new_cid()
    held = Held(cid, hold=(1, 2))
    first_errors: list[BaseException] = []
    second_errors: list[BaseException] = []
    second_results: list[Any] = []
    first = held.in_thread(first_errors, [])
    second = None
    try:
        assert held.in_step[1].wait(30)
        held.lease_runs_out()
        second = held.in_thread(second_errors, second_results)
        assert held.in_step[2].wait(30)
        held.go[1].set()
        first.join(30)
        assert not first.is_alive()
        assert len(first_errors) == 1 and isinstance(first_errors[0], LeaseLostError)
        assert effects(cid) == []  # the first runner's row went with its refused save
    finally:
        held.go[1].set()
        held.go[2].set()
        first.join(30)
        if second is not None:
            second.join(30)

    assert second_errors == []
    assert second_results == [Completed(["one", "two"], cid)]
    assert held.calls == {"one": 2, "two": 1}
    assert_chain(cid, ["one", "two"])
    assert effects(cid) == [f"{cid}:one:2"]
    run = WorkflowRun.objects.using(DB).get(pk=cid)
    assert (run.status, run.runner) == ("completed", "")


def writing(cid: str, then: Callable[[int], Any], db: str = DB, **options: Any) -> Any:
    """A transactional step that writes an ``Effect`` row per attempt, then *then*."""

    @step("write", transactional=True, retry_delay=0, **options)
    def write(state: Any, ctx: StepContext) -> Any:
        Effect.objects.using(db).create(order_id=ctx.attempt, stream=f"{cid}:{ctx.attempt}")
        return then(ctx.attempt)

    return write


@BOTH
def test_each_attempt_is_a_transaction_of_its_own(db: str) -> None:
    cid = new_cid()

    def flaky(attempt: int) -> Any:
        if attempt < 3:
            raise RuntimeError(f"attempt {attempt}")
        return advance(attempt)

    wf = Workflow("txn-retry", cid, [writing(cid, flaky, db, max_retries=2)], store(db), using=db)
    assert wf.run(None) == Completed(3, cid)
    assert effects(cid, db) == [f"{cid}:3"]


@BOTH
def test_a_returned_fail_rolls_the_steps_writes_back(db: str) -> None:
    cid = new_cid()
    failing = writing(cid, lambda attempt: fail("no"), db)
    wf = Workflow("txn-fail", cid, [failing], store(db), using=db)
    result = wf.run(None)
    assert isinstance(result, Failed) and result.reason == "no"
    assert effects(cid, db) == []
    assert WorkflowRun.objects.using(db).get(pk=cid).status == "failed"


@BOTH
def test_a_jump_the_step_may_not_make_rolls_its_writes_back(db: str) -> None:
    cid = new_cid()
    then = step("then")(lambda state: advance(state))
    last = step("last")(lambda state: advance(state))
    jumping = writing(cid, lambda attempt: advance(attempt, to="last"), db, goes_to=[])
    wf = Workflow("txn-jump", cid, [jumping, then, last], store(db), using=db)
    result = wf.run(None)
    assert isinstance(result, Failed) and "last" in result.reason
    assert effects(cid, db) == []


def test_a_transactional_step_takes_no_timeout() -> None:
    with pytest.raises(ValueError, match="takes no timeout"):
        step("slow", transactional=True, timeout=5)(lambda state: advance(state))


@pytest.mark.django_db(transaction=True, databases=[DB, "default"])
def test_a_transactional_step_needs_the_orm_store_on_the_runs_database() -> None:
    cid = new_cid()
    write = writing(cid, advance)
    wf = Workflow("txn-memory", cid, [write], InMemorySnapshotStore(), using=DB)
    with pytest.raises(ImproperlyConfigured, match="needs the ORM snapshot store"):
        wf.run(None)
    other = Workflow("txn-apart", new_cid(), [write], OrmSnapshotStore(using="default"), using=DB)
    with pytest.raises(ImproperlyConfigured, match="on one database"):
        other.run(None)
    assert effects(cid) == []


def test_the_system_check_names_a_transactional_step_that_cannot_commit() -> None:
    from flowwarden_django.checks import check_transactional_steps
    from flowwarden_django.workflows import workflow_registry

    write = writing("checked", advance)
    Workflow.define("txn-check-memory", [write], InMemorySnapshotStore(), using=DB)
    Workflow.define("txn-check-apart", [write], OrmSnapshotStore(using="default"), using=DB)
    Workflow.define("txn-check-fine", [write], store(), using=DB)
    try:
        messages = check_transactional_steps()
    finally:
        for name in ("txn-check-memory", "txn-check-apart", "txn-check-fine"):
            workflow_registry.unregister(name)
    ours = {m.msg.split("'")[1]: m for m in messages if "'txn-check-" in m.msg}
    assert sorted(ours) == ["txn-check-apart", "txn-check-memory"]
    assert {m.id for m in ours.values()} == {"flowwarden_django.E212"}
    assert "needs the ORM snapshot store" in ours["txn-check-memory"].msg
    assert "on one database" in ours["txn-check-apart"].msg


def test_a_long_transactional_step_keeps_its_claim(settings: Any) -> None:
    """The claim keeper renews the lease from its own connection while the step's
    transaction is open: past its lease (1 s) the run is still held, and another
    runner is refused."""
    settings.FLOWWARDEN = {**settings.FLOWWARDEN, "WORKFLOW_RUN_LEASE": "1s"}
    cid = new_cid()
    renewed, may_go = threading.Event(), threading.Event()
    seen: set[Any] = set()

    def claimed_until() -> Any:  # read in the step's transaction: renewals are committed
        return WorkflowRun.objects.using(DB).values_list("claimed_until", flat=True).get(pk=cid)

    @step("long", transactional=True)
    def long(state: Any, ctx: StepContext) -> Any:
        Effect.objects.using(DB).create(order_id=1, stream=f"{cid}:long")
        started = claimed_until()
        # Six renewals (every quarter of the lease): well past the lease it started with.
        wait_until(lambda: seen.add(claimed_until()) or len(seen) > 6, "renewals", timeout=30)
        assert claimed_until() > started
        renewed.set()
        assert may_go.wait(30)
        return advance(state)

    wf = Workflow("txn-long", cid, [long], store(), using=DB)
    errors: list[BaseException] = []
    results: list[Any] = []

    def body() -> None:
        try:
            results.append(wf.run("s"))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=body)
    thread.start()
    try:
        assert renewed.wait(30)
        with pytest.raises(ConcurrentRunError):
            wf.run("s")
    finally:
        may_go.set()
        thread.join(30)
    assert errors == [] and results == [Completed("s", cid)]
    assert effects(cid) == [f"{cid}:long"]
