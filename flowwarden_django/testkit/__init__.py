"""Test helpers shipped with the app.

* ``CheckpointStoreContract``: the contract any checkpoint store must pass (pytest).
  Subclass it with a name pytest collects and give it the one factory method::

      from flowwarden_django.testkit import CheckpointStoreContract

      @pytest.mark.django_db(transaction=True)   # when the store uses the Django DB
      class TestMyStore(CheckpointStoreContract):
          def make_store(self):
              return MyStore(...)

* ``fake_source``: an in-process change source for fast stream tests.
* ``scripted_mongo.ScriptedReplicaSet``: a wire-level fake replica-set primary that
  the real pymongo driver talks to (needs ``mockupdb``).
"""

from typing import Any

__all__ = ["CheckpointStoreContract"]


def __getattr__(name: str) -> Any:
    # Imported on demand: the contract needs pytest, the other helpers do not.
    if name == "CheckpointStoreContract":
        from .checkpoint_store import CheckpointStoreContract

        return CheckpointStoreContract
    raise AttributeError(name)
