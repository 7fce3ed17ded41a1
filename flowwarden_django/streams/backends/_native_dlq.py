"""The public sync and async API of the dead-letter stores with a native async client.

``NativeDlqStore`` writes each ``DlqStore`` operation and its ``a…`` twin once, in
terms of the backend's store operations (see ``_calls``), as ``NativeCheckpointStore``
does for the checkpoint stores. A backend (Redis, MongoDB) supplies the operations and
the way it makes their requests.
"""

from __future__ import annotations

from ..dlq import DlqStore
from ._calls import NativeOperations
from ._dlq_common import StatusChanges


class NativeDlqStore(NativeOperations, StatusChanges, DlqStore):
    """A dead-letter store whose every operation is one sans-I/O store operation.

    Subclasses implement the ``_<name>_operation`` methods (see
    :class:`~._native_checkpoint.NativeCheckpointStore`), the status changes'
    through ``_change_status`` (see :class:`~._dlq_common.StatusChanges`). ``save``'s
    operation gets an entry the caller applied the policy to already.
    """
