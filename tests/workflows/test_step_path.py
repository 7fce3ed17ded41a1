"""The engine's write path, statement by statement: on PostgreSQL a run's opening (claim,
latest snapshot, seed), each plain step and the completing step are one statement each,
committed on its own; elsewhere the same outcomes, some of them in two statements in one
transaction. Plus the pieces: the claim that creates or takes a run, the lease kept by
the completing step, input consumed as SQL NULL, ``WorkflowSnapshot.successor``."""

from __future__ import annotations

import itertools
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from flowwarden_django.models import SnapshotRecord, WorkflowRun
from flowwarden_django.workflows import (
    Completed,
    ConcurrentRunError,
    RunStatus,
    SnapshotConflictError,
    StepContext,
    Workflow,
    advance,
    hibernate,
    step,
)
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from flowwarden_django.workflows.definition.metadata import LAST_STEP, WORKFLOW_DONE, WORKFLOW_NAME
from flowwarden_django.workflows.definition.results import Running
from flowwarden_django.workflows.runs.records import (
    ClaimTerms,
    LeaseLostError,
    RunClaim,
    RunConflictError,
    RunRecords,
    UnknownRunError,
    new_runner_token,
)
from flowwarden_django.workflows.storage.snapshot import WorkflowSnapshot
from tests.support.lanes import lane_marks

pytestmark = pytest.mark.django_db(transaction=True)

POSTGRES = pytest.param("postgres", marks=lane_marks("postgres", databases=["postgres"]))
MARIADB = pytest.param("mariadb", marks=lane_marks("mariadb", databases=["mariadb"]))
#: Every database the ORM store supports ("default" is SQLite).
ALIASES = pytest.mark.parametrize("alias", ["default", POSTGRES, MARIADB])

STEPS = 5
TRANSACTION_STATEMENTS = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")


def new_cid() -> str:
    return f"path-{uuid.uuid4().hex[:12]}"


def counting_steps(starts: list[int], captured: CaptureQueriesContext) -> list[Any]:
    """``STEPS`` steps appending their name to a list state; each notes at its start how
    many statements were logged so far."""

    def make(name: str) -> Any:
        @step(name)
        def run(state: list[str]) -> Any:
            starts.append(len(captured))
            return advance([*state, name])

        return run

    return [make(f"s{number}") for number in range(1, STEPS + 1)]


def kinds(queries: list[dict[str, str]]) -> list[str]:
    return [query["sql"].lstrip().split(None, 1)[0].upper() for query in queries]


def history(alias: str, cid: str) -> list[SnapshotRecord]:
    return list(SnapshotRecord.objects.using(alias).filter(coordination_id=cid).order_by("seq"))


@pytest.mark.parametrize("alias", [POSTGRES])
def test_on_postgres_every_snapshot_of_a_run_is_one_statement(alias: str) -> None:
    """A new run: the opening (claim + latest + seed), then one ``INSERT`` per plain step,
    then the last step's snapshot with the run's completion: one statement per
    snapshot, each its own transaction (no BEGIN, no SAVEPOINT)."""
    cid = new_cid()
    starts: list[int] = []
    with CaptureQueriesContext(connections[alias]) as captured:
        wf = Workflow("path", cid, counting_steps(starts, captured), OrmSnapshotStore(using=alias))
        assert wf.run([]) == Completed([f"s{n}" for n in range(1, STEPS + 1)], cid)
    queries = captured.captured_queries
    assert len(queries) == STEPS + 1, kinds(queries)
    assert not set(kinds(queries)) & set(TRANSACTION_STATEMENTS)
    opening = queries[: starts[0]]
    assert len(opening) == 1 and opening[0]["sql"].startswith("WITH claimed AS (INSERT")
    for before, after in itertools.pairwise(starts):
        assert kinds(queries[before:after]) == ["INSERT"]  # a plain step
    last = queries[starts[-1] :]
    assert len(last) == 1 and last[0]["sql"].startswith("WITH run AS (UPDATE")

    rows = history(alias, cid)
    assert [row.seq for row in rows] == list(range(1, STEPS + 2))
    assert all(b.parent_id == a.id for a, b in itertools.pairwise(rows))
    run = WorkflowRun.objects.using(alias).get(pk=cid)
    assert (run.status, run.runner, run.claimed_until) == (RunStatus.COMPLETED, "", None)
    assert (run.head_snapshot_id, run.last_step, run.attempts) == (rows[-1].id, f"s{STEPS}", 0)


