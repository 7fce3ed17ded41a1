"""Letting go of run claims that a database outage kept a runner from releasing.

A runner that loses its database in the middle of a run cannot release its claim
(the ``UPDATE`` fails too), so the run would stay claimed until the lease runs out
(``WORKFLOW_RUN_LEASE``). Instead the claim is handed to ``pending_releases``: a
daemon thread retries the release until the database answers (then the sweep
continues the run at once: the release leaves ``updated_at`` as it was), or until the
lease has run out anyway. A runner *process* that dies cannot hand its claim over,
but nobody renews that claim any more (``workflows.claim_keeper``), so it runs out
within one lease and the sweep takes the run then.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ...common.connections import discard_unusable_connections
from ...common.failure_log import FailureLog
from ..runs.records import LeaseLostError, RunRecords, run_lease

logger = logging.getLogger("flowwarden_django.workflows")


class PendingReleases:
    """Claims to let go of once the database answers again. Thread-safe; its thread
    starts with the first claim and ends when none is left."""

    #: Seconds between two rounds of attempts.
    retry_seconds = 0.5

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str, str], tuple[float, dict[str, Any]]] = {}
        self._thread: threading.Thread | None = None
        self.failure_log = FailureLog(logger, "workflows: releasing interrupted run claims")

    def add(self, using: str, coordination_id: str, runner: str, fields: dict[str, Any]) -> None:
        """Release *runner*'s claim on the run (setting *fields*) as soon as possible."""
        deadline = time.monotonic() + run_lease().total_seconds()
        with self._lock:
            self._pending[(using, coordination_id, runner)] = (deadline, dict(fields))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._work, name="fw-run-releases", daemon=True
                )
                self._thread.start()

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    def release_due(self) -> int:
        """One round: try every pending release; how many are left."""
        with self._lock:
            items = list(self._pending.items())
        for key, (deadline, fields) in items:
            using, cid, runner = key
            if time.monotonic() >= deadline:  # the claim has run out anyway
                self._forget(key)
                continue
            try:
                released = RunRecords(using).release(cid, runner, touch=False, **fields)
            except Exception as exc:
                self.failure_log.failed(exc)
                discard_unusable_connections()
                continue
            self.failure_log.succeeded()
            self._forget(key)
            if released:
                logger.info("workflow run %s: its interrupted claim is released", cid)
        return len(self)

    def _forget(self, key: tuple[str, str, str]) -> None:
        with self._lock:
            self._pending.pop(key, None)

    def _work(self) -> None:
        try:
            while self.release_due():
                time.sleep(self.retry_seconds)
        finally:
            from django.db import connections

            connections.close_all()


#: This process's pending releases.
pending_releases = PendingReleases()


def release_or_defer(
    runs: RunRecords, coordination_id: str, runner: str, fields: dict[str, Any]
) -> None:
    """Let go of *runner*'s claim on the run, writing *fields* (the head and last step
    the run record has not caught up with); never raises. When the database does
    not answer, ``pending_releases`` makes the release once it does."""
    try:
        if fields:
            runs.finish(coordination_id, runner, **fields)
        else:
            runs.release(coordination_id, runner)
    except LeaseLostError:
        pass  # taken over meanwhile: nothing of ours to let go
    except Exception as exc:
        logger.warning(
            "workflow run %s: its claim could not be released (%s: %s); it is released "
            "when the database answers again",
            coordination_id,
            type(exc).__name__,
            exc,
        )
        discard_unusable_connections()
        pending_releases.add(runs.db, coordination_id, runner, fields)


def release_after_failed_claim(runs: RunRecords, coordination_id: str, runner: str) -> None:
    """After a database error broke off claiming the run for *runner* (a new token
    nobody else knows): the claim may have been taken before the error, say the
    ``UPDATE`` committed and reading the row back failed. ``pending_releases`` lets go
    of it once the database answers (a no-op when there was no claim). Nothing is
    queued when the error came from connecting (no statement was sent). Never raises,
    logs nothing: the caller gets the error."""
    from django.db import connections

    try:
        sent = connections[runs.db].connection is not None
    except Exception:
        sent = True
    discard_unusable_connections()
    if sent:
        pending_releases.add(runs.db, coordination_id, runner, {})
