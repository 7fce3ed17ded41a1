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

from ..common.deprecation import lazy_exports

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

#: The modules of the helpers imported on demand (the contracts need pytest, the
#: scripted replica set needs mockupdb), and their names.
_LAZY = {
    ".checkpoint_store": ("CheckpointStoreContract", "AsyncCheckpointStoreContract"),
    ".lock_service": ("LockServiceContract", "AsyncLockServiceContract"),
    ".dlq_store": ("DlqStoreContract", "AsyncDlqStoreContract"),
    ".snapshot_store": ("SnapshotStoreContract", "AsyncSnapshotStoreContract"),
    ".fake_source": ("AsyncFakeChangeSource", "FakeChangeSource", "FakeOplog"),
    ".scripted_mongo": ("ScriptedReplicaSet",),
}

__getattr__ = lazy_exports(__name__, _LAZY)
