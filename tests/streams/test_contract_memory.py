from flowwarden_django.streams.backends.memory import InMemoryCheckpointStore
from flowwarden_django.testkit import AsyncCheckpointStoreContract, CheckpointStoreContract


class TestInMemoryCheckpointStore(CheckpointStoreContract):
    def make_store(self):
        return InMemoryCheckpointStore()


class TestInMemoryCheckpointStoreAsync(AsyncCheckpointStoreContract, TestInMemoryCheckpointStore):
    """The contract through the async API."""
