"""Celery integration: streams in worker processes, the dead-letter and workflow
tasks, and the Celery execution provider of workflows.

* ``bootstep``: :class:`StreamsBootstep` runs the registered streams in each
  ``celery worker`` process; :func:`install` adds it to an app.
* ``tasks``: the shared tasks (dead-letter replay and purge, a workflow step, the
  recovery and approval sweeps). Celery's autodiscovery finds them through
  ``flowwarden_django.tasks``.
* ``provider``: ``FLOWWARDEN["WORKFLOW_EXECUTION"] = "celery"``, each workflow step
  one short task.
* ``network``: :func:`configure_network` gives an app the broker heartbeat, timeouts
  and keepalives that notice a silent partition within ``DEAD_CONNECTION_TIMEOUT``
  (every worker gets them at start); ``visibility``: a Redis broker's message held by
  a lost worker comes back within ``CELERY_VISIBILITY_TIMEOUT``; ``silence``: a worker
  whose database is silent (its run claims unrenewed) stops taking tasks.

Enable the streams with one line in the project's Celery app::

    from flowwarden_django.integrations.celery import install

    app = Celery("proj")
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.autodiscover_tasks()
    install(app)

or, without touching the app, with ``FLOWWARDEN = {"CELERY_RUN_STREAMS": True}``: the
app's ``autodiscover_tasks()`` imports ``flowwarden_django.tasks``, which imports this
package, whose ``worker_init`` receiver adds the step before the worker builds its
blueprint. (An app that does not autodiscover ``flowwarden_django`` calls
:func:`install`.)

Each worker then runs the streams in its main process, one thread per stream, and
stops them with the worker. A stream never runs as a Celery task: a task that never
ends would be redelivered once the broker's visibility or consumer timeout passed.
Which worker runs a ``SINGLE_LEADER`` stream is decided by the stream's lease, so
several workers spread the streams between them.

Nothing here imports Django models at module level: the project's Celery app module
imports this package before Django is set up.
"""

from ...common.deprecation import lazy_exports
from .bootstep import (
    StreamsBootstep,
    WorkflowSweepBootstep,
    install,
    install_from_settings,
    install_workflow_sweep,
)

#: Public names imported on first use (they import Django models).
_LAZY = {
    ".provider": ("CeleryExecutionProvider",),
    ".schedules": ("ScheduleError", "beat_schedule_entry", "schedule_workflow"),
    ".network": ("configure_network",),
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "CeleryExecutionProvider",
    "ScheduleError",
    "StreamsBootstep",
    "WorkflowSweepBootstep",
    "beat_schedule_entry",
    "configure_network",
    "install",
    "install_from_settings",
    "install_workflow_sweep",
    "schedule_workflow",
]
