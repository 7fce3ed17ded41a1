"""The import paths of 0.1.0 that later releases moved still work until 0.3, each
warning with the import that replaces it (CHANGELOG.md, "Deprecated")."""

from __future__ import annotations

import importlib

import pytest

from flowwarden_django.common.deprecation import REMOVED_IN

#: (old module, name, the import the warning recommends): every 0.1.0 path moved since.
MOVED = [
    ("flowwarden_django.streams.manager", "StreamManager", "flowwarden_django.streams"),
    ("flowwarden_django.streams.manager", "max_await_ms", "flowwarden_django.streams"),
    ("flowwarden_django.streams.replay", "replay_dead_letters", "flowwarden_django.streams"),
    ("flowwarden_django.streams.replay", "replay_stream", "flowwarden_django.streams"),
    ("flowwarden_django.streams.replay", "replay_dead_letter", "flowwarden_django.streams"),
    ("flowwarden_django.streams.replay", "acknowledge_dead_letter", "flowwarden_django.streams"),
    ("flowwarden_django.streams.replay", "discard_dead_letter", "flowwarden_django.streams"),
    ("flowwarden_django.streams.runtime", "UnhandledEventError", "flowwarden_django.streams"),
    (
        "flowwarden_django.streams.runtime",
        "OplogTooShortError",
        "flowwarden_django.streams.core.resume",
    ),
    ("flowwarden_django.streams.async_manager", "AsyncStreamManager", "flowwarden_django.streams"),
    (
        "flowwarden_django.streams.async_runtime",
        "AsyncStreamConsumer",
        "flowwarden_django.streams",
    ),
    ("flowwarden_django.streams.status", "stream_status", "flowwarden_django.streams"),
    ("flowwarden_django.streams.status", "health_report", "flowwarden_django.streams"),
    (
        "flowwarden_django.streams.display",
        "short_token",
        "flowwarden_django.streams.operations.display",
    ),
    (
        "flowwarden_django.streams.leadership",
        "Leadership",
        "flowwarden_django.streams.runtime.leadership",
    ),
    (
        "flowwarden_django.streams.observed_store",
        "ObservedCheckpointStore",
        "flowwarden_django.streams.runtime.observed_store",
    ),
    (
        "flowwarden_django.streams.policy",
        "ProcessedAnchorPolicy",
        "flowwarden_django.streams.runtime.policy",
    ),
    (
        "flowwarden_django.streams.copy_filter",
        "CopyFilterError",
        "flowwarden_django.streams.initial_sync.filter",
    ),
    (
        "flowwarden_django.streams.copy_progress",
        "CopyProgress",
        "flowwarden_django.streams.initial_sync.progress",
    ),
    ("flowwarden_django.streams.resync", "request_resync", "flowwarden_django.streams"),
    ("flowwarden_django.workflows.user_json", "UserJSONError", "flowwarden_django.workflows"),
    # the workflows package's 0.1.0 modules (issue 46: now in subpackages)
    ("flowwarden_django.workflows.approvals", "approve", "flowwarden_django.workflows"),
    (
        "flowwarden_django.workflows.approvals",
        "sweep_approvals",
        "flowwarden_django.workflows.waiting.approvals",
    ),
    (
        "flowwarden_django.workflows.cancellation",
        "cancel_coordination",
        "flowwarden_django.workflows",
    ),
    (
        "flowwarden_django.workflows.encryption",
        "generate_key",
        "flowwarden_django.workflows.storage.encryption",
    ),
    (
        "flowwarden_django.workflows.patches",
        "UndeclaredPatchError",
        "flowwarden_django.workflows.definition.patches",
    ),
    ("flowwarden_django.workflows.registry", "workflow_registry", "flowwarden_django.workflows"),
    ("flowwarden_django.workflows.results", "Completed", "flowwarden_django.workflows"),
    (
        "flowwarden_django.workflows.schedule_ticks",
        "ScheduleError",
        "flowwarden_django.workflows.operations.schedule_ticks",
    ),
    (
        "flowwarden_django.workflows.serializers",
        "JsonStateSerializer",
        "flowwarden_django.workflows.storage.serializers",
    ),
    (
        "flowwarden_django.workflows.signals",
        "snapshot_saved",
        "flowwarden_django.workflows.storage.signals",
    ),
    ("flowwarden_django.workflows.snapshot", "WorkflowSnapshot", "flowwarden_django.workflows"),
    (
        "flowwarden_django.workflows.step_timings",
        "step_timing_of",
        "flowwarden_django.workflows.execution.step_timings",
    ),
    ("flowwarden_django.workflows.steps", "advance", "flowwarden_django.workflows"),
    ("flowwarden_django.workflows.store", "SnapshotStore", "flowwarden_django.workflows"),
    (
        "flowwarden_django.workflows.store",
        "store_for_workflow",
        "flowwarden_django.workflows.definition.registry",
    ),
    (
        "flowwarden_django.workflows.upgrades",
        "upgrade_runs",
        "flowwarden_django.workflows.operations.upgrades",
    ),
    ("flowwarden_django.workflows.engine", "Workflow", "flowwarden_django.workflows"),
    (
        "flowwarden_django.workflows.engine",
        "StepAttemptFailed",
        "flowwarden_django.workflows.engine.calling",
    ),
    ("flowwarden_django.workflows.execution", "InProcessProvider", "flowwarden_django.workflows"),
    ("flowwarden_django.workflows.runs", "RunRecords", "flowwarden_django.workflows.runs.records"),
]


@pytest.mark.parametrize(("old", "name", "new"), MOVED)
def test_an_old_path_imports_the_same_object_and_warns_with_the_new_import(
    old: str, name: str, new: str
) -> None:
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning) as caught:
        value = getattr(module, name)
    message = str(caught[0].message)
    assert f"from {new} import {name}" in message
    assert REMOVED_IN in message
    assert caught[0].filename == __file__  # points at the importer, not at the shim
    home = importlib.import_module(new)
    assert getattr(home, name) is value


def test_from_import_at_an_old_path_warns() -> None:
    with pytest.warns(DeprecationWarning, match="from flowwarden_django.streams import"):
        from flowwarden_django.streams.manager import StreamManager  # noqa: F401


def test_an_old_path_has_no_names_the_new_module_lacks() -> None:
    module = importlib.import_module("flowwarden_django.streams.manager")
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        module.Nope  # noqa: B018


def test_the_changelog_names_each_deprecated_path_and_its_removal() -> None:
    from .test_exports import ROOT

    changelog = (ROOT / "CHANGELOG.md").read_text()
    for old in sorted({old for old, _, _ in MOVED}):
        assert f"`{old}`" in changelog, old
    assert f"removed in {REMOVED_IN}" in changelog
