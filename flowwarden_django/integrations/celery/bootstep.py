"""The Celery worker step that runs the registered streams, and ``install(app)``.

See the package docstring for how to enable it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Celery, bootsteps, signals

# shared_tasks: registered on every app, including the one install() is given, once
# this module is imported.
from . import tasks as _tasks  # noqa: F401

logger = logging.getLogger("flowwarden_django.celery")


class StreamsBootstep(bootsteps.StartStopStep):
    """Runs the registered streams in the worker's main process while the worker runs.

    It is a step of the **Worker** blueprint, not of the Consumer blueprint. Worker
    steps start once, in the main process, after the pool (so prefork children are
    forked before any stream thread exists and never run streams themselves), and are
    stopped once at shutdown, in reverse order, before the pool. Consumer steps are
    restarted every time the broker connection is lost, which would bounce every
    stream on a broker hiccup that has nothing to do with MongoDB; and a
    ``ConsumerStep`` only attaches kombu consumers, not a change-stream cursor.

    ``start`` calls ``new_stream_manager().start_all()`` (every enabled auto-start
    stream, each on its own thread, or all on one event loop when
    ``FLOWWARDEN["STREAM_RUNNER"]`` is ``"asyncio"``); a warm shutdown (SIGTERM, or
    SIGINT once) calls ``stop_all(stop_timeout)``, which lets each stream finish the
    event in hand and flush its processed anchor. A cold shutdown asks the same but waits only
    ``terminate_timeout`` seconds per stream.

    Use it with the prefork, solo or threads pool: under gevent/eventlet the stream
    threads would be green threads blocked by the driver.
    """

    requires = ("celery.worker.components:Pool",)

    #: Seconds to wait for each stream at a warm shutdown (``None``: as long as it takes).
    stop_timeout: float | None = 30.0
    #: Seconds to wait for each stream at a cold shutdown.
    terminate_timeout: float | None = 5.0

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.manager: Any = None

    def start(self, parent: Any) -> None:
        # Imported here: the app module imports this one before Django is set up.
        from ...conf import fw_settings
        from ...streams.runtime.async_manager import new_stream_manager
        from ...streams.runtime.manager import default_instance_id

        # The worker's node name (celery@host) plus the pid names this process in
        # leases and status rows, unless FLOWWARDEN["INSTANCE_ID"] is set.
        hostname = getattr(parent, "hostname", None)
        instance_id = fw_settings.INSTANCE_ID or (
            f"{hostname}:{os.getpid()}" if hostname else default_instance_id()
        )
        manager = new_stream_manager(instance_id=instance_id)
        try:
            manager.start_all()
        except BaseException:
            # A worker that fails to start never calls stop(): end what did start, or
            # its non-daemon threads would keep the process alive.
            manager.stop_all(timeout=self.terminate_timeout)
            raise
        self.manager = manager
        logger.info(
            "flowwarden: streams running in worker %s (pid %d)",
            getattr(parent, "hostname", "?"),
            os.getpid(),
        )

    def stop(self, parent: Any) -> None:
        self._stop_streams(self.stop_timeout, "warm")

    def terminate(self, parent: Any) -> None:
        self._stop_streams(self.terminate_timeout, "cold")

    def _stop_streams(self, timeout: float | None, how: str) -> None:
        manager, self.manager = self.manager, None
        if manager is None:
            return
        logger.info("flowwarden: stopping streams (%s shutdown)", how)
        manager.stop_all(timeout=timeout)
        logger.info("flowwarden: streams stopped")


class WorkflowSweepBootstep(bootsteps.StartStopStep):
    """Runs the workflow recovery sweep (``workflows.operations.recovery``) in the worker's main
    process every ``FLOWWARDEN["WORKFLOW_SWEEP_INTERVAL"]`` (2 s) while the worker
    runs, queueing the next step of every stalled run with the worker's app.

    A run whose worker died is so continued by whichever worker is alive, within a
    claim's lease (``WORKFLOW_RUN_LEASE``, 10 s) and one sweep interval, with no beat
    and no redelivery to wait for. Every worker sweeps; a run is handed over once
    (the sweep takes it with a conditional ``UPDATE``). Added to the workers of a
    project whose ``WORKFLOW_EXECUTION`` is ``"celery"`` (unless
    ``CELERY_RUN_WORKFLOW_SWEEP`` is False), or by ``install(app, sweep=True)``.
    """

    requires = ("celery.worker.components:Pool",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.thread: Any = None

    def start(self, parent: Any) -> None:
        from ...workflows.operations.sweeper import SweepThread
        from .provider import recover_workflows

        app = parent.app
        self.thread = SweepThread(lambda: recover_workflows(app))
        self.thread.start()
        logger.info(
            "flowwarden: workflow recovery sweep every %s s in worker %s",
            self.thread.interval,
            getattr(parent, "hostname", "?"),
        )

    def stop(self, parent: Any) -> None:
        thread, self.thread = self.thread, None
        if thread is not None:
            thread.stop()

    terminate = stop


def install(app: Celery) -> None:
    """Add :class:`StreamsBootstep` to *app*'s workers and register the replay and purge
    tasks; calling it again changes nothing."""
    app.steps["worker"].add(StreamsBootstep)


@signals.worker_init.connect(weak=False, dispatch_uid="flowwarden_django.celery.run_streams")
def install_from_settings(sender: Any = None, **kwargs: Any) -> None:
    """``FLOWWARDEN["CELERY_RUN_STREAMS"]``: add the streams step to the starting
    worker's app; ``WORKFLOW_EXECUTION = "celery"``: add the workflow sweep's step,
    and the consumer step that stops taking tasks while the worker's database is
    silent (``silence.SilentDatabaseBootstep``).

    Every worker also gets the connection settings that notice a silent partition
    within ``DEAD_CONNECTION_TIMEOUT`` and, on a Redis broker, the short renewed
    visibility timeout (:func:`configure_worker_connections`).

    ``worker_init`` is sent after the worker has imported its task modules (and so
    this one, through ``flowwarden_django.tasks``) and before it reads
    ``app.steps["worker"]`` to build its blueprint or connects to the broker.
    """
    from ...conf import fw_settings

    app = getattr(sender, "app", None)
    if app is None:
        return
    configure_worker_connections(app)
    if fw_settings.CELERY_RUN_STREAMS:
        install(app)
    execution = str(fw_settings.WORKFLOW_EXECUTION)
    celery_steps = execution == "celery" or execution.endswith(".CeleryExecutionProvider")
    if celery_steps:
        # A worker cut off from its database stops taking steps (``silence``).
        from .silence import SilentDatabaseBootstep

        app.steps["consumer"].add(SilentDatabaseBootstep)
    if celery_steps and fw_settings.CELERY_RUN_WORKFLOW_SWEEP:
        install_workflow_sweep(app)


@signals.celeryd_after_setup.connect(
    weak=False, dispatch_uid="flowwarden_django.celery.version_queues"
)
def consume_version_queues(sender: Any = None, instance: Any = None, **kwargs: Any) -> None:
    """Make the starting worker consume, beside each of its queues, the queue of
    every workflow version it defines (``provider.version_queue``): where a worker
    without a run's version sends that run's steps. Sent after ``-Q`` was applied
    and the task modules (and so the workflow definitions) were imported."""
    from ...workflows.definition.registry import workflow_registry
    from .provider import version_queue

    app = getattr(instance, "app", None)
    if app is None:
        return
    queues = app.amqp.queues
    consumed = list(queues.consume_from or queues)
    for queue in consumed:
        for name in workflow_registry.names():
            for version in workflow_registry.versions(name):
                queues.select_add(version_queue(queue, name, version))


def install_workflow_sweep(app: Celery) -> None:
    """Add :class:`WorkflowSweepBootstep` to *app*'s workers; calling it again changes
    nothing."""
    app.steps["worker"].add(WorkflowSweepBootstep)


def configure_worker_connections(app: Celery) -> None:
    """Give the starting worker's *app* what its configuration leaves unset of the
    broker's and the result backend's timeouts, keepalives and heartbeat
    (``network.configure_network``) and, on a Redis broker, of the visibility timeout
    its :class:`~.visibility.VisibilityBootstep` renews (``visibility``)."""
    from .network import configure_network
    from .visibility import VisibilityBootstep, configure_visibility

    try:
        configure_network(app)
        renewing = configure_visibility(app)
    except (TypeError, ValueError) as exc:  # a bad setting: manage.py check says which
        logger.error("flowwarden: the Celery connection settings were not applied: %s", exc)
        return
    if renewing:
        app.steps["worker"].add(VisibilityBootstep)
