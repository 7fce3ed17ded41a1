"""The checkpoint record and the ``CheckpointStore`` SPI.

A stream keeps two anchors (see ``seeds/checkpointstore-spi.txt``):

* ``last_processed_token``: the last terminally settled event; written by the
  processed-anchor policy;
* ``last_seen_token``: the last position the server certified (an idle
  postBatchResumeToken); written only by the heartbeat probe.

The two writers run on different threads, so every partial operation must touch
only its own fields, atomically, and must create the record when it is missing.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar

from .tokens import Token, check_token, tokens_equal


def as_utc(value: datetime | None) -> datetime | None:
    """*value* in UTC; a naive value (as BSON decodes dates) is taken to be UTC already."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _check_aware(value: datetime | None, argument: str) -> None:
    if value is None:
        return
    if not isinstance(value, datetime):
        raise TypeError(f"{argument} must be a datetime or None, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{argument} must be timezone-aware (use django.utils.timezone.now())")


#: The longest stream name every backend stores (the ORM column's length).
MAX_STREAM_NAME_LENGTH = 255


def check_stream_name(stream_name: object) -> None:
    """Raise unless *stream_name* is a non-empty string of at most 255 characters."""
    if not isinstance(stream_name, str) or not stream_name:
        raise ValueError(f"stream_name must be a non-empty string, not {stream_name!r}")
    if len(stream_name) > MAX_STREAM_NAME_LENGTH:
        raise ValueError(
            f"stream_name is {len(stream_name)} characters long; "
            f"the most is {MAX_STREAM_NAME_LENGTH}"
        )


def _require(value: datetime | None, argument: str) -> None:
    if value is None:
        raise TypeError(f"{argument} is required")


def check_anchor_write(
    stream_name: str,
    token: Token | None,
    at: datetime | None,
    heartbeat_at: datetime | None = None,
) -> None:
    """Validate the arguments of ``save_seen``/``save_processed`` (``token``/``at`` may be
    ``None`` to clear the pair); backends call it before writing."""
    check_stream_name(stream_name)
    check_token(token)
    _check_aware(at, "at")
    _check_aware(heartbeat_at, "heartbeat_at")


def check_heartbeat_write(stream_name: str, at: datetime) -> None:
    """Validate the arguments of ``save_heartbeat``."""
    check_stream_name(stream_name)
    _require(at, "at")
    _check_aware(at, "at")


def check_reset(
    stream_name: str,
    fresh_seen_token: Token | None,
    expected_dead_processed: Token | None,
    at: datetime,
) -> None:
    """Validate the arguments of ``reset_after_history_lost``."""
    check_stream_name(stream_name)
    check_token(fresh_seen_token, "fresh_seen_token")
    check_token(expected_dead_processed, "expected_dead_processed")
    _require(at, "at")
    _check_aware(at, "at")


def _with_heartbeat(changes: dict[str, Any], heartbeat_at: datetime | None) -> dict[str, Any]:
    if heartbeat_at is not None:
        changes["last_heartbeat_at"] = heartbeat_at
    return changes


@dataclasses.dataclass(frozen=True, slots=True)
class Checkpoint:
    """One stream's persisted position: both anchors, the heartbeat, owner and metadata.

    Every token and timestamp may be ``None``: a new stream has no anchor yet, and
    an idle stream may have certified a seen position but processed nothing.
    Timestamps are timezone-aware datetimes.
    """

    stream_name: str
    instance_id: str | None = None
    last_seen_token: Token | None = None
    last_seen_at: datetime | None = None
    last_processed_token: Token | None = None
    last_processed_at: datetime | None = None
    last_heartbeat_at: datetime | None = None
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        check_stream_name(self.stream_name)
        check_token(self.last_seen_token, "last_seen_token")
        check_token(self.last_processed_token, "last_processed_token")
        for name in ("last_seen_at", "last_processed_at", "last_heartbeat_at"):
            _check_aware(getattr(self, name), name)
        if self.metadata is None:
            object.__setattr__(self, "metadata", {})
        elif not isinstance(self.metadata, Mapping):
            raise TypeError("metadata must be a mapping")

    def replace(self, **changes: Any) -> Checkpoint:
        """Return a copy with *changes* applied."""
        return dataclasses.replace(self, **changes)


