"""The dead-letter queue: ``DeadLetter`` entries, ``DlqPolicy`` and the ``DlqStore`` SPI.

An event whose handler failed for good (after the retry policy, or by an
``on_error`` decision, or by ``ctx.send_to_dlq(reason)``) is parked as a
``DeadLetter`` and the stream goes on. Beyond the reference, entries move through
statuses: an operator **replays** one (it is re-run through the stream's
handlers, see ``streams/operations/replay.py``), **acknowledges** it (handled by hand) or
**discards** it; expired entries are purged.

Statuses: ``PENDING`` (the backlog) → ``REPLAYING`` (claimed by one replay) →
``REPLAYED`` on success or back to ``PENDING`` with the failure recorded;
``PENDING`` → ``ACKNOWLEDGED`` or ``DISCARDED``. Every transition is a
compare-and-set on the current status, so two operators cannot replay one entry
twice at once.
"""

from __future__ import annotations

import dataclasses
import traceback
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar

from ._twins import RunsSync

PENDING = "PENDING"
REPLAYING = "REPLAYING"
REPLAYED = "REPLAYED"
ACKNOWLEDGED = "ACKNOWLEDGED"
DISCARDED = "DISCARDED"
STATUSES = (PENDING, REPLAYING, REPLAYED, ACKNOWLEDGED, DISCARDED)
#: Statuses an entry never leaves (purged when it expires).
SETTLED_STATUSES = (REPLAYED, ACKNOWLEDGED, DISCARDED)

#: ``ErrorInfo.type`` of an entry written by ``ctx.send_to_dlq(reason)``.
MANUAL_DLQ_TYPE = "ManualDlq"


@dataclasses.dataclass(frozen=True)
class ErrorInfo:
    """Why the event failed: the exception's dotted class name, its message, and the
    formatted traceback when the stream's policy keeps it."""

    type: str
    message: str
    stack_trace: str | None = None


def error_info(error: BaseException, *, include_stack_trace: bool = True) -> ErrorInfo:
    """The ``ErrorInfo`` of an exception: its dotted class name, message and traceback."""
    kind = type(error)
    return ErrorInfo(
        type=f"{kind.__module__}.{kind.__qualname__}"
        if kind.__module__ != "builtins"
        else kind.__qualname__,
        message=str(error),
        stack_trace="".join(traceback.format_exception(error)) if include_stack_trace else None,
    )


_ENTRY_NAMESPACE = uuid.UUID("6f0c5a52-8d7e-4f0e-9c0a-2d1f6b0a9e11")


def dead_letter_id(stream_name: str, resume_token: Mapping[str, Any] | None) -> str:
    """The entry id of one event of one stream: the same on every redelivery, so an
    event that fails again after a crash overwrites its entry."""
    from .tokens import encode_token

    if resume_token is None:
        return uuid.uuid4().hex
    data = encode_token(resume_token) or b""
    return uuid.uuid5(_ENTRY_NAMESPACE, stream_name + "\x00" + data.hex()).hex


@dataclasses.dataclass(frozen=True)
class DlqPolicy:
    """A stream's ``@dead_letter_queue`` settings.

    ``retention_days`` 0 keeps entries forever (``expires_at`` is ``None``).
    """

    retention_days: int = 30
    include_original_document: bool = True
    include_stack_trace: bool = True

    def compute_expires_at(self, created_at: datetime) -> datetime | None:
        """When an entry created at *created_at* expires (``None``: never)."""
        if not self.retention_days:
            return None
        return created_at + timedelta(days=self.retention_days)


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """One parked event (the reference's ``FailedEvent``, plus its replay history).

    ``id`` is stable for one event of one stream (derived from its resume token),
    so a redelivered event that fails again overwrites its entry instead of
    adding a second one. ``document_key``, ``full_document`` and
    ``resume_token`` are BSON documents and round-trip with their BSON types.
    """

    id: str
    stream_name: str
    operation_type: str
    error: ErrorInfo
    attempts: int
    created_at: datetime
    first_attempt_at: datetime
    last_attempt_at: datetime
    document_key: Mapping[str, Any] | None = None
    full_document: Mapping[str, Any] | None = None
    resume_token: Mapping[str, Any] | None = None
    status: str = PENDING
    expires_at: datetime | None = None
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: How many replays ran, when the last one ended, and who settled the entry.
    replay_count: int = 0
    last_replayed_at: datetime | None = None
    resolved_at: datetime | None = None
    resolved_by: str = ""
    note: str = ""

    def replace(self, **changes: Any) -> DeadLetter:
        """A copy with *changes*."""
        return dataclasses.replace(self, **changes)


