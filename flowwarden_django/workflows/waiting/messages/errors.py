"""Why a message was refused; each error has a stable ``code``."""

from __future__ import annotations


class RunFinishedError(RuntimeError):
    """The run the message was sent to has finished (``completed``): it never waits
    again, so nothing was stored. ``status`` is the run's status."""

    code = "run_finished"

    def __init__(self, coordination_id: str, status: str) -> None:
        self.coordination_id = coordination_id
        self.status = status
        super().__init__(f"workflow run {coordination_id!r} is {status}: it takes no more messages")


class RunCancelledError(RunFinishedError):
    """The run the message was sent to was cancelled: refused, nothing stored."""

    code = "run_cancelled"
