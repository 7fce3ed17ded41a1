"""The public sync and async API of the dead-letter stores with a native async client.

``NativeDlqStore`` writes each ``DlqStore`` operation and its ``a…`` twin once, in
terms of the backend's store operations (see ``_calls``), as ``NativeCheckpointStore``
does for the checkpoint stores. A backend (Redis, MongoDB) supplies the operations and
the two runners, ``_run`` and ``_arun``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..dlq import PENDING, DeadLetter, DlqPolicy, DlqStore, ErrorInfo
from ._calls import NativeOperations, Operation


class NativeDlqStore(NativeOperations, DlqStore):
    """A dead-letter store whose every operation is one sans-I/O store operation.

    Subclasses implement the ``_…_operation`` methods and ``_run``/``_arun`` (see
    :class:`~._native_checkpoint.NativeCheckpointStore`).
    """

    #: The async API runs natively, or on the default executor, in parallel: these
    #: stores never touch the Django database.
    async_thread_sensitive = False

    def save(self, entry: DeadLetter, policy: DlqPolicy) -> None:
        self._run(self._save_operation(entry))

    async def asave(self, entry: DeadLetter, policy: DlqPolicy) -> None:
        await self._arun(self._save_operation(entry), super().asave, entry, policy)

    def find_by_id(self, entry_id: str) -> DeadLetter | None:
        return self._run(self._find_by_id_operation(entry_id))

    async def afind_by_id(self, entry_id: str) -> DeadLetter | None:
        operation = self._find_by_id_operation(entry_id)
        return await self._arun(operation, super().afind_by_id, entry_id)

    def find_by_stream(
        self, stream_name: str, *, status: str | None = None, limit: int | None = None
    ) -> list[DeadLetter]:
        return self._run(self._find_by_stream_operation(stream_name, status, limit))

    async def afind_by_stream(
        self, stream_name: str, *, status: str | None = None, limit: int | None = None
    ) -> list[DeadLetter]:
        operation = self._find_by_stream_operation(stream_name, status, limit)
        default = super().afind_by_stream
        return await self._arun(operation, default, stream_name, status=status, limit=limit)

    def count(self, stream_name: str) -> int:
        return self._run(self._count_operation(stream_name))

    async def acount(self, stream_name: str) -> int:
        return await self._arun(self._count_operation(stream_name), super().acount, stream_name)

    def transition(
        self,
        entry_id: str,
        to_status: str,
        *,
        from_statuses: Sequence[str] = (PENDING,),
        at: datetime,
        by: str = "",
        note: str = "",
    ) -> bool:
        args = (entry_id, to_status, from_statuses, at, by, note)
        return self._run(self._transition_operation(*args))

    async def atransition(
        self,
        entry_id: str,
        to_status: str,
        *,
        from_statuses: Sequence[str] = (PENDING,),
        at: datetime,
        by: str = "",
        note: str = "",
    ) -> bool:
        operation = self._transition_operation(entry_id, to_status, from_statuses, at, by, note)
        keywords = {"from_statuses": from_statuses, "at": at, "by": by, "note": note}
        return await self._arun(operation, super().atransition, entry_id, to_status, **keywords)

    def record_replay_failure(self, entry_id: str, error: ErrorInfo, *, at: datetime) -> bool:
        return self._run(self._replay_failure_operation(entry_id, error, at))

    async def arecord_replay_failure(
        self, entry_id: str, error: ErrorInfo, *, at: datetime
    ) -> bool:
        operation = self._replay_failure_operation(entry_id, error, at)
        return await self._arun(operation, super().arecord_replay_failure, entry_id, error, at=at)

    def purge_expired(self, now: datetime) -> int:
        return self._run(self._purge_operation(now))

    async def apurge_expired(self, now: datetime) -> int:
        return await self._arun(self._purge_operation(now), super().apurge_expired, now)

    def delete(self, entry_id: str) -> None:
        self._run(self._delete_operation(entry_id))

    async def adelete(self, entry_id: str) -> None:
        await self._arun(self._delete_operation(entry_id), super().adelete, entry_id)

    # -- what a backend supplies -------------------------------------------------------

    def _save_operation(self, entry: DeadLetter) -> Operation[None]:
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
