"""The public sync and async API of the lock services with a native async client.

``NativeLockService`` writes each ``LockService`` operation and its ``a…`` twin once,
in terms of the backend's store operations (see ``_calls``), as
``NativeCheckpointStore`` does for the checkpoint stores. A backend (Redis, MongoDB)
supplies the operations and the two runners, ``_run`` and ``_arun``.
"""

from __future__ import annotations

from datetime import timedelta

from .._twins import native_pair
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

    try_acquire, atry_acquire = native_pair(LockService.try_acquire, "_acquire_operation")
    renew, arenew = native_pair(LockService.renew, "_renew_operation")
    release, arelease = native_pair(LockService.release, "_release_operation")
    owner_of, aowner_of = native_pair(LockService.owner_of, "_owner_of_operation")
    is_current, ais_current = native_pair(LockService.is_current, "_is_current_operation")

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
