"""The public API: the names each public package exports, held here so that removing or
moving one fails until this list and CHANGELOG.md change together (docs/reference.md,
"Stability and deprecations")."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Every public package and the names it exports (its ``__all__``), sorted.
PUBLIC: dict[str, tuple[str, ...]] = {
    "flowwarden_django.streams": (
        "AsyncStreamConsumer",
        "AsyncStreamManager",
        "ChangeContext",
        "ChangeSource",
        "Checkpoint",
        "CheckpointStore",
        "CheckpointStoreHandler",
        "DeadLetter",
        "DlqPolicy",
        "DlqStore",
        "ErrorAction",
        "ErrorInfo",
        "HistoryLostError",
        "InitialSync",
        "Lease",
        "LeaseLostError",
        "LockService",
        "NoopCheckpointStore",
        "PymongoChangeSource",
        "ReplayConflictError",
        "ReplayDeadLetteredError",
        "ReplayOutcome",
        "ResyncError",
        "StreamConsumer",
        "StreamInvalidatedError",
        "StreamManager",
        "StreamSpec",
        "StreamState",
        "UnhandledEventError",
        "acknowledge_dead_letter",
        "change_stream",
        "checkpoint",
        "checkpoint_stores",
        "dead_letter_queue",
        "discard_dead_letter",
        "dlq_stores",
        "health_report",
        "lock_services",
        "max_await_ms",
        "new_stream_manager",
        "on_error",
        "purge_expired_dead_letters",
        "register_stream",
        "replay_dead_letter",
        "replay_dead_letters",
        "replay_stream",
        "request_resync",
        "restart_policy",
        "retry_policy",
        "stream_registry",
        "stream_status",
    ),
    "flowwarden_django.workflows": (
        "Advance",
        "ApprovalConflictError",
        "ApprovalDecision",
        "ApprovalError",
        "ApprovalExpiredError",
        "ApprovalFormError",
        "ApprovalPermissionError",
        "CancelOutcome",
        "Cancelled",
        "CheckpointQuery",
        "ChildResult",
        "ClaimResult",
        "Completed",
        "ConcurrentRunError",
        "DecisionResult",
        "Done",
        "ExecutionProvider",
        "ExecutionUnavailableError",
        "Fail",
        "Failed",
        "Hibernate",
        "Hibernated",
        "InProcessProvider",
        "LeaseLostError",
        "Message",
        "NeedsUpgrade",
        "Pause",
        "QueueConfig",
        "RunCancelledError",
        "RunConflictError",
        "RunFinishedError",
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
        "UnknownApprovalError",
        "UnknownQueueError",
        "UnknownRunError",
        "UnknownSnapshotError",
        "UserJSONError",
        "VersionNotDefinedError",
        "WaitForMessage",
        "Waiting",
        "WaitingForChildren",
        "WaitingForMessage",
        "WaitingForSlot",
        "Workflow",
        "WorkflowDefinition",
        "WorkflowGraph",
        "WorkflowResult",
        "WorkflowSnapshot",
        "WorkflowStep",
        "aapprove",
        "aclaim",
        "adecide",
        "advance",
        "approval_assigned",
        "approval_escalated",
        "approval_reminded",
        "approval_requested",
        "approve",
        "areassign",
        "areject",
        "arelease",
        "await_approval",
        "cancel_coordination",
        "cancel_run",
        "check_comment",
        "claim",
        "decidable_approvals",
        "decide",
        "done",
        "fail",
        "hibernate",
        "parse_user_json",
        "reassign",
        "reject",
        "release",
        "resolve_provider",
        "send_message",
        "sleep",
        "snapshot_stores",
        "spawn",
        "step",
        "visible_approvals",
        "wait_for",
        "workflow_registry",
    ),
    "flowwarden_django.testkit": (
        "AsyncCheckpointStoreContract",
        "AsyncDlqStoreContract",
        "AsyncFakeChangeSource",
        "AsyncLockServiceContract",
        "AsyncSnapshotStoreContract",
        "CheckpointStoreContract",
        "DlqStoreContract",
        "FakeChangeSource",
        "FakeOplog",
        "LockServiceContract",
        "ScriptedReplicaSet",
        "SnapshotStoreContract",
    ),
    "flowwarden_django.integrations.celery": (
        "CeleryExecutionProvider",
        "ScheduleError",
        "StreamsBootstep",
        "WorkflowSweepBootstep",
        "beat_schedule_entry",
        "configure_network",
        "install",
        "install_from_settings",
        "install_workflow_sweep",
        "schedule_workflow",
    ),
    "flowwarden_django.integrations.temporal": (
        "TemporalExecutionProvider",
        "TemporalUnavailableError",
        "delete_schedule",
        "schedule_workflow",
    ),
}

#: The public names of the first release that kept this list (0.2.0). A name that leaves
#: ``PUBLIC`` must be named in CHANGELOG.md as ``package.name``.
BASELINE = PUBLIC

#: The modules whose public imports the documentation may show besides ``PUBLIC``'s:
#: the package root (``__version__``), its Django models and its settings object.
ALSO_DOCUMENTED = {"flowwarden_django", "flowwarden_django.models", "flowwarden_django.conf"}

#: ``from flowwarden_django... import a, b`` or ``import (a, b)`` across lines.
IMPORT = re.compile(r"^\s*from (flowwarden_django[\w.]*) import (\([^)]*\)|[^\n]+)", re.M)


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_each_public_package_exports_exactly_its_listed_names(package: str) -> None:
    module = importlib.import_module(package)
    assert sorted(module.__all__) == list(PUBLIC[package]), (
        f"{package}.__all__ changed: update PUBLIC in this test, and CHANGELOG.md when a "
        "name leaves it"
    )


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_every_listed_name_imports(package: str) -> None:
    module = importlib.import_module(package)
    missing = [name for name in PUBLIC[package] if not hasattr(module, name)]
    assert missing == []


def test_a_name_that_leaves_the_public_api_is_in_the_changelog() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    unannounced = [
        f"{package}.{name}"
        for package, names in BASELINE.items()
        for name in names
        if name not in PUBLIC.get(package, ()) and f"{package}.{name}" not in changelog
    ]
    assert unannounced == []


def documented_imports() -> list[tuple[str, str, str]]:
    """(file, module, name) of every import the README, the docs and the sample show."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    files += sorted((ROOT / "sampleproject").rglob("*.py"))
    found = []
    for path in files:
        for module, names in IMPORT.findall(path.read_text()):
            for name in names.strip("()").replace("\n", " ").split(","):
                name = name.split("#")[0].split(" as ")[0].strip()
                if name:
                    found.append((str(path.relative_to(ROOT)), module, name))
    return found


def test_the_docs_and_the_sample_import_only_from_the_public_packages() -> None:
    allowed = set(PUBLIC) | ALSO_DOCUMENTED
    deep = [
        f"{path}: from {module} import {name}"
        for path, module, name in documented_imports()
        if module not in allowed
    ]
    assert deep == []
    assert len(documented_imports()) >= 30


@pytest.mark.parametrize(("path", "module", "name"), documented_imports())
def test_every_documented_import_is_exported(path: str, module: str, name: str) -> None:
    value = getattr(importlib.import_module(module), name)
    if module in PUBLIC and not isinstance(value, ModuleType):  # a submodule is a path
        assert name in PUBLIC[module], f"{path}: {name} is not in {module}.__all__"
