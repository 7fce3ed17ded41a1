"""Temporal integration: ``FLOWWARDEN["WORKFLOW_EXECUTION"] = "temporal"`` (the
``temporal`` extra, temporalio).

* ``provider``: ``TemporalExecutionProvider``: each run is one Temporal workflow
  execution (workflow id = coordination id), woken by signal-with-start;
* ``workflow``: that Temporal workflow: one activity per step, durable waits for
  ``resume``/decisions, and a durable timer for an approval's expiry;
* ``activities``: a step, an approval's expiry and a run's status, run by
  ``manage.py flowwarden_temporal_worker`` against the Django database;
* ``config``: the ``FLOWWARDEN["TEMPORAL"]`` setting; ``connection``: the SDK's client
  from synchronous code; ``messages``: what the workflow and activities exchange.

The snapshot chain stays the source of truth: the admin, the API, forks and the
journal work as with any provider. This package's ``__init__`` imports nothing but
``common.deprecation`` (the standard library only), so the workflow sandbox can import
``workflow`` and ``messages`` without Django.
"""

# Only the standard library behind it: sandbox-safe.
from ...common.deprecation import lazy_exports

#: Public names, each imported on first use (so the sandbox imports nothing here).
_LAZY = {
    ".provider": ("TemporalExecutionProvider", "TemporalUnavailableError"),
    ".schedules": ("delete_schedule", "schedule_workflow"),
}

__all__ = [
    "TemporalExecutionProvider",
    "TemporalUnavailableError",
    "delete_schedule",
    "schedule_workflow",
]


__getattr__ = lazy_exports(__name__, _LAZY)
