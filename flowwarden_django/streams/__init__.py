"""The change-stream half: declaring streams, their checkpoints, errors and leases.

Nothing in this package imports the admin, DRF or Celery.
"""

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

__all__ = [
    "Checkpoint",
    "CheckpointStore",
    "CheckpointStoreHandler",
    "DeadLetter",
    "DlqPolicy",
    "DlqStore",
    "ErrorAction",
    "ErrorInfo",
    "Lease",
    "LeaseLostError",
    "LockService",
    "NoopCheckpointStore",
    "change_stream",
    "checkpoint",
    "checkpoint_stores",
    "dead_letter_queue",
    "dlq_stores",
    "lock_services",
    "on_error",
    "register_stream",
    "restart_policy",
    "retry_policy",
    "stream_registry",
]
