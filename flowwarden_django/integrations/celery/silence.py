"""A worker whose database has gone silent stops taking tasks (issue 51).

A worker cut off from PostgreSQL alone (its broker still answers) would go on taking
tasks from the broker: among them the step that the other workers' recovery sweep
queues again once the cut-off worker's claim has run out. That step would then block on
the silent database in the cut-off worker, its message held there (and renewed:
``visibility``), and its run stall for as long as the partition lasts.

What tells a worker its database is silent: the claims its process keeps alive
(``workflows.claim_keeper``). A claim whose renewals have not held for
:data:`LAPSING_FRACTION` of its lease (``ClaimKeeper.lapsing``) has a database that
does not answer: every renewal blocked on a silent connection, or failing. Then:

* :class:`SilentDatabaseBootstep` (a step of the worker's Consumer blueprint) looks
  every :data:`CHECK_INTERVAL` seconds, on the worker's event loop, and while a claim
  is lapsing cancels the worker's task consumer on every queue it consumes (a task of
  the same worker needs the same database): the broker gives the step queued again,
  and every other message, to the other workers. Once no claim is lapsing (a renewal
  held again, or the claim was dropped: its step ended or was taken over), it
  consumes them all again. A connection lost to the broker restarts the consumer,
  which consumes every queue again until the next look.
* A step task that starts while a claim of its process on the step's database is
  lapsing (:func:`silent_database`) hands itself back before touching the database:
  the same message (hand-off and all) is published again on its queue and this one
  acknowledged (``provider.run_step``): a message the worker had reserved before its
  consumer was cancelled. At most :data:`MAX_SILENT_HANDBACKS` times, after which the
  task runs (and waits for the database) where it is.

Neither changes what a step does once it runs: a step handed back has not touched the
database, and its copy is checked like any delivery (its head, the hold it carries, the
``seq`` of its snapshot), so a merely slow database costs throughput, never a second
save. No message is lost: a cancelled consumer leaves the messages with the broker, a
reserved one runs or is handed back, and a hand-back publishes the copy before the
original is acknowledged.

The bound: the worker stops consuming within half a lease (``WORKFLOW_RUN_LEASE``) and
:data:`CHECK_INTERVAL` of its last renewal that held (at most a quarter of a lease
before the cut); the claim runs out a lease after that renewal, and another worker's
sweep queues the step within ``WORKFLOW_SWEEP_INTERVAL`` and runs it. The run so
continues within ``1.25 * lease + WORKFLOW_SWEEP_INTERVAL`` of the cut (14.5 s with
the defaults) plus its step's own time.

Pools: the step sees the claims of the worker's main process, where the ``threads``,
``solo``, ``gevent`` and ``eventlet`` pools run their tasks. A ``prefork`` child's
claims are its own: such a worker is not paused, and a step queued again may still go
to one of its idle children (its claim waits for the database; its run is taken again
by the sweep after ``WORKFLOW_RECOVER_AFTER``).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

logger = logging.getLogger("flowwarden_django.celery")

#: The share of its lease a claim goes unrenewed before its database counts as silent.
LAPSING_FRACTION = 0.5
#: Seconds between two looks at the claims.
CHECK_INTERVAL = 0.25
#: How many times a step task is handed back because its worker's database is silent
#: (its ``handbacks``) before it runs where it is.
MAX_SILENT_HANDBACKS = 20


def silent_databases(fraction: float = LAPSING_FRACTION) -> set[str]:
    """The aliases of the databases this process holds a lapsing claim on: one not
    renewed for *fraction* of its lease (``ClaimKeeper.lapsing``)."""
    from ...workflows.execution.claim_keeper import claim_keeper

    return {claim.using for claim in claim_keeper.lapsing(fraction)}


def silent_database(using: str) -> bool:
    """Whether database *using* is silent for this process (see :func:`silent_databases`)."""
    return using in silent_databases()


class ConsumerGate:
    """Cancels a Celery consumer's task consumer on every queue while
    ``silent()`` names a database, and consumes them again once it names none."""

    def __init__(self, consumer: Any, silent: Any = silent_databases) -> None:
        self.consumer = consumer
        self.silent = silent
        #: The queues cancelled (kombu ``Queue`` objects); empty while consuming.
        self.paused: list[Any] = []

    def check(self) -> None:
        """One look: pause or resume as the claims say (never raises)."""
        try:
            silent = self.silent()
            if silent and not self.paused:
                self.pause(silent)
            elif not silent and self.paused:
                self.resume()
        except Exception:
            logger.exception("flowwarden: pausing or resuming the task consumer failed")

    def pause(self, silent: set[str]) -> None:
        task_consumer = self.consumer.task_consumer
        queues = list(task_consumer.queues)
        for queue in queues:
            task_consumer.cancel_by_queue(queue.name)
        self.paused = queues
        logger.warning(
            "flowwarden: database silent (%s: run claims not renewed for %d%% of their "
            "lease); this worker stops taking tasks from %s until it answers",
            ", ".join(sorted(silent)),
            round(LAPSING_FRACTION * 100),
            _names(queues),
        )

    def resume(self) -> None:
        task_consumer = self.consumer.task_consumer
        queues, self.paused = self.paused, []
        for queue in queues:
            if not task_consumer.consuming_from(queue.name):
                task_consumer.add_queue(queue)
        task_consumer.consume()
        logger.info(
            "flowwarden: database answers again; this worker takes tasks from %s again",
            _names(queues),
        )


def _names(queues: list[Any], shown: int = 3) -> str:
    """The first *shown* of *queues*' names, and how many more (a worker consumes a
    queue per workflow version besides its own)."""
    names = [queue.name for queue in queues]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


class SilentDatabaseBootstep(bootsteps.StartStopStep):
    """Runs a :class:`ConsumerGate` every :data:`CHECK_INTERVAL` on the worker's timer
    (its event loop) while the consumer runs; see the module docstring. Added to the
    workers of a project whose ``WORKFLOW_EXECUTION`` is ``"celery"``
    (``bootstep.install_from_settings``)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.gate: ConsumerGate | None = None
        self.timer_entry: Any = None

    def start(self, parent: Any) -> None:
        self.gate = ConsumerGate(parent)
        self.timer_entry = parent.timer.call_repeatedly(CHECK_INTERVAL, self.gate.check)

    def stop(self, parent: Any) -> None:
        # The Tasks step's consumer goes with the connection; the next start consumes
        # every queue again with a new one.
        entry, self.timer_entry, self.gate = self.timer_entry, None, None
        if entry is not None:
            entry.cancel()

    shutdown = stop
