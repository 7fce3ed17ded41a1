"""Waking a run that waits for a message its mailbox now holds.

Two sides check, each after its own commit, so a wake-up is never lost: the sender,
once its transaction committed (``transaction.on_commit``), and the runner, once the
wait is persisted (``WaitForMessage.on_paused``, and when a run is found still
waiting). Whichever commits last sees the other's write: the message, or the run's
``waiting_message`` status. The wake itself is one conditional ``UPDATE``
(``mailbox.wake_for_mail``), so of the two at most one continues the run. What a
crash loses in between, the recovery sweep finds (``mailbox.runs_with_mail``).

A woken run continues through the configured execution provider: in-process its
steps run in this thread; Celery queues its next step; Temporal signals the run's
workflow (a ``wake`` without input), except when the runner that found the message
is the run's own step activity: its report then says the run is ``running``, and
the workflow goes on without a signal. In-process, a run woken while
this thread already continues one (a wait whose message was there) is queued behind
it instead of nesting: a run that takes a thousand messages in a row runs them one
after the other, not a thousand frames deep.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

from ...definition.registry import Coordination, workflow_for, workflow_registry
from ...runs.records import ConcurrentRunError, RunRecords
from .mailbox import wake_for_mail

logger = logging.getLogger("flowwarden_django.workflows")

_continuing = threading.local()


def wake_if_mail(coordination_id: str, using: str, workflow: Coordination | None = None) -> bool:
    """Continue run *coordination_id* (in database *using*) if it waits for a message
    its mailbox holds and no runner holds it; True if it did (see the module).
    *workflow*: the run's ``Workflow`` to continue it with (default: its registered
    definition's)."""
    if not wake_for_mail(coordination_id, using):
        return False
    continue_run(coordination_id, using, workflow)
    return True


def wake_after_send(
    coordination_id: str,
    using: str,
    workflow_name: str | None = None,
    version: int = 1,
    workflow: Coordination | None = None,
) -> None:
    """``wake_if_mail`` once a send committed, with *workflow* when given. Else a run
    whose workflow (*workflow_name*, *version*; by default its record's) this process
    does not define is left to the sweep of one that does (never moved here: nothing
    would continue it). Never raises."""
    try:
        if workflow is None and workflow_name is None:
            record = RunRecords(using).get(coordination_id)
            if record is None:
                return
            workflow_name, version = record.workflow_name, record.workflow_version
        if workflow is None and not workflow_registry.defines(workflow_name or "", version):
            logger.info(
                "run %s has a message, and its workflow %r (version %d) is not defined "
                "here; the recovery sweep of a process that defines it delivers it",
                coordination_id,
                workflow_name,
                version,
            )
            return
        wake_if_mail(coordination_id, using, workflow)
    except Exception:
        logger.exception(
            "run %s has a message, but waking it failed; the recovery sweep delivers it",
            coordination_id,
        )


def continue_run(coordination_id: str, using: str, workflow: Coordination | None = None) -> None:
    """Continue a woken run through the provider (see the module), with *workflow*
    when given; an error is logged: the run is ``running``, and the recovery sweep
    continues it."""
    queue: deque[_Woken] | None = getattr(_continuing, "queue", None)
    if queue is not None:  # this thread is continuing a run already: it takes this one next
        queue.append((coordination_id, using, workflow))
        return
    queue = _continuing.queue = deque([(coordination_id, using, workflow)])
    try:
        while queue:
            _continue(*queue.popleft())
    finally:
        _continuing.queue = None


#: A run to continue: its coordination id, database and ``Workflow`` (if known).
_Woken = tuple[str, str, "Coordination | None"]


def _continue(coordination_id: str, using: str, workflow: Coordination | None) -> None:
    try:
        if workflow is None:
            workflow = workflow_for(coordination_id, using=using, mark=False)
        workflow.run()
    except ConcurrentRunError as exc:
        logger.info("run %s got a message, and is being run elsewhere: %s", coordination_id, exc)
    except Exception:
        logger.exception(
            "run %s got a message, but continuing it failed; the recovery sweep continues it",
            coordination_id,
        )
