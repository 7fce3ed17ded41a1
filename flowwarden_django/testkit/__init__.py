"""Contract suites that any backend, shipped or your own, must pass (pytest).

Subclass a contract with a name pytest collects and give it the one factory
method::

    from flowwarden_django.testkit import CheckpointStoreContract

    @pytest.mark.django_db(transaction=True)   # when the store uses the Django DB
    class TestMyStore(CheckpointStoreContract):
        def make_store(self):
            return MyStore(...)
"""

from .checkpoint_store import CheckpointStoreContract

__all__ = ["CheckpointStoreContract"]
