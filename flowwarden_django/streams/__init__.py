"""The change-stream half: checkpoints and their stores.

Nothing in this package imports the admin, DRF or Celery.
"""

from .checkpoint import Checkpoint, CheckpointStore, NoopCheckpointStore
from .stores import CheckpointStoreHandler, checkpoint_stores

__all__ = [
    "Checkpoint",
    "CheckpointStore",
    "CheckpointStoreHandler",
    "NoopCheckpointStore",
    "checkpoint_stores",
]
