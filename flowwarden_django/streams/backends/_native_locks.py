"""The public sync and async API of the lock services with a native async client.

``NativeLockService`` writes each ``LockService`` operation and its ``a…`` twin once,
in terms of the backend's store operations (see ``_calls``), as
``NativeCheckpointStore`` does for the checkpoint stores. A backend (Redis, MongoDB)
supplies the operations and the way it makes their requests.
"""

from __future__ import annotations

from ..locks import LockService
from ._calls import NativeOperations


class NativeLockService(NativeOperations, LockService):
    """A lock service whose every operation is one sans-I/O store operation.

    Subclasses implement the ``_<name>_operation`` methods (see
    :class:`~._native_checkpoint.NativeCheckpointStore`).
    """
