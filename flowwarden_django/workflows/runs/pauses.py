"""How the run records move a run that no runner holds between its pauses: a decision
accepted, a wait left or started at a fork, a wait failed, a run marked for an
upgrade."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from .leases import unclaimed
from .rows import RunRows
from .status import RunStatus


class RunPauses(RunRows):
    """``RunRecords``' writes of a paused run no runner holds (each one conditional
    ``UPDATE``: False when the run was not where the caller expected it)."""

    def accept_decision(self, coordination_id: str, head: str, resume_input: Any) -> bool:
        """Move a run waiting at snapshot *head* (and not claimed) to ``running`` with
        *resume_input* stored (one conditional ``UPDATE``); False when it is not
        waiting there any more. From then on any runner, or the recovery sweep,
        continues it with that input."""
        return (
            self._waiting_at(coordination_id, head).update(
                status=RunStatus.RUNNING, resume_input=resume_input, updated_at=timezone.now()
            )
            == 1
        )

    def leave_waiting(self, coordination_id: str) -> bool:
        """Make a waiting run ``hibernated`` (it was forked: ``run()`` continues it
        from the fork); False when it was not waiting."""
        rows = self._rows().filter(pk=coordination_id, status=RunStatus.WAITING)
        return rows.update(status=RunStatus.HIBERNATED, updated_at=timezone.now()) == 1

    def wait_at(self, coordination_id: str, head: str) -> bool:
        """Make an unclaimed run wait for a decision at snapshot *head* (a fork of a
        snapshot that asked for one), dropping any input it held; False when a runner
        holds it (the engine then makes it wait when it reaches *head*)."""
        # A cancelled run stays cancelled: a fork does not bring it back (a completed
        # one may be forked back to a question, as it always could).
        rows = self._rows().filter(unclaimed(), pk=coordination_id)
        rows = rows.exclude(status=RunStatus.CANCELLED)
        fields = {"status": RunStatus.WAITING, "head_snapshot_id": head, "resume_input": None}
        return rows.update(**fields, failure_reason="", updated_at=timezone.now()) == 1

    def fail_waiting(self, coordination_id: str, head: str, reason: str) -> bool:
        """Fail a run waiting at snapshot *head* (not claimed); False when it is not
        waiting there any more."""
        return (
            self._waiting_at(coordination_id, head).update(
                status=RunStatus.FAILED, failure_reason=reason, updated_at=timezone.now()
            )
            == 1
        )

    def needs_upgrade(
        self, coordination_id: str, reason: str, *, only_if_idle: bool = False
    ) -> bool:
        """Mark the run ``needs_upgrade`` with *reason* (its input and head kept), if
        no runner holds it and it is not completed; *only_if_idle*: only a
        hibernated or already stranded run (a running or waiting run may be continued
        by a process that has its definition; a failed run keeps its failure).
        False when not marked."""
        statuses = (
            (RunStatus.HIBERNATED, RunStatus.NEEDS_UPGRADE)
            if only_if_idle
            else (*RunStatus.UPGRADABLE, RunStatus.RUNNING)
        )
        rows = self._rows().filter(unclaimed(), pk=coordination_id, status__in=statuses)
        fields = {"status": RunStatus.NEEDS_UPGRADE, "failure_reason": reason}
        return rows.update(**fields, updated_at=timezone.now()) == 1

    def _waiting_at(self, coordination_id: str, head: str) -> Any:
        return self._rows().filter(
            unclaimed(), pk=coordination_id, status=RunStatus.WAITING, head_snapshot_id=head
        )
