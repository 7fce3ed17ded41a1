"""The public sync and async API of the dead-letter stores with a native async client.

``NativeDlqStore`` writes each ``DlqStore`` operation and its ``a…`` twin once, in
terms of the backend's store operations (see ``_calls``), as ``NativeCheckpointStore``
does for the checkpoint stores. A backend (Redis, MongoDB) supplies the operations and
the two runners, ``_run`` and ``_arun``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .._twins import native_pair
from ..dlq import DeadLetter, DlqPolicy, DlqStore, ErrorInfo
from ._calls import NativeOperations, Operation


class NativeDlqStore(NativeOperations, DlqStore):
    """A dead-letter store whose every operation is one sans-I/O store operation.

    Subclasses implement the ``_…_operation`` methods and ``_run``/``_arun`` (see
    :class:`~._native_checkpoint.NativeCheckpointStore`).
    """

    #: The async API runs natively, or on the default executor, in parallel: these
    #: stores never touch the Django database.
    async_thread_sensitive = False

    save, asave = native_pair(DlqStore.save, "_save_operation")
    find_by_id, afind_by_id = native_pair(DlqStore.find_by_id, "_find_by_id_operation")
    find_by_stream, afind_by_stream = native_pair(
        DlqStore.find_by_stream, "_find_by_stream_operation"
    )
    count, acount = native_pair(DlqStore.count, "_count_operation")
    transition, atransition = native_pair(DlqStore.transition, "_transition_operation")
    record_replay_failure, arecord_replay_failure = native_pair(
        DlqStore.record_replay_failure, "_replay_failure_operation"
    )
    purge_expired, apurge_expired = native_pair(DlqStore.purge_expired, "_purge_operation")
    delete, adelete = native_pair(DlqStore.delete, "_delete_operation")

    # -- what a backend supplies -------------------------------------------------------

    def _save_operation(self, entry: DeadLetter, policy: DlqPolicy) -> Operation[None]:
        """``save(entry, policy)``: the caller applied *policy* already."""
        raise NotImplementedError

    def _find_by_id_operation(self, entry_id: str) -> Operation[DeadLetter | None]:
        raise NotImplementedError

    def _find_by_stream_operation(
        self, stream_name: str, status: str | None, limit: int | None
    ) -> Operation[list[DeadLetter]]:
        raise NotImplementedError

    def _count_operation(self, stream_name: str) -> Operation[int]:
        raise NotImplementedError

    def _transition_operation(self, *args: Any) -> Operation[bool]:
        """``transition(entry_id, to_status, from_statuses, at, by, note)``, positionally."""
        raise NotImplementedError

    def _replay_failure_operation(
        self, entry_id: str, error: ErrorInfo, at: datetime
    ) -> Operation[bool]:
        raise NotImplementedError

    def _purge_operation(self, now: datetime) -> Operation[int]:
        raise NotImplementedError

    def _delete_operation(self, entry_id: str) -> Operation[None]:
        raise NotImplementedError
