"""The change-stream half: declaring streams, their checkpoints, errors and leases.

Nothing in this package imports the admin, DRF or Celery. Every name in ``__all__`` is
public: it stays importable from here across releases (a removal is announced in
CHANGELOG.md a minor release ahead). The running and operating names (``StreamManager``,
``replay_dead_letters``…) are imported on first use, so importing this package loads no
runtime, driver or database module.
"""

from ..common.deprecation import lazy_exports
from .checkpoint import Checkpoint, CheckpointStore, NoopCheckpointStore
from .dlq import DeadLetter, DlqPolicy, DlqStore, ErrorInfo
from .locks import Lease, LeaseLostError, LockService
from .registry import (
    change_stream,
    checkpoint,
    dead_letter_queue,
    on_error,
    register_stream,
    restart_policy,
    retry_policy,
    stream_registry,
)
from .spec import ErrorAction
from .stores import CheckpointStoreHandler, checkpoint_stores, dlq_stores, lock_services

#: The modules of the public names imported on first use, and their names.
_LAZY = {
    ".context": ("ChangeContext",),
    ".spec": ("StreamSpec",),
    ".source": ("ChangeSource", "PymongoChangeSource"),
    ".clients": ("max_await_ms",),
    ".core.events": ("UnhandledEventError",),
    ".core.resume": ("HistoryLostError",),
    ".core.lifecycle": ("StreamInvalidatedError", "StreamState"),
    ".runtime.threaded": ("StreamConsumer",),
    ".runtime.event_loop": ("AsyncStreamConsumer",),
    ".runtime.manager": ("StreamManager",),
    ".runtime.async_manager": ("AsyncStreamManager", "new_stream_manager"),
    ".initial_sync.copier": ("InitialSync",),
    ".initial_sync.resync": ("ResyncError", "request_resync"),
    ".operations.replay": (
        "ReplayOutcome",
        "ReplayConflictError",
        "ReplayDeadLetteredError",
        "replay_dead_letter",
        "replay_dead_letters",
        "replay_stream",
        "acknowledge_dead_letter",
        "discard_dead_letter",
        "purge_expired_dead_letters",
    ),
    ".operations.status": ("stream_status", "health_report"),
}

__getattr__ = lazy_exports(__name__, _LAZY)

__all__ = [
    "AsyncStreamConsumer",
    "AsyncStreamManager",
    "ChangeContext",
    "ChangeSource",
    "Checkpoint",
    "CheckpointStore",
    "CheckpointStoreHandler",
    "DeadLetter",
    "DlqPolicy",
    "DlqStore",
    "ErrorAction",
    "ErrorInfo",
    "HistoryLostError",
    "InitialSync",
    "Lease",
    "LeaseLostError",
    "LockService",
    "NoopCheckpointStore",
    "PymongoChangeSource",
    "ReplayConflictError",
    "ReplayDeadLetteredError",
    "ReplayOutcome",
    "ResyncError",
    "StreamConsumer",
    "StreamInvalidatedError",
    "StreamManager",
    "StreamSpec",
    "StreamState",
    "UnhandledEventError",
    "acknowledge_dead_letter",
    "change_stream",
    "checkpoint",
    "checkpoint_stores",
    "dead_letter_queue",
    "discard_dead_letter",
    "dlq_stores",
    "health_report",
    "lock_services",
    "max_await_ms",
    "new_stream_manager",
    "on_error",
    "purge_expired_dead_letters",
    "register_stream",
    "replay_dead_letter",
    "replay_dead_letters",
    "replay_stream",
    "request_resync",
    "restart_policy",
    "retry_policy",
    "stream_registry",
    "stream_status",
]
