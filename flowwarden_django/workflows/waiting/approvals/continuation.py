"""Who continues a run after its approval is decided, when this process cannot.

A decision is recorded whatever the process, but only a process that defines the
run's workflow (and its version) can continue the run: elsewhere it stays
``running`` with the decision as its input until a process that defines it picks it
up. ``continuation_warning`` says so in words for the person who decided (the
inbox, the API, the commands), instead of only in this process's log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...definition.registry import workflow_registry
from ...execution.providers import RemoteExecutionProvider, configured_provider
from ...runs.records import RunRecords, RunStatus

if TYPE_CHECKING:
    from ....models import Approval

DEFINE_HINT = (
    "Define workflows in an app's workflows.py (found at start-up, like admin.py), so "
    "that every process has them."
)


def continuation_warning(approval: Approval, using: str | None = None) -> str:
    """Why this process does not continue *approval*'s run, and who does; ``""``
    when it does (its workflow and version are defined here) or the run is
    finished."""
    record = RunRecords(using).get(approval.coordination_id)
    if record is None or record.status in RunStatus.FINAL:
        return ""
    name, version = record.workflow_name, record.workflow_version
    if workflow_registry.defines(name, version):
        return ""
    defined = workflow_registry.versions(name)
    if defined:
        missing = (
            f"this process defines workflow {name!r} only in version "
            f"{', '.join(map(str, defined))}, not version {version} that run "
            f"{record.coordination_id} is on"
        )
    else:
        missing = f"this process does not define workflow {name!r} of run {record.coordination_id}"
    return f"The decision is recorded, but {missing}, so the run did not continue here. " + _who(
        record.coordination_id
    )


def _who(coordination_id: str) -> str:
    """Who continues the run, for the configured execution provider."""
    try:
        remote = isinstance(configured_provider(), RemoteExecutionProvider)
    except Exception:  # a wrong setting: the check reports it; say the in-process case
        remote = False
    if remote:
        return (
            "A worker that defines the workflow continues it (its recovery sweep, within "
            "about WORKFLOW_RECOVER_AFTER). " + DEFINE_HINT
        )
    return (
        "It stays running until a process that defines the workflow continues it, e.g. "
        f"`manage.py flowwarden_workflows resume {coordination_id}` or `manage.py "
        "flowwarden_workflows recover` there. " + DEFINE_HINT
    )
