"""Forking a run: a new snapshot off any of its snapshots, and what that does to the
run's record and to an approval it was waiting for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .runs import RunRecords

if TYPE_CHECKING:
    from .snapshot import WorkflowSnapshot
    from .store import SnapshotStore


def fork_snapshot(
    store: SnapshotStore, snapshot_id: str, new_state: Any, *, using: str | None = None
) -> WorkflowSnapshot:
    """Fork *snapshot_id* in *store* with *new_state* (the new latest snapshot of its
    coordination). A run that was waiting for an approval becomes ``hibernated`` (the
    next ``run()`` continues from the fork) and its pending approval is cancelled:
    a decision must never apply to a state its approver did not see."""
    from .approvals.sweep import cancel_stale_approvals

    forked = store.fork(snapshot_id, new_state)
    runs = RunRecords(using)
    runs.leave_waiting(forked.coordination_id)
    cancel_stale_approvals(using=runs.db, coordination_id=forked.coordination_id)
    return forked
