"""The public sync and async API of the checkpoint stores with a native async client.

``NativeCheckpointStore`` writes each ``CheckpointStore`` operation and its ``a…``
twin once, in terms of the backend's store operations (see ``_calls``): the sync
method runs the operation on the blocking client, the async one on the running
loop's native client, or falls back to the thread-based default when the backend
has none. A backend (Redis, MongoDB) supplies only the operations, and its
connection class the way it makes their requests (``_perform``, ``_async_performer``).
"""

from __future__ import annotations

from ..checkpoint import CheckpointStore
from ._calls import NativeOperations


class NativeCheckpointStore(NativeOperations, CheckpointStore):
    """A checkpoint store whose every operation is one sans-I/O store operation.

    Subclasses implement the ``_<name>_operation`` of each public operation ``<name>``
    (it takes the parameters of ``<name>``, positionally, and returns an
    :data:`~._calls.Operation`) and inherit, from their connection class,
    ``_perform`` (make a request on the sync client) and ``_async_performer`` (what
    makes one on the loop's async client, ``None`` without one): see
    :class:`~._calls.NativeOperations`.
    """

    supports_listing = True
