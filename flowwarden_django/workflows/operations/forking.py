"""Forking a run: a new snapshot off any of its snapshots, and what that does to the
run's record and to an approval it was waiting for."""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any

from django.db import transaction

from ..execution.providers import configured_provider
from ..runs.records import RunRecords
from ..waiting.approvals.request import request_approval, request_from_snapshot
from ..waiting.approvals.sweep import cancel_stale_approvals
from ..waiting.messages.waiting import follow_fork

if TYPE_CHECKING:
    from ..storage.snapshot import WorkflowSnapshot
    from ..storage.store import SnapshotStore

logger = logging.getLogger("flowwarden_django.workflows")


def fork_snapshot(
    store: SnapshotStore, snapshot_id: str, new_state: Any, *, using: str | None = None
) -> WorkflowSnapshot:
    """Fork *snapshot_id* in *store* with *new_state* (the new latest snapshot of its
    coordination).

    A pending approval of the run is cancelled: a decision must never apply to a
    state its approver did not see. When the source is a snapshot whose step asked
    for a decision (``await_approval``), the fork asks again: the run waits at the
    fork with a fresh approval of the new state, so a fork never takes a run past
    that step without a decision (the engine holds it there too, whoever runs it).
    Otherwise a run that was waiting becomes ``hibernated``, and the next ``run()``
    continues from the fork. A fork of a snapshot that waits for a message waits for
    a new one (``waiting.messages.waiting.follow_fork``).
    """
    forked = store.fork(snapshot_id, new_state)
    cid = forked.coordination_id
    runs = RunRecords(using)
    request = request_from_snapshot(forked)
    waits_for_message = follow_fork(forked, runs)
    if request is None and not waits_for_message:
        runs.leave_waiting(cid)
    elif request is not None and runs.wait_at(cid, forked.id):
        request_approval(forked, request, using=runs.db)
    cancel_stale_approvals(using=runs.db, coordination_id=cid)
    transaction.on_commit(partial(_tell_provider, cid, runs.db), using=runs.db)
    return forked


def _tell_provider(coordination_id: str, using: str) -> None:
    try:
        configured_provider().run_changed(coordination_id, using)
    except Exception:  # the fork is made; the provider catches up on the next wake
        logger.warning(
            "run %s was forked; telling its provider failed", coordination_id, exc_info=True
        )
