"""MongoDlqStore: being written (issue 4)."""

from ..dlq import DlqStore


class MongoDlqStore(DlqStore):
    """Placeholder."""

    def save(self, entry, policy):
        raise NotImplementedError