class DlqStore(RunsSync, ABC):
    """Where dead letters are kept. Backends: ORM (default), Redis, MongoDB, memory.

    ``save`` is the hot path (the stream's thread calls it); everything else is
    the cold path (operators, the admin, replay). A publish-only backend sets
    ``supports_replay = False`` and implements ``save`` alone; one that cannot
    count returns -1 from ``count``.

    Async API: ``asave``, ``afind_by_id``, ``afind_by_stream``, ``acount``,
    ``atransition``, ``arecord_replay_failure``, ``apurge_expired`` and ``adelete``
    have the semantics and errors of their sync twins. The defaults run the sync
    method through ``asgiref.sync.sync_to_async(thread_sensitive=async_thread_sensitive)``:
    ``True`` here and on the ORM store (Django's connections and transactions belong
    to the thread-sensitive executor), ``False`` on the memory, Redis and MongoDB
    stores, which never touch the Django database, so their calls run in parallel on
    the default executor. One class attribute decides for every operation (they all
    touch the same storage); a backend with a native async client overrides the
    ``a…`` methods themselves.
    """

    supports_replay: ClassVar[bool] = True
    supports_count: ClassVar[bool] = True

    @abstractmethod
    def save(self, entry: DeadLetter, policy: DlqPolicy) -> None:
        """Upsert *entry* by id (a second save with the same id overwrites it).

        One atomic operation: two concurrent saves of one id leave one entry. The
        caller has applied the policy already (``include_*`` flags, ``expires_at``
        from ``retention_days``); a store keeps ``expires_at`` as given and may
        map it to native expiry. Raises ``TypeError``/``ValueError`` for an
        invalid entry (naive datetimes, an unknown status, a non-document BSON
        field), storing nothing.
        """

    def find_by_id(self, entry_id: str) -> DeadLetter | None:
        """One entry, or ``None``."""
        return None

    def find_by_stream(
        self, stream_name: str, *, status: str | None = None, limit: int | None = None
    ) -> list[DeadLetter]:
        """A stream's entries, newest ``created_at`` first, optionally of one status;
        *limit* keeps the newest."""
        return []

    def count(self, stream_name: str) -> int:
        """The stream's backlog: its ``PENDING`` entries (-1: this store cannot count)."""
        return -1

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
        """Atomically move an entry from one of *from_statuses* to *to_status*.

        False when the entry is missing or in another status. Settling statuses
        (``REPLAYED``/``ACKNOWLEDGED``/``DISCARDED``) also record ``resolved_at``
        = *at*, ``resolved_by`` and ``note``; ``REPLAYED`` also counts the replay
        (``replay_count`` + 1, ``last_replayed_at`` = *at*). Other target statuses
        change the status alone. Two callers racing for the same move: one wins.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support status changes")

    def record_replay_failure(self, entry_id: str, error: ErrorInfo, *, at: datetime) -> bool:
        """A replay of a ``REPLAYING`` entry failed: back to ``PENDING`` with *error*,
        ``replay_count`` + 1 and ``last_replayed_at`` = *at*. False if not ``REPLAYING``."""
        raise NotImplementedError(f"{type(self).__name__} does not support replay")

    def purge_expired(self, now: datetime) -> int:
        """Delete entries whose ``expires_at`` is before *now*; return how many.

        Backends that also expire entries natively (a MongoDB TTL index) may have
        deleted some already, and then report fewer.
        """
        return 0

    def delete(self, entry_id: str) -> None:
        """Remove one entry (no error when missing)."""

    def close(self) -> None:
        """Release connections (called when settings change)."""

    # -- the async API: the sync operations run through ``sync_to_async`` ------------

    _thread_twinned = (
        "save",
        "find_by_id",
        "find_by_stream",
        "count",
        "transition",
        "record_replay_failure",
        "purge_expired",
        "delete",
    )

    @classmethod
    def check_options(cls, alias: str, options: Mapping[str, Any]) -> list[Any]:
        """System-check messages about this backend's ``OPTIONS`` (none by default)."""
        return []

    @staticmethod
    def noop() -> DlqStore:
        """A store that drops everything and reports an empty backlog."""
        return NoopDlqStore()


class NoopDlqStore(DlqStore):
    """Drops every entry; ``count`` is 0 (it holds nothing, so that is the truth)."""

    supports_replay = False

    def save(self, entry: DeadLetter, policy: DlqPolicy) -> None:
        pass

    def count(self, stream_name: str) -> int:
        return 0
