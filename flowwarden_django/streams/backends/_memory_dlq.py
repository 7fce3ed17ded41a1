"""InMemoryDlqStore: being written (issue 4)."""

from ..dlq import DlqStore


class InMemoryDlqStore(DlqStore):
    """Placeholder."""

    def save(self, entry, policy):
        raise NotImplementedError