@pytest.mark.parametrize("alias", [POSTGRES])
def test_run_with_a_state_creates_the_run_and_claims_one_that_exists(alias: str) -> None:
    """``run(state)`` first tries to create the run (``ON CONFLICT DO NOTHING``: cheaper
    than the claim's upsert); for a run that exists it writes nothing, and the claim
    takes the run then, which continues from its latest snapshot (read after it)."""
    cid = new_cid()
    starts: list[int] = []
    store = OrmSnapshotStore(using=alias)
    with CaptureQueriesContext(connections[alias]) as captured:
        wf = Workflow("path", cid, counting_steps(starts, captured), store)
        assert isinstance(wf.run_local([], max_steps=1), Running)
    assert "ON CONFLICT DO NOTHING" in captured.captured_queries[0]["sql"]
    starts.clear()
    with CaptureQueriesContext(connections[alias]) as captured:
        wf = Workflow("path", cid, counting_steps(starts, captured), store)
        assert wf.run(["ignored"]) == Completed([f"s{n}" for n in range(1, STEPS + 1)], cid)
    opening = captured.captured_queries[: starts[0]]
    assert kinds(opening) == ["WITH", "WITH", "SELECT"]
    assert "ON CONFLICT DO NOTHING" in opening[0]["sql"]
    assert "DO UPDATE" in opening[1]["sql"]
    rows = history(alias, cid)
    assert [row.seq for row in rows] == list(range(1, STEPS + 2))
    assert all(b.parent_id == a.id for a, b in itertools.pairwise(rows))


@pytest.mark.parametrize("alias", [POSTGRES])
def test_a_new_run_s_opening_returns_only_what_the_database_sets(alias: str) -> None:
    """A new run's opening returns ``claimed_until`` and ``created``, not the row: the
    engine's record of the run, made from what it sent and those, is the row as
    stored, column by column."""
    cid = new_cid()
    runs = RunRecords(alias)
    new = runs.create_claimed_statement(
        RunClaim(cid, "path", new_runner_token(), timedelta(seconds=30))
    )
    assert new is not None
    sql, params = new.statement
    assert sql.endswith('RETURNING "claimed_until", TRUE AS "created"')
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
        assert cursor.fetchone() is None
    record = new.record(row)
    stored = WorkflowRun.objects.using(alias).get(pk=cid)
    names = [field.attname for field in WorkflowRun._meta.concrete_fields]
    assert {n: getattr(record, n) for n in names} == {n: getattr(stored, n) for n in names}
    assert record._state.db == alias and not record._state.adding
    with connections[alias].cursor() as cursor:  # it exists: nothing is written
        cursor.execute(sql, params)
        assert cursor.fetchone() is None


@ALIASES
def test_a_run_written_step_by_step_reads_the_same_everywhere(alias: str) -> None:
    """The same history and run record on every database, whatever the statements."""
    cid = new_cid()
    starts: list[int] = []
    with CaptureQueriesContext(connections[alias]) as captured:
        wf = Workflow("path", cid, counting_steps(starts, captured), OrmSnapshotStore(using=alias))
        wf.run(["init"])
    rows = history(alias, cid)
    assert [row.seq for row in rows] == list(range(1, STEPS + 2))
    store = OrmSnapshotStore(using=alias)
    head = store.latest(cid)
    assert head.id == rows[-1].id and head.state == ["init", *[f"s{n}" for n in range(1, 6)]]
    timing = {k: v for k, v in head.metadata.items() if k.startswith("workflow.step.")}
    assert set(timing) == {
        "workflow.step.durationMs",
        "workflow.step.attempts",
        "workflow.step.startedAt",
        "workflow.step.worker",
        "workflow.step.provider",
    }
    assert timing["workflow.step.provider"] == "inprocess"
    assert {k: v for k, v in head.metadata.items() if k not in timing} == {
        LAST_STEP: f"s{STEPS}",
        WORKFLOW_NAME: "path",
        WORKFLOW_DONE: "false",
    }
    run = WorkflowRun.objects.using(alias).get(pk=cid)
    assert (run.status, run.runner, run.head_snapshot_id) == (RunStatus.COMPLETED, "", head.id)


