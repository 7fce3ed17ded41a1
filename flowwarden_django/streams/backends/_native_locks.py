"""The public sync and async API of the lock services with a native async client.

``NativeLockService`` writes each ``LockService`` operation and its ``a…`` twin once,
in terms of the backend's store operations (see ``_calls``), as
``NativeCheckpointStore`` does for the checkpoint stores. A backend (Redis, MongoDB)
supplies the operations and the two runners, ``_run`` and ``_arun``.
"""

from __future__ import annotations

from datetime import timedelta

from ..locks import Lease, LockService
from ._calls import NativeOperations, Operation


class NativeLockService(NativeOperations, LockService):
    """A lock service whose every operation is one sans-I/O store operation.

    Subclasses implement the ``_…_operation`` methods and ``_run``/``_arun`` (see
    :class:`~._native_checkpoint.NativeCheckpointStore`).
    """

    #: The async API runs natively, or on the default executor, in parallel: these
    #: services never touch the Django database.
    async_thread_sensitive = False

    def try_acquire(self, name: str, owner: str, ttl: timedelta | float) -> Lease | None:
        return self._run(self._acquire_operation(name, owner, ttl))

    async def atry_acquire(self, name: str, owner: str, ttl: timedelta | float) -> Lease | None:
        operation = self._acquire_operation(name, owner, ttl)
        return await self._arun(operation, super().atry_acquire, name, owner, ttl)

    def renew(self, lease: Lease, ttl: timedelta | float) -> Lease | None:
        return self._run(self._renew_operation(lease, ttl))

    async def arenew(self, lease: Lease, ttl: timedelta | float) -> Lease | None:
        return await self._arun(self._renew_operation(lease, ttl), super().arenew, lease, ttl)

    def release(self, lease: Lease) -> bool:
        return self._run(self._release_operation(lease))

    async def arelease(self, lease: Lease) -> bool:
        return await self._arun(self._release_operation(lease), super().arelease, lease)

    def owner_of(self, name: str) -> Lease | None:
        return self._run(self._owner_of_operation(name))

    async def aowner_of(self, name: str) -> Lease | None:
        return await self._arun(self._owner_of_operation(name), super().aowner_of, name)

    def is_current(self, lease: Lease) -> bool:
        return self._run(self._is_current_operation(lease))

    async def ais_current(self, lease: Lease) -> bool:
        return await self._arun(self._is_current_operation(lease), super().ais_current, lease)

    # -- what a backend supplies -------------------------------------------------------

    def _acquire_operation(
        self, name: str, owner: str, ttl: timedelta | float
    ) -> Operation[Lease | None]:
        raise NotImplementedError

    def _renew_operation(self, lease: Lease, ttl: timedelta | float) -> Operation[Lease | None]:
        raise NotImplementedError

    def _release_operation(self, lease: Lease) -> Operation[bool]:
        raise NotImplementedError

    def _owner_of_operation(self, name: str) -> Operation[Lease | None]:
        raise NotImplementedError

    def _is_current_operation(self, lease: Lease) -> Operation[bool]:
        raise NotImplementedError
