"""MongoLockService: being written (issue 4)."""

from ..locks import LockService


class MongoLockService(LockService):
    """Placeholder."""

    def try_acquire(self, name, owner, ttl):
        raise NotImplementedError

    def renew(self, lease, ttl):
        raise NotImplementedError

    def release(self, lease):
        raise NotImplementedError

    def owner_of(self, name):
        raise NotImplementedError
