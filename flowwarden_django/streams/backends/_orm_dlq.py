"""OrmDlqStore: being written (issue 4)."""

from ..dlq import DlqStore


class OrmDlqStore(DlqStore):
    """Placeholder."""

    def save(self, entry, policy):
        raise NotImplementedError
