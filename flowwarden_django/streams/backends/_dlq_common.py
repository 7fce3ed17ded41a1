"""What every dead-letter store shares: argument checks, the BSON round trip of an
entry, and the system-check message for a missing optional package.

Every backend validates the same way before writing, so a bad entry fails with
the same message whichever store is configured, and nothing half-valid is stored.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from .._twins import positional_method
from ..checkpoint import check_stream_name, stored_copy
from ..dlq import (
    PENDING,
    REPLAYED,
    REPLAYING,
    SETTLED_STATUSES,
    STATUSES,
    DeadLetter,
    DlqStore,
    ErrorInfo,
)
from ..tokens import check_token

#: Column lengths of the ``DeadLetter`` model, enforced on every backend alike.
MAX_ID_LENGTH = 64
MAX_OPERATION_LENGTH = 32
MAX_ERROR_TYPE_LENGTH = 255
MAX_RESOLVED_BY_LENGTH = 150

#: The entry fields holding BSON documents.
BSON_FIELDS = ("document_key", "full_document", "resume_token")


def _text(value: object, argument: str, longest: int, *, empty: bool = False) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a string, not {type(value).__name__}")
    if not value and not empty:
        raise ValueError(f"{argument} must not be empty")
    if len(value) > longest:
        raise ValueError(f"{argument} is {len(value)} characters long; the most is {longest}")


def check_aware(value: object, argument: str, *, required: bool = True) -> None:
    """Raise unless *value* is a timezone-aware datetime (or ``None`` when not *required*)."""
    if value is None:
        if required:
            raise TypeError(f"{argument} is required")
        return
    if not isinstance(value, datetime):
        raise TypeError(f"{argument} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{argument} must be timezone-aware (use django.utils.timezone.now())")


def check_entry_id(entry_id: object) -> None:
    """Raise unless *entry_id* is a non-empty string of at most 64 characters."""
    _text(entry_id, "id", MAX_ID_LENGTH)


def check_status(status: object, argument: str = "status") -> None:
    """Raise ``ValueError`` unless *status* is one of ``dlq.STATUSES``."""
    if status not in STATUSES:
        raise ValueError(f"{argument} must be one of {', '.join(STATUSES)}, not {status!r}")


def check_error(error: object) -> None:
    """Raise unless *error* is an ``ErrorInfo`` with text fields."""
    if not isinstance(error, ErrorInfo):
        raise TypeError(f"error must be an ErrorInfo, not {type(error).__name__}")
    _text(error.type, "error.type", MAX_ERROR_TYPE_LENGTH)
    if not isinstance(error.message, str):
        raise TypeError(f"error.message must be a string, not {type(error.message).__name__}")
    if error.stack_trace is not None and not isinstance(error.stack_trace, str):
        raise TypeError("error.stack_trace must be a string or None")


def _count(value: object, argument: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{argument} must be an integer >= 0, not {value!r}")


#: The ``DeadLetter`` fields holding a time: always, and maybe.
_REQUIRED_TIMES = ("created_at", "first_attempt_at", "last_attempt_at")
_OPTIONAL_TIMES = ("expires_at", "last_replayed_at", "resolved_at")


def check_entry(entry: object) -> None:
    """Validate a ``DeadLetter`` before it is written; raise ``TypeError``/``ValueError``."""
    if not isinstance(entry, DeadLetter):
        raise TypeError(f"entry must be a DeadLetter, not {type(entry).__name__}")
    check_entry_id(entry.id)
    check_stream_name(entry.stream_name)
    _text(entry.operation_type, "operation_type", MAX_OPERATION_LENGTH)
    check_error(entry.error)
    _count(entry.attempts, "attempts")
    _count(entry.replay_count, "replay_count")
    check_status(entry.status)
    for name in BSON_FIELDS:
        check_token(getattr(entry, name), name)
    for name in _REQUIRED_TIMES:
        check_aware(getattr(entry, name), name)
    for name in _OPTIONAL_TIMES:
        check_aware(getattr(entry, name), name, required=False)
    if not isinstance(entry.metadata, Mapping):
        raise TypeError(f"metadata must be a mapping, not {type(entry.metadata).__name__}")
    _text(entry.resolved_by, "resolved_by", MAX_RESOLVED_BY_LENGTH, empty=True)
    if not isinstance(entry.note, str):
        raise TypeError(f"note must be a string, not {type(entry.note).__name__}")


def check_transition(
    entry_id: object, to_status: object, from_statuses: Sequence[str], at: object, by: object
) -> tuple[str, ...]:
    """Validate the arguments of ``DlqStore.transition``; return *from_statuses* as a tuple."""
    if not isinstance(entry_id, str):
        raise TypeError(f"entry_id must be a string, not {type(entry_id).__name__}")
    check_status(to_status, "to_status")
    if isinstance(from_statuses, str):
        raise TypeError("from_statuses must be a sequence of statuses, not one string")
    statuses = tuple(from_statuses)
    if not statuses:
        raise ValueError("from_statuses must name at least one status")
    for status in statuses:
        check_status(status, "from_statuses")
    check_aware(at, "at")
    _text(by, "by", MAX_RESOLVED_BY_LENGTH, empty=True)
    return statuses


def check_limit(limit: object) -> None:
    """Raise unless *limit* is ``None`` or an integer >= 0."""
    if limit is not None:
        _count(limit, "limit")


def settles(to_status: str) -> bool:
    """True when moving to *to_status* records ``resolved_at``/``resolved_by``/``note``."""
    return to_status in SETTLED_STATUSES


def normalized(entry: DeadLetter) -> DeadLetter:
    """A copy as the other backends return it: BSON documents after a BSON round trip,
    timestamps in UTC, and a metadata dict of its own."""
    times = (*_REQUIRED_TIMES, *_OPTIONAL_TIMES)
    return stored_copy(entry, BSON_FIELDS, times, metadata=copy.deepcopy(dict(entry.metadata)))


_DOCUMENT_NAMES = {"resolved_at": "resolvedAt", "resolved_by": "resolvedBy", "note": "note"}


@dataclasses.dataclass(frozen=True, slots=True)
class StatusChange:
    """One compare-and-set of an entry's status, validated and decided for every store.

    While the entry's status is one of ``allowed``: set ``status`` and the
    ``DeadLetter`` fields in ``changes``; with ``replayed``, also count a replay
    (``replay_count`` + 1, ``last_replayed_at`` = ``replayed``).
    """

    entry_id: str
    allowed: tuple[str, ...]
    status: str
    changes: Mapping[str, Any]
    replayed: datetime | None

    def document_fields(
        self, time: Callable[[datetime], Any], error: Callable[[ErrorInfo], Any]
    ) -> dict[str, Any]:
        """The fields set besides ``status`` and ``replayCount``, as the Redis and
        MongoDB stores name them, each time through *time* and the error through *error*."""
        fields: dict[str, Any] = {}
        for name, value in self.changes.items():
            if name == "error":
                fields["error"] = error(value)
            else:
                fields[_DOCUMENT_NAMES[name]] = time(value) if name == "resolved_at" else value
        if self.replayed is not None:
            fields["lastReplayedAt"] = time(self.replayed)
        return fields


def status_change(
    entry_id: str, to_status: str, from_statuses: Sequence[str], at: datetime, by: str, note: str
) -> StatusChange:
    """``transition(entry_id, to_status, from_statuses, at, by, note)``, checked:
    settling statuses record who and when, ``REPLAYED`` counts the replay."""
    allowed = check_transition(entry_id, to_status, from_statuses, at, by)
    changes = {"resolved_at": at, "resolved_by": by, "note": note} if settles(to_status) else {}
    replayed = at if to_status == REPLAYED else None
    return StatusChange(entry_id, allowed, to_status, changes, replayed)


def replay_failure(entry_id: str, error: ErrorInfo, at: datetime) -> StatusChange:
    """``record_replay_failure(entry_id, error, at=at)``, checked: back to ``PENDING``
    from ``REPLAYING`` with *error*, the replay counted."""
    check_error(error)
    check_aware(at, "at")
    return StatusChange(entry_id, (REPLAYING,), PENDING, {"error": error}, at)


class StatusChanges:
    """The status changes of a dead-letter store, each one compare-and-set:
    ``transition`` and ``record_replay_failure`` are decided by :func:`status_change`
    and :func:`replay_failure` (their ``_…_operation``, which take the public
    method's parameters positionally); the store supplies :meth:`_change_status`,
    which applies a :class:`StatusChange` (or gives the store operation that does)."""

    def _transition_operation(self, *args: Any) -> Any:
        return self._change_status(status_change(*args))

    def _record_replay_failure_operation(self, *args: Any) -> Any:
        return self._change_status(replay_failure(*args))

    def _change_status(self, change: StatusChange) -> Any:
        """Apply *change*; False when the entry is missing or in another status."""
        raise NotImplementedError


class CompareAndSetDlqStore(StatusChanges, DlqStore):
    """A dead-letter store whose status changes are one compare-and-set each (see
    :class:`StatusChanges`), made in the calling thread."""

    transition = positional_method(DlqStore.transition, "_transition_operation")
    record_replay_failure = positional_method(
        DlqStore.record_replay_failure, "_record_replay_failure_operation"
    )
