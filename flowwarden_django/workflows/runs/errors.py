"""What the run records raise: the run is held by another runner, its lease was lost,
it does not exist, or it is a run of another workflow or version."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...models import WorkflowRun


class ConcurrentRunError(RuntimeError):
    """Another runner holds the coordination: this runner did nothing and wrote nothing."""

    def __init__(
        self, coordination_id: str, runner: str = "", claimed_until: datetime | None = None
    ):
        self.coordination_id = coordination_id
        self.runner = runner
        self.claimed_until = claimed_until
        holder = runner or "another runner"
        until = f" until {claimed_until.isoformat()}" if claimed_until else ""
        super().__init__(f"coordination {coordination_id!r} is being run by {holder}{until}")


class LeaseLostError(ConcurrentRunError):
    """This runner's claim on the run was taken over (its lease ran out while it worked)."""

    def __init__(self, coordination_id: str, runner: str) -> None:
        self.coordination_id = coordination_id
        self.runner = runner
        self.claimed_until = None
        RuntimeError.__init__(
            self,
            f"runner {runner} no longer holds coordination {coordination_id!r} "
            "(its lease ran out and another runner claimed it)",
        )


class UnknownRunError(LookupError):
    """No ``WorkflowRun`` has that coordination id."""


class RunConflictError(ValueError):
    """The coordination or idempotency key already belongs to another run or workflow."""


class RunVersionError(RunConflictError):
    """The run is on another version of its workflow than the definition that tried to
    run it (``Workflow.for_coordination(cid)`` gives the run's own); nothing changed."""

    def __init__(self, coordination_id: str, workflow_name: str, run_version: int, version: int):
        self.coordination_id = coordination_id
        self.run_version = run_version
        self.version = version
        super().__init__(
            f"coordination {coordination_id!r} is a run of version {run_version} of "
            f"workflow {workflow_name!r}, not of version {version}; continue it with "
            "Workflow.for_coordination(coordination_id), or upgrade it "
            "(manage.py flowwarden_workflows upgrade)"
        )


def check_run_of(record: WorkflowRun, workflow_name: str, version: int | None) -> None:
    """``RunConflictError`` when *record* is not a run of *workflow_name* (at *version*,
    when given)."""
    cid = record.coordination_id
    if record.workflow_name != workflow_name:
        raise RunConflictError(
            f"coordination {cid!r} is a run of workflow {record.workflow_name!r}, "
            f"not {workflow_name!r}"
        )
    if version is not None and record.workflow_version != version:
        raise RunVersionError(cid, workflow_name, record.workflow_version, version)
