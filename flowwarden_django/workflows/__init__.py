"""The workflow half: durable multi-step workflows stored as parent-linked snapshots.

Nothing in this package imports the admin, DRF or Celery.
"""

from .approvals import ApprovalDecision, await_approval
from .children import ChildResult, Spawn, spawn
from .engine import StepTimeoutError, Workflow, WorkflowDefinition
from .execution import (
    ExecutionProvider,
    ExecutionUnavailableError,
    InProcessProvider,
    resolve_provider,
)
from .registry import VersionNotDefinedError, workflow_registry
from .results import (
    Cancelled,
    Completed,
    Failed,
    Hibernated,
    NeedsUpgrade,
    Running,
    Sleeping,
    StartedRun,
    Waiting,
    WaitingForChildren,
    WorkflowResult,
)
from .runs import (
    ConcurrentRunError,
    LeaseLostError,
    RunConflictError,
    RunStatus,
    RunVersionError,
    UnknownRunError,
)
from .snapshot import CheckpointQuery, WorkflowSnapshot
from .steps import (
    Advance,
    Done,
    Fail,
    Hibernate,
    Pause,
    Sleep,
    StepContext,
    StepOutcome,
    WorkflowStep,
    advance,
    done,
    fail,
    hibernate,
    sleep,
    step,
)
from .store import (
    SnapshotConflictError,
    SnapshotStore,
    UnknownSnapshotError,
    snapshot_stores,
)

__all__ = [
    "Advance",
    "ApprovalDecision",
    "Cancelled",
    "CheckpointQuery",
    "ChildResult",
    "Completed",
    "ConcurrentRunError",
    "Done",
    "ExecutionProvider",
    "ExecutionUnavailableError",
    "Fail",
    "Failed",
    "Hibernate",
    "Hibernated",
    "InProcessProvider",
    "LeaseLostError",
    "NeedsUpgrade",
    "Pause",
    "RunConflictError",
    "RunStatus",
    "RunVersionError",
    "Running",
    "Sleep",
    "Sleeping",
    "SnapshotConflictError",
    "SnapshotStore",
    "Spawn",
    "StartedRun",
    "StepContext",
    "StepOutcome",
    "StepTimeoutError",
    "UnknownRunError",
    "UnknownSnapshotError",
    "VersionNotDefinedError",
    "Waiting",
    "WaitingForChildren",
    "Workflow",
    "WorkflowDefinition",
    "WorkflowResult",
    "WorkflowSnapshot",
    "WorkflowStep",
    "advance",
    "await_approval",
    "done",
    "fail",
    "hibernate",
    "resolve_provider",
    "sleep",
    "snapshot_stores",
    "spawn",
    "step",
    "workflow_registry",
]
