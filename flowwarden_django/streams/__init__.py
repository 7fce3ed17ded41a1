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

#: Public names imported on first use, and the module each lives in.
_LAZY = {
    "ChangeContext": "flowwarden_django.streams.context",
    "StreamSpec": "flowwarden_django.streams.spec",
    "ChangeSource": "flowwarden_django.streams.source",
    "PymongoChangeSource": "flowwarden_django.streams.source",
    "max_await_ms": "flowwarden_django.streams.clients",
    "UnhandledEventError": "flowwarden_django.streams.core.events",
    "HistoryLostError": "flowwarden_django.streams.core.resume",
    "StreamInvalidatedError": "flowwarden_django.streams.core.lifecycle",
    "StreamState": "flowwarden_django.streams.core.lifecycle",
    "StreamConsumer": "flowwarden_django.streams.runtime.threaded",
    "AsyncStreamConsumer": "flowwarden_django.streams.runtime.event_loop",
    "StreamManager": "flowwarden_django.streams.runtime.manager",
    "AsyncStreamManager": "flowwarden_django.streams.runtime.async_manager",
    "new_stream_manager": "flowwarden_django.streams.runtime.async_manager",
    "InitialSync": "flowwarden_django.streams.initial_sync.copier",
    "ResyncError": "flowwarden_django.streams.initial_sync.resync",
    "request_resync": "flowwarden_django.streams.initial_sync.resync",
    "ReplayOutcome": "flowwarden_django.streams.operations.replay",
    "ReplayConflictError": "flowwarden_django.streams.operations.replay",
    "ReplayDeadLetteredError": "flowwarden_django.streams.operations.replay",
    "replay_dead_letter": "flowwarden_django.streams.operations.replay",
    "replay_dead_letters": "flowwarden_django.streams.operations.replay",
    "replay_stream": "flowwarden_django.streams.operations.replay",
    "acknowledge_dead_letter": "flowwarden_django.streams.operations.replay",
    "discard_dead_letter": "flowwarden_django.streams.operations.replay",
    "purge_expired_dead_letters": "flowwarden_django.streams.operations.replay",
    "stream_status": "flowwarden_django.streams.operations.status",
    "health_report": "flowwarden_django.streams.operations.status",
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
