"""RedisDlqStore: being written (issue 4)."""

from ..dlq import DlqStore


class RedisDlqStore(DlqStore):
    """Placeholder."""

    def save(self, entry, policy):
        raise NotImplementedError
