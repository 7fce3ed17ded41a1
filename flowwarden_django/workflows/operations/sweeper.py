"""A thread that runs the recovery sweep every ``WORKFLOW_SWEEP_INTERVAL``.

Celery workers run one (``integrations.celery.sweep``), so a run whose worker died is
continued by the surviving or restarted workers within seconds, with no beat. A sweep
that fails (the database or the broker is away) is logged once while it fails, and
tried again at the next tick.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ...common.connections import discard_unusable_connections
from ...common.daemon_threads import DaemonThread
from ...common.durations import parse_duration
from ...common.failure_log import FailureLog
from ...conf import fw_settings

logger = logging.getLogger("flowwarden_django.workflows")


def sweep_interval() -> float:
    """``FLOWWARDEN["WORKFLOW_SWEEP_INTERVAL"]`` in seconds."""
    return parse_duration(fw_settings.WORKFLOW_SWEEP_INTERVAL)


class SweepThread(DaemonThread):
    """Calls *sweep* (which returns the coordination ids it continued) every
    *interval* seconds on a daemon thread, from :meth:`start` until :meth:`stop`."""

    def __init__(self, sweep: Callable[[], list[str]], interval: float | None = None) -> None:
        self.sweep = sweep
        self.interval = sweep_interval() if interval is None else interval
        super().__init__("fw-workflow-sweep")
        self.failure_log = FailureLog(logger, "workflows: the recovery sweep")

    def run_once(self) -> list[str]:
        """One sweep; never raises (a failure is logged and retried next tick)."""
        try:
            continued = self.sweep()
        except Exception as exc:
            self.failure_log.failed(exc)
            discard_unusable_connections()
            return []
        self.failure_log.succeeded()
        if continued:
            logger.info(
                "recovery sweep: continued %d stalled run(s): %s", len(continued), continued
            )
        return continued

    def _work(self) -> None:
        from django.db import connections

        try:
            while not self._stop.wait(self.interval):
                self.run_once()
        finally:
            connections.close_all()
