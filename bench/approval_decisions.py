"""Approvals decided per second, against plain resumes of the same runs.

Run from the repository root::

    .venv/bin/python bench/approval_decisions.py [--runs N] [--rounds N]

What is measured
----------------
A two-step workflow on PostgreSQL (ORM snapshot store, in-process execution): the
first step pauses, the second finishes. Before each timed loop (untimed), *runs*
coordinations are started and left paused.

1. **Approve**: the first step returns ``await_approval(...)``; the loop calls
   ``approve(approval_id, user)`` for each run. Each call locks the approval row,
   moves the run from ``waiting`` to ``running`` with the decision as its input,
   writes the decision and its audit event, commits, then resumes the run in
   process: the second step runs and its snapshot is saved.
2. **Resume**: the first step returns ``hibernate(...)``; the loop calls
   ``Workflow.resume(input=...)`` with the same decision input: the engine alone,
   the same second step and snapshot.

The ratio (approvals per second / resumes per second) is what the approval layer
(lock, decision, audit, durable hand-over) keeps of the engine's resume rate. Each
round runs both paths, alternating which goes first; the median is reported.

PostgreSQL: see ``bench/_postgres.py`` (FLOWWARDEN_BENCH_PG_* variables).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _postgres import configure_django, ensure_database, pg_target, server_info  # noqa: E402

PREFIX = "bench-apr-"
APPROVE, RESUME = "bench.approve", "bench.resume"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="runs decided per round and path")
    parser.add_argument("--rounds", type=int, default=5, help="rounds")
    return parser.parse_args(argv)


def define_workflows() -> None:
    """The two benchmark workflows: pause (approval or hibernate), then finish."""
    from flowwarden_django.workflows import Workflow, await_approval, done, hibernate, step
    from flowwarden_django.workflows.backends.orm import OrmSnapshotStore

    @step("finish")
    def finish(state: dict[str, Any], ctx: Any) -> Any:
        # The approve path gets an ApprovalDecision, the resume path the same dict.
        decision = ctx.decision.as_input() if ctx.decision else ctx.input
        return done({**state, "decision": decision["decision"]})

    @step("ask")
    def ask(state: dict[str, Any]) -> Any:
        return await_approval(state, "Approve?", assignees=["bench"])

    @step("ask")
    def pause(state: dict[str, Any]) -> Any:
        return hibernate(state)

    store = OrmSnapshotStore()
    Workflow.define(APPROVE, [ask, finish], store)
    Workflow.define(RESUME, [pause, finish], store)


def paused_runs(name: str, runs: int) -> list[str]:
    """Start *runs* coordinations of workflow *name*; each pauses at its first step."""
    from flowwarden_django.workflows import Workflow

    cids = []
    for _ in range(runs):
        cid = f"{PREFIX}{uuid.uuid4().hex}"
        Workflow.start(name, {"order": 1}, coordination_id=cid)
        cids.append(cid)
    return cids


def approve_round(user: Any, runs: int) -> float:
    """Approvals per second over *runs* waiting runs."""
    from flowwarden_django.models import Approval
    from flowwarden_django.workflows import Completed
    from flowwarden_django.workflows.waiting.approvals import approve

    cids = paused_runs(APPROVE, runs)
    ids = list(Approval.objects.filter(coordination_id__in=cids).values_list("pk", flat=True))
    assert len(ids) == runs
    start = time.perf_counter()
    for approval_id in ids:
        result = approve(approval_id, user)
        if not isinstance(result.run_result, Completed):
            sys.exit(f"an approved run did not complete: {result.run_result!r}")
    return runs / (time.perf_counter() - start)


def resume_round(runs: int) -> float:
    """Resumes per second over *runs* hibernated runs, with the same decision input."""
    from flowwarden_django.workflows import Completed, Workflow

    cids = paused_runs(RESUME, runs)
    workflows = [Workflow.for_coordination(cid) for cid in cids]
    start = time.perf_counter()
    for workflow in workflows:
        decision = {"kind": "bench", "decision": "approved", "approval_id": uuid.uuid4().hex}
        result = workflow.resume(decision)
        if not isinstance(result, Completed):
            sys.exit(f"a resumed run did not complete: {result!r}")
    return runs / (time.perf_counter() - start)


def cleanup() -> None:
    """Delete the benchmark's runs, snapshots and approvals."""
    from flowwarden_django.models import Approval, SnapshotRecord, WorkflowRun

    Approval.objects.filter(coordination_id__startswith=PREFIX).delete()
    SnapshotRecord.objects.filter(coordination_id__startswith=PREFIX).delete()
    WorkflowRun.objects.filter(coordination_id__startswith=PREFIX).delete()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its results."""
    args = parse_args(argv)
    target = pg_target()
    ensure_database(target)
    configure_django(target)

    from django.contrib.auth.models import User
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    define_workflows()
    cleanup()
    user, _ = User.objects.get_or_create(username="bench")
    version, synchronous_commit = server_info()
    print(
        f"PostgreSQL {version}, synchronous_commit={synchronous_commit}; "
        f"{args.rounds} rounds x {args.runs} runs per path",
        flush=True,
    )
    try:
        approve_round(user, 20)  # warm-up
        resume_round(20)
        approvals, resumes = [], []
        for index in range(args.rounds):
            if index % 2:
                resumes.append(resume_round(args.runs))
                approvals.append(approve_round(user, args.runs))
            else:
                approvals.append(approve_round(user, args.runs))
                resumes.append(resume_round(args.runs))
            print(f"  round {index + 1}: approve {approvals[-1]:.0f}/s, resume {resumes[-1]:.0f}/s")
            cleanup()
    finally:
        cleanup()
    approve_rate, resume_rate = statistics.median(approvals), statistics.median(resumes)
    print(f"approve() then resume, per run:   {approve_rate:.0f} runs/s")
    print(f"resume(input) alone, per run:     {resume_rate:.0f} runs/s")
    print(f"ratio (approve / resume):         {approve_rate / resume_rate:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