@ALIASES
def test_a_completing_step_whose_lease_was_taken_over_writes_nothing(alias: str) -> None:
    """The last step saves its snapshot and completes the run together, only while the
    runner still holds the run: one statement on PostgreSQL, one transaction elsewhere."""
    cid = new_cid()
    other = new_runner_token()
    runs = RunRecords(alias)

    @step("one")
    def one(state: list[str]) -> Any:
        return advance([*state, "one"])

    @step("two")
    def two(state: list[str]) -> Any:
        # The lease runs out while the step works, and another runner takes the run.
        WorkflowRun.objects.using(alias).filter(pk=cid).update(
            claimed_until=timezone.now() - timedelta(seconds=1)
        )
        runs.claim(cid, other, timedelta(minutes=5))
        return advance([*state, "two"])

    wf = Workflow("path", cid, [one, two], OrmSnapshotStore(using=alias))
    with pytest.raises(LeaseLostError):
        wf.run([])
    assert [row.seq for row in history(alias, cid)] == [1, 2]  # seed and "one" only
    run = runs.get(cid)
    assert (run.runner, run.status) == (other, RunStatus.RUNNING)


@ALIASES
def test_the_claim_creates_or_takes_a_run(alias: str) -> None:
    runs = RunRecords(alias)
    cid = new_cid()
    first, second = new_runner_token(), new_runner_token()
    lease = timedelta(minutes=5)

    run = runs.claim_or_create(RunClaim(cid, "w", first, lease, resume_input={"go": 1}))
    assert (run.runner, run.status, run.attempts, run.resume_input) == (
        first,
        RunStatus.RUNNING,
        0,
        {"go": 1},
    )
    assert run.claimed_until > timezone.now() + timedelta(minutes=4)
    assert runs.get(cid).resume_input == {"go": 1}
    with pytest.raises(ConcurrentRunError, match="is being run by"):
        runs.claim_or_create(RunClaim(cid, "w", second, lease))
    with pytest.raises(RunConflictError, match="is a run of workflow 'w', not 'other'"):
        runs.claim_or_create(RunClaim(cid, "other", second, lease))

    runs.release(cid, first)
    run = runs.claim_or_create(RunClaim(cid, "w", second, lease))  # a resume: not a retry
    assert (run.runner, run.attempts, run.resume_input) == (second, 0, {"go": 1})
    WorkflowRun.objects.using(alias).filter(pk=cid).update(
        claimed_until=timezone.now() - timedelta(seconds=1)
    )
    run = runs.claim_or_create(RunClaim(cid, "w", first, lease, resume_input=["again"]))
    assert (run.runner, run.attempts, run.resume_input) == (first, 1, ["again"])  # taken over
    stored = runs.get(cid)
    assert (stored.runner, stored.attempts, stored.resume_input) == (first, 1, ["again"])


def left_over_snapshot(alias: str, cid: str, workflow: str) -> tuple[WorkflowSnapshot, list[Any]]:
    """A snapshot of *cid* after step ``one`` whose run record is gone, and the steps
    ``one`` (done already: it must not run again) and ``two``."""
    first = OrmSnapshotStore(using=alias).save(
        WorkflowSnapshot.root(
            cid,
            ["old"],
            agent_name=workflow,
            metadata={LAST_STEP: "one", WORKFLOW_NAME: workflow, WORKFLOW_DONE: "false"},
        ).replace(seq=1)
    )

    @step("one")
    def one(state: list[str]) -> Any:
        raise AssertionError("step one is done already")

    @step("two")
    def two(state: list[str]) -> Any:
        return advance([*state, "two"])

    return first, [one, two]