class CheckpointStore(ABC):
    """Persists checkpoints, keyed by stream name.

    Only :meth:`save`, :meth:`find` and :meth:`delete` are abstract. The partial
    operations have read-modify-write defaults that are correct for a single
    writer only: under concurrent anchor writers they can resurrect a stale value
    of the other anchor, and the history-lost guard is not atomic. Every
    production backend overrides each of them with one targeted, upserting write.
    """

    #: Whether :meth:`list_checkpoints` is implemented.
    supports_listing: ClassVar[bool] = False

    @abstractmethod
    def save(self, checkpoint: Checkpoint) -> None:
        """Upsert the whole record keyed by ``checkpoint.stream_name`` (full replace)."""

    @abstractmethod
    def find(self, stream_name: str) -> Checkpoint | None:
        """Return the stream's checkpoint, or ``None`` when there is no record."""

    @abstractmethod
    def delete(self, stream_name: str) -> None:
        """Remove the stream's record; do nothing when there is none."""

    def list_checkpoints(self) -> list[Checkpoint]:
        """Return every checkpoint, ordered by stream name (operators' view)."""
        raise NotImplementedError(f"{type(self).__name__} cannot list its checkpoints")

    def save_seen(
        self,
        stream_name: str,
        token: Token | None,
        at: datetime | None,
        heartbeat_at: datetime | None = None,
    ) -> None:
        """Set the seen pair (and the heartbeat, when given, in the same write)."""
        check_anchor_write(stream_name, token, at, heartbeat_at)
        changes = _with_heartbeat({"last_seen_token": token, "last_seen_at": at}, heartbeat_at)
        self._read_modify_write(stream_name, lambda current: changes)

    def save_processed(
        self,
        stream_name: str,
        token: Token | None,
        at: datetime | None,
        heartbeat_at: datetime | None = None,
    ) -> None:
        """Set the processed pair (and the heartbeat, when given, in the same write)."""
        check_anchor_write(stream_name, token, at, heartbeat_at)
        changes = {"last_processed_token": token, "last_processed_at": at}
        changes = _with_heartbeat(changes, heartbeat_at)
        self._read_modify_write(stream_name, lambda current: changes)

    def save_heartbeat(self, stream_name: str, at: datetime) -> None:
        """Set only the heartbeat: the position was re-certified unchanged."""
        check_heartbeat_write(stream_name, at)
        self._read_modify_write(stream_name, lambda current: {"last_heartbeat_at": at})

    def reset_after_history_lost(
        self,
        stream_name: str,
        fresh_seen_token: Token | None,
        expected_dead_processed: Token | None,
        at: datetime,
    ) -> None:
        """Install a fresh position after the stream's history was lost.

        The processed pair is removed only while ``last_processed_token`` still
        equals *expected_dead_processed* (``None`` matches an absent token): an
        anchor re-acquired concurrently survives. With a fresh token the seen pair
        and the heartbeat become ``(fresh_seen_token, at)`` and ``at``; without one
        they are cleared, since a heartbeat without a recoverable position would
        be a lie. ``instance_id`` and ``metadata`` are kept; the record is created
        if missing. Backends must evaluate the guard atomically with the removal.
        """
        check_reset(stream_name, fresh_seen_token, expected_dead_processed, at)
        stamp = at if fresh_seen_token is not None else None

        def changes(current: Checkpoint) -> dict[str, Any]:
            result: dict[str, Any] = {
                "last_seen_token": fresh_seen_token,
                "last_seen_at": stamp,
                "last_heartbeat_at": stamp,
            }
            if tokens_equal(current.last_processed_token, expected_dead_processed):
                result.update(last_processed_token=None, last_processed_at=None)
            return result

        self._read_modify_write(stream_name, changes)

    def close(self) -> None:  # noqa: B027  (optional hook, not abstract)
        """Release connections the store opened itself (none by default)."""

    def _read_modify_write(
        self, stream_name: str, changes: Callable[[Checkpoint], dict[str, Any]]
    ) -> None:
        """Apply ``changes(current)`` to the record (created when missing).

        This default reads then saves, so it is not atomic; a store that can hold
        a lock across both (the in-memory one) overrides it.
        """
        current = self.find(stream_name) or Checkpoint(stream_name)
        self.save(current.replace(**changes(current)))

    @classmethod
    def check_options(cls, alias: str, options: Mapping[str, Any]) -> list[Any]:
        """Return Django system-check messages about *options* (none by default)."""
        return []

    @staticmethod
    def noop() -> CheckpointStore:
        """Return the shared store that ignores every write and finds nothing."""
        return _NOOP


class NoopCheckpointStore(CheckpointStore):
    """Discards every write; ``find`` returns ``None``. For tests and throwaway processes:
    a stream using it restarts from "now" and loses what arrived while it was down."""

    supports_listing = True

    def save(self, checkpoint: Checkpoint) -> None:
        pass

    def find(self, stream_name: str) -> Checkpoint | None:
        return None

    def delete(self, stream_name: str) -> None:
        pass

    def list_checkpoints(self) -> list[Checkpoint]:
        return []

    def save_seen(
        self,
        stream_name: str,
        token: Token | None,
        at: datetime | None,
        heartbeat_at: datetime | None = None,
    ) -> None:
        check_anchor_write(stream_name, token, at, heartbeat_at)

    def save_processed(
        self,
        stream_name: str,
        token: Token | None,
        at: datetime | None,
        heartbeat_at: datetime | None = None,
    ) -> None:
        check_anchor_write(stream_name, token, at, heartbeat_at)

    def save_heartbeat(self, stream_name: str, at: datetime) -> None:
        check_heartbeat_write(stream_name, at)

    def reset_after_history_lost(
        self,
        stream_name: str,
        fresh_seen_token: Token | None,
        expected_dead_processed: Token | None,
        at: datetime,
    ) -> None:
        check_reset(stream_name, fresh_seen_token, expected_dead_processed, at)


_NOOP = NoopCheckpointStore()
