"""Calling one step: its outcome, in this thread or, with a ``timeout``, in a thread
of its own that is given up on (``StepTimeoutError``) when it runs too long."""

from __future__ import annotations

import contextvars
import threading
from typing import Any

from django.db import connections

from ..definition.steps import StepContext, StepOutcome, WorkflowStep


class StepAttemptFailed(Exception):
    """One attempt of a step failed and a later one may succeed: raised by
    ``run_local(attempt=...)`` for the provider to schedule the next attempt after the
    step's ``retry_delay``. Nothing was persisted."""

    def __init__(self, step: WorkflowStep, attempt: int, error: Exception) -> None:
        super().__init__(
            f"step {step.name!r} attempt {attempt}/{step.max_retries + 1} failed: "
            f"{type(error).__name__}: {error}"
        )
        self.step_name = step.name
        self.attempt = attempt
        self.retry_delay = float(step.retry_delay or 0)


class StepTimeoutError(TimeoutError):
    """A step attempt ran longer than its ``timeout``.

    The attempt counts as failed (and is retried within ``max_retries``). Python
    cannot stop a thread, so the timed-out attempt keeps running in its daemon thread
    until it returns on its own; its outcome is ignored. Steps with a timeout must
    therefore be idempotent like any other (the Celery provider can use a hard
    ``time_limit`` instead).
    """


def call_step(current: WorkflowStep, state: Any, ctx: StepContext) -> StepOutcome:
    """*current*'s outcome on *state*, within its ``timeout`` when it has one."""
    if current.timeout is None:
        return current.execute(state, ctx)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["outcome"] = current.execute(state, ctx)
        except BaseException as exc:  # handed to the waiting thread
            box["error"] = exc
        finally:
            connections.close_all()  # this thread's connections only

    thread = threading.Thread(
        target=contextvars.copy_context().run,
        args=(target,),
        name=f"fw-step-{current.name}",
        daemon=True,  # a step that never returns must not keep the process alive
    )
    thread.start()
    thread.join(current.timeout)
    if thread.is_alive():
        raise StepTimeoutError(
            f"step {current.name!r} did not finish within {current.timeout:g}s "
            f"(attempt {ctx.attempt})"
        )
    if "error" in box:
        raise box["error"]
    return box["outcome"]