@ALIASES
def test_a_new_run_over_snapshots_it_did_not_write_continues_from_them(alias: str) -> None:
    """No run record, but snapshots (the record was deleted): the run starts from the
    latest one, without a seed."""
    cid = new_cid()
    first, steps = left_over_snapshot(alias, cid, "path")
    store = OrmSnapshotStore(using=alias)
    assert Workflow("path", cid, steps, store).run(["new"]) == Completed(["old", "two"], cid)
    rows = history(alias, cid)
    assert [(row.seq, row.parent_id) for row in rows] == [(1, None), (2, first.id)]


@ALIASES
def test_a_hibernated_run_resumes_and_its_input_is_cleared_to_null(alias: str) -> None:
    cid = new_cid()
    seen: list[Any] = []

    @step("ask")
    def ask(state: list[str]) -> Any:
        return hibernate([*state, "ask"])

    @step("use")
    def use(state: list[str], ctx: StepContext) -> Any:
        seen.append(ctx.input)
        return advance([*state, "use"])

    @step("end")
    def end(state: list[str]) -> Any:
        return advance([*state, "end"])

    wf = Workflow("path", cid, [ask, use, end], OrmSnapshotStore(using=alias))
    wf.run([])
    assert wf.status() == RunStatus.HIBERNATED
    assert wf.resume({"answer": 42}) == Completed(["ask", "use", "end"], cid)
    assert seen == [{"answer": 42}]
    rows = WorkflowRun.objects.using(alias).filter(pk=cid)
    assert rows.filter(resume_input__isnull=True).count() == 1  # SQL NULL, not JSON null
    assert [row.seq for row in history(alias, cid)] == [1, 2, 3, 4]


@ALIASES
def test_a_second_writer_of_a_step_fails_on_its_seq_outside_a_transaction(alias: str) -> None:
    """``save`` with an explicit ``seq`` (the plain step's write): a new id there is
    inserted; another id at a taken seq is a conflict; the same id again replaces its
    snapshot. The connection stays usable after each."""
    store = OrmSnapshotStore(using=alias)
    cid = new_cid()
    seed = store.save(WorkflowSnapshot.root(cid, 0).replace(seq=1))
    step_one = seed.successor(1, agent_name="w", metadata={LAST_STEP: "a"})
    assert store.save(step_one) == step_one
    rival = seed.successor(10, agent_name="w", metadata={LAST_STEP: "a"})
    with pytest.raises(SnapshotConflictError, match="already has snapshot"):
        store.save(rival)
    again = store.save(step_one.replace(state=2))
    assert (again.id, again.seq) == (step_one.id, 2)
    assert store.load(step_one.id).state == 2
    assert store.latest(cid).id == step_one.id
    assert [row.seq for row in history(alias, cid)] == [1, 2]


@pytest.mark.parametrize("alias", [POSTGRES])
def test_an_encrypting_store_opens_and_reads_runs_on_postgres(alias: str) -> None:
    pytest.importorskip("cryptography")
    from flowwarden_django.workflows.storage.encryption import generate_key

    store = OrmSnapshotStore(using=alias, encryption_keys=[generate_key()])
    cid = new_cid()

    @step("one")
    def one(state: dict[str, int]) -> Any:
        return hibernate({**state, "n": state["n"] + 1})

    @step("two")
    def two(state: dict[str, int]) -> Any:
        return advance({**state, "n": state["n"] + 1})

    wf = Workflow("path", cid, [one, two], store)
    wf.run({"n": 0})
    assert wf.run() == Completed({"n": 2}, cid)
    assert store.latest(cid).state == {"n": 2}
    assert all(row.state.startswith("enc:") for row in history(alias, cid))


def test_successor_is_derive_with_at_the_next_seq() -> None:
    head = WorkflowSnapshot.root("c", {"a": 1}, agent_name="x").replace(seq=4)
    made = head.successor({"a": 2}, agent_name="y", metadata={"k": "v"})
    expected = head.derive_with({"a": 2}, seq=5, agent_name="y", metadata={"k": "v"})
    assert made == expected.replace(id=made.id, created_at=made.created_at)
    assert made.id != head.id and made.created_at.tzinfo is not None
    assert type(made) is WorkflowSnapshot and made.replace() == made
    with pytest.raises(TypeError, match="metadata maps str to str"):
        head.successor(None, agent_name="y", metadata={"k": 1})  # type: ignore[dict-item]


