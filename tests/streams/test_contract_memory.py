from flowwarden_django.streams.backends.memory import InMemoryCheckpointStore
from flowwarden_django.testkit import CheckpointStoreContract


class TestInMemoryCheckpointStore(CheckpointStoreContract):
    def make_store(self):
        return InMemoryCheckpointStore()
