"""Test helpers shipped with the app.

* ``CheckpointStoreContract``: the contract any checkpoint store must pass (pytest).
  Subclass it with a name pytest collects and give it the one factory method::

      from flowwarden_django.testkit import CheckpointStoreContract

      @pytest.mark.django_db(transaction=True)   # when the store uses the Django DB
      class TestMyStore(CheckpointStoreContract):
          def make_store(self):
              return MyStore(...)

* ``LockServiceContract``: the same for lock services (``make_service``).
* ``DlqStoreContract``: the same for dead-letter stores (``make_store``).
* ``SnapshotStoreContract``: the same for workflow snapshot stores (``make_store``).
* ``AsyncCheckpointStoreContract``, ``AsyncLockServiceContract``,
  ``AsyncDlqStoreContract``, ``AsyncSnapshotStoreContract``: each contract again,
  through the async API (``asave``, ``atry_acquire``…), subclassed the same way.
* ``FakeChangeSource`` (``AsyncFakeChangeSource``, over a ``FakeOplog``): an
  in-process change source for fast stream tests.
* ``ScriptedReplicaSet``: a wire-level fake replica-set primary that the real pymongo
  driver talks to (needs ``mockupdb``).
"""

from typing import Any

__all__ = ["CheckpointStoreContract"]
__all__ += ["LockServiceContract"]
__all__ += ["DlqStoreContract"]
__all__ += ["SnapshotStoreContract"]
__all__ += [
    "AsyncCheckpointStoreContract",
    "AsyncDlqStoreContract",
    "AsyncLockServiceContract",
    "AsyncSnapshotStoreContract",
]

__all__ += ["AsyncFakeChangeSource", "FakeChangeSource", "FakeOplog", "ScriptedReplicaSet"]

#: Helpers imported on demand, and their modules (the scripted replica set needs mockupdb).
_HELPERS = {
    "AsyncFakeChangeSource": "fake_source",
    "FakeChangeSource": "fake_source",
    "FakeOplog": "fake_source",
    "ScriptedReplicaSet": "scripted_mongo",
}

_ASYNC_CONTRACTS = {
    "AsyncCheckpointStoreContract": "checkpoint_store",
    "AsyncDlqStoreContract": "dlq_store",
    "AsyncLockServiceContract": "lock_service",
    "AsyncSnapshotStoreContract": "snapshot_store",
}


def __getattr__(name: str) -> Any:
    # Imported on demand: the contract needs pytest, the other helpers do not.
    if name == "CheckpointStoreContract":
        from .checkpoint_store import CheckpointStoreContract

        return CheckpointStoreContract
    if name == "LockServiceContract":
        from .lock_service import LockServiceContract

        return LockServiceContract
    if name == "DlqStoreContract":
        from .dlq_store import DlqStoreContract

        return DlqStoreContract
    if name == "SnapshotStoreContract":
        from .snapshot_store import SnapshotStoreContract

        return SnapshotStoreContract
    if name in _ASYNC_CONTRACTS or name in _HELPERS:
        from importlib import import_module

        module = _ASYNC_CONTRACTS.get(name) or _HELPERS[name]
        return getattr(import_module(f".{module}", __name__), name)
    raise AttributeError(name)