@ALIASES
def test_an_initial_state_the_store_cannot_write_matters_only_to_a_new_run(alias: str) -> None:
    store = OrmSnapshotStore(using=alias)
    cid = new_cid()

    @step("one")
    def one(state: list[str]) -> Any:
        return hibernate([*state, "one"])

    @step("two")
    def two(state: list[str]) -> Any:
        return advance([*state, "two"])

    wf = Workflow("path", cid, [one, two], store)
    with pytest.raises(TypeError, match="cannot serialize object"):
        wf.run(object())
    assert history(alias, cid) == []
    assert WorkflowRun.objects.using(alias).get(pk=cid).runner == ""  # let go
    wf.run([])
    assert wf.run(object()) == Completed(["one", "two"], cid)  # ignored: it has a seed


class _OnTerms(Workflow):
    """A provider's step runner (as Celery's and Temporal's are): it claims an existing
    run only on its terms."""

    def __init__(self, *args: Any, terms: ClaimTerms, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.terms = terms

    def _claim_terms(self) -> ClaimTerms:
        return self.terms


def appending_steps(count: int) -> list[Any]:
    def make(name: str) -> Any:
        @step(name)
        def run(state: list[str]) -> Any:
            return advance([*state, name])

        return run

    return [make(f"s{number}") for number in range(1, count + 1)]


def one_step(alias: str, cid: str, terms: ClaimTerms) -> tuple[Any, list[dict[str, str]]]:
    runner = _OnTerms("path", cid, appending_steps(3), OrmSnapshotStore(using=alias), terms=terms)
    with CaptureQueriesContext(connections[alias]) as captured:
        result = runner.run_local(max_steps=1)
    return result, captured.captured_queries


@ALIASES
def test_a_provider_step_claims_reads_and_lets_go_in_two_statements_on_postgres(
    alias: str,
) -> None:
    """One step of a provider (``max_steps=1``, claimed on terms): on PostgreSQL the
    claim with the read of the head, then the snapshot with the run's release; the
    result names the snapshot the next step continues from. Elsewhere the same
    outcome in more statements."""
    cid = new_cid()
    store = OrmSnapshotStore(using=alias)
    seed = Workflow("path", cid, [step("s1")(advance)], store).seed([])
    terms = ClaimTerms(head=seed.id, check_head=True, running_only=True)
    result, queries = one_step(alias, cid, terms)
    assert isinstance(result, Running) and result.state == ["s1"]
    run = WorkflowRun.objects.using(alias).get(pk=cid)
    assert (run.status, run.runner, run.claimed_until) == (RunStatus.RUNNING, "", None)
    assert (run.head_snapshot_id, run.last_step) == (result.snapshot_id, "s1")
    assert store.latest(cid).id == result.snapshot_id
    if alias == "postgres":
        assert len(queries) == 2, kinds(queries)
        assert queries[0]["sql"].startswith("WITH claimed AS (UPDATE")
        assert queries[1]["sql"].startswith("WITH run AS (UPDATE")
    # Terms the run does not meet (the head moved on): refused, nothing written.
    with pytest.raises(ConcurrentRunError):
        one_step(alias, cid, terms)
    after = WorkflowRun.objects.using(alias).get(pk=cid)
    assert (after.updated_at, after.runner) == (run.updated_at, "")
    # And a run that does not exist is never created by a runner on terms.
    with pytest.raises(UnknownRunError):
        one_step(alias, new_cid(), ClaimTerms())


@pytest.mark.parametrize("alias", [POSTGRES])
def test_a_provider_claim_commits_without_waiting_for_the_wal_flush_only_for_itself(
    alias: str,
) -> None:
    """A step runner's claim without input is committed asynchronously (its step's
    snapshot, committed synchronously, flushes it): ``synchronous_commit`` is off for
    the claim's own transaction only, never for the connection's next one; a claim
    carrying input is committed synchronously."""
    cid = new_cid()
    store = OrmSnapshotStore(using=alias)
    seed = Workflow("path", cid, [step("s1")(advance)], store).seed([])
    terms = ClaimTerms(head=seed.id, check_head=True, running_only=True)
    with connections[alias].cursor() as cursor:
        # The tests' connections run with it off; the claim must not leave it changed.
        cursor.execute("SET synchronous_commit = on")
    _, queries = one_step(alias, cid, terms)
    assert "set_config('synchronous_commit', 'off', true)" in queries[0]["sql"]
    with connections[alias].cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"
        cursor.execute("SET synchronous_commit = off")
    runs = RunRecords(alias)
    claim = runs.claim_statement_for(
        RunClaim(cid, "path", "r", timedelta(seconds=30), resume_input={"go": True}), ClaimTerms()
    )
    assert claim is not None and "synchronous_commit" not in claim[0]


@pytest.fixture
def start_definition():
    """Defines ``path.start`` (registered: a start that finds its run looks it up)."""
    from flowwarden_django.workflows.definition.registry import workflow_registry

    def define(alias: str, steps: list[Any]) -> Any:
        workflow_registry.unregister("path.start")
        return Workflow.define("path.start", steps, OrmSnapshotStore(using=alias))

    yield define
    workflow_registry.unregister("path.start")


@ALIASES
def test_a_start_writes_the_run_at_its_seed_in_one_statement_on_postgres(
    alias: str, start_definition: Any
) -> None:
    """``WorkflowDefinition.start``'s writes: on PostgreSQL the run (at its seed,
    unclaimed) and the seed are one statement, outside a transaction; elsewhere a
    transaction of several. The provider's hand-over is told what was written."""
    from flowwarden_django.workflows.engine.opening import create_seeded as _create_seeded

    definition = start_definition(alias, [step("s1")(advance)])
    wf = definition.workflow(new_cid())
    with CaptureQueriesContext(connections[alias]) as captured:
        started = _create_seeded(wf, wf.runs, ["seed"], "key-" + wf.coordination_id)
    if alias != "postgres":
        assert started is None and not captured.captured_queries
        return
    assert len(captured) == 1 and captured[0]["sql"].startswith("WITH claimed AS (INSERT")
    seed, record = started
    run = WorkflowRun.objects.using(alias).get(pk=wf.coordination_id)
    assert (run.status, run.runner, run.claimed_until) == (RunStatus.RUNNING, "", None)
    assert run.head_snapshot_id == record.head_snapshot_id == seed.id
    assert run.idempotency_key == "key-" + wf.coordination_id
    assert [(row.seq, row.id) for row in history(alias, wf.coordination_id)] == [(1, seed.id)]
    # The coordination exists: nothing written, the long way finds it.
    again = definition.workflow(wf.coordination_id)
    assert _create_seeded(again, again.runs, ["other"], None) is None
    assert len(history(alias, wf.coordination_id)) == 1


@ALIASES
def test_a_start_with_a_known_key_or_over_old_snapshots(alias: str, start_definition: Any) -> None:
    """A second start with the same idempotency key creates nothing; a start over
    snapshots whose run record is gone continues from the latest of them."""
    definition = start_definition(alias, [step("one")(advance), step("two")(advance)])
    first = definition.start([], idempotency_key=f"key-{uuid.uuid4().hex}")
    assert first.created and first.result == Completed([], first.coordination_id)
    key = WorkflowRun.objects.using(alias).get(pk=first.coordination_id).idempotency_key
    second = definition.start(["ignored"], idempotency_key=key)
    assert not second.created and second.coordination_id == first.coordination_id
    assert WorkflowRun.objects.using(alias).filter(idempotency_key=key).count() == 1

    cid = new_cid()
    old, steps = left_over_snapshot(alias, cid, "path.start")
    started = start_definition(alias, steps).start(["new"], coordination_id=cid)
    assert started.created and started.result == Completed(["old", "two"], cid)
    rows = history(alias, cid)
    assert [(row.seq, row.parent_id) for row in rows] == [(1, None), (2, old.id)]
