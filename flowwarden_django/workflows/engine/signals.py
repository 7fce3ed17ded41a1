"""The signal the engine sends after each step attempt: connect a receiver to watch
steps run wherever they run (the Prometheus step-duration histogram is one).

``step_attempted`` is sent with ``sender=`` the workflow's name and the keyword
arguments ``workflow`` (name), ``version``, ``step``, ``attempt`` (from 1),
``duration`` (seconds) and ``error`` (the exception's class name; ``""`` when the
attempt returned an outcome). A receiver that raises is logged, never the step's
failure.
"""

from __future__ import annotations

import logging

from django.dispatch import Signal

from ...common.robust_signals import send_logged

logger = logging.getLogger("flowwarden_django.workflows")

step_attempted = Signal()


def send_step_attempted(
    workflow: str, version: int, step: str, attempt: int, duration: float, error: str = ""
) -> None:
    """Send ``step_attempted`` (nothing to do, and nothing built, without receivers)."""
    if not step_attempted.receivers:
        return
    send_logged(
        step_attempted,
        logger,
        "step_attempted receiver %r failed",
        sender=workflow,
        workflow=workflow,
        version=version,
        step=step,
        attempt=attempt,
        duration=duration,
        error=error,
    )
