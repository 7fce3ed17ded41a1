"""The checkpoint record and the ``CheckpointStore`` SPI.

A stream keeps two anchors (see ``seeds/checkpointstore-spi.txt``):

* ``last_processed_token``: the last terminally settled event; written by the
  processed-anchor policy;
* ``last_seen_token``: the last position the server certified (an idle
  postBatchResumeToken); written only by the heartbeat probe.

Beside them, ``initial_sync`` keeps the progress of a stream's initial copy of a
collection, written once per copied batch by a conditional ``save_initial_sync``.

The writers run on different threads, so every partial operation must touch
only its own fields, atomically, and must create the record when it is missing.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar

from ..common.plain_data import plain
from ._twins import RunsSync
from .tokens import Token, check_token, normalize_token, tokens_equal


def as_utc(value: datetime | None) -> datetime | None:
    """*value* in UTC; a naive value (as BSON decodes dates) is taken to be UTC already."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def stored_copy(
    record: Any, tokens: tuple[str, ...], times: tuple[str, ...], **changes: Any
) -> Any:
    """A copy of *record* (a ``Checkpoint`` or a ``DeadLetter``) as the stores return
    it: its fields *tokens* after a BSON round trip, its *times* in UTC, and *changes*."""
    return record.replace(
        **{name: normalize_token(getattr(record, name)) for name in tokens},
        **{name: as_utc(getattr(record, name)) for name in times},
        **changes,
    )


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


#: The range of ``int`` values ``initial_sync`` may hold: BSON's 64-bit integers.
_INT64 = range(-(2**63), 2**63)
#: The smallest float magnitude Python writes with an exponent ("1e+16"); PostgreSQL's
#: jsonb reads such a number back as an integer, so ``initial_sync`` holds none.
_FLOAT_LIMIT = 1e16


def _check_json_value(value: object, path: str) -> None:
    """Raise unless *value* is JSON that every backend stores and gives back unchanged."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if value not in _INT64:
            raise ValueError(f"{path} = {value} does not fit in a signed 64-bit integer")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{path} = {value!r} is not a finite number (JSON has none)")
        if abs(value) >= _FLOAT_LIMIT:
            raise ValueError(
                f"{path} = {value!r}: floats of magnitude 1e16 and more do not come back "
                "as floats from every backend; store an int or a string"
            )
    elif isinstance(value, str):
        _check_text(value, path)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_json_value(item, f"{path}[{index}]")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{path} has a key {key!r} that is not a string")
            if key.startswith("$") or "." in key:
                raise ValueError(f"{path} has a key {key!r}: MongoDB refuses '$' first or '.'")
            _check_text(key, f"{path} key {key!r}")
            _check_json_value(item, f"{path}[{key!r}]")
    else:
        raise TypeError(
            f"{path} is a {type(value).__name__}; initial_sync holds only str, int, float, "
            "bool, None, list and dict values"
        )


def _check_text(text: str, path: str) -> None:
    # PostgreSQL's jsonb refuses NUL characters; BSON and UTF-8 refuse lone surrogates.
    if "\x00" in text:
        raise ValueError(f"{path} contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{path} is not valid Unicode (a lone surrogate)") from None


def check_initial_sync(progress: object, argument: str = "initial_sync") -> None:
    """Raise unless *progress* is ``None`` or an initial-sync progress mapping.

    The mapping is opaque to the stores, but it must be JSON that every backend
    gives back unchanged: string keys (none starting with ``$`` or holding a
    ``.``); str, int, float, bool, None, list and dict values; no NaN or
    infinity, no float of magnitude 1e16 or more, no integer beyond 64 bits, no
    NUL character. It must have an ``int`` ``"batch"`` >= 0, the number
    ``save_initial_sync`` compares.
    """
    if progress is None:
        return
    if not isinstance(progress, Mapping):
        raise TypeError(f"{argument} must be a mapping or None, not {type(progress).__name__}")
    check_batch(progress.get("batch"), f"{argument}['batch']", required=True)
    _check_json_value(progress, argument)


def check_batch(batch: object, argument: str = "expected_batch", *, required: bool = False) -> None:
    """Raise unless *batch* is an ``int`` >= 0 (or ``None``, unless *required*)."""
    if batch is None and not required:
        return
    if not isinstance(batch, int) or isinstance(batch, bool):
        kind = "missing" if batch is None else f"a {type(batch).__name__}"
        raise TypeError(f"{argument} must be an int >= 0, not {kind}")
    if batch < 0 or batch not in _INT64:
        raise ValueError(f"{argument} must be an int from 0 to 2**63 - 1, not {batch}")


def check_initial_sync_write(
    stream_name: str, progress: Mapping[str, Any] | None, expected_batch: int | None
) -> None:
    """Validate the arguments of ``save_initial_sync``."""
    check_stream_name(stream_name)
    check_initial_sync(progress, "progress")
    check_batch(expected_batch)


def plain_progress(progress: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A deep copy of validated *progress* made of plain dicts and lists (``None`` stays)."""
    if progress is None:
        return None
    return plain(progress)


def progress_batch(progress: Mapping[str, Any] | None) -> int | None:
    """The ``"batch"`` of *progress*, or ``None`` when there is no progress."""
    return None if progress is None else progress["batch"]


#: The ``Checkpoint`` fields holding a token, and those holding a time.
CHECKPOINT_TOKENS = ("last_seen_token", "last_processed_token")
CHECKPOINT_TIMES = ("last_seen_at", "last_processed_at", "last_heartbeat_at")

#: The ``Checkpoint`` fields of each anchor: its token and its time.
SEEN_PAIR = ("last_seen_token", "last_seen_at")
PROCESSED_PAIR = ("last_processed_token", "last_processed_at")


def anchor_fields(
    pair: tuple[str, str],
    stream_name: str,
    token: Token | None,
    at: datetime | None,
    heartbeat_at: datetime | None = None,
) -> dict[str, Any]:
    """The checked ``Checkpoint`` fields a write of the anchor *pair* sets: the pair,
    and the heartbeat when given (``save_seen`` and ``save_processed`` on every store)."""
    check_anchor_write(stream_name, token, at, heartbeat_at)
    fields = {pair[0]: token, pair[1]: at}
    if heartbeat_at is not None:
        fields["last_heartbeat_at"] = heartbeat_at
    return fields


def heartbeat_fields(stream_name: str, at: datetime) -> dict[str, Any]:
    """The checked field ``save_heartbeat`` sets."""
    check_heartbeat_write(stream_name, at)
    return {"last_heartbeat_at": at}


def _anchor_write(pair: tuple[str, str], name: str, doc: str) -> Callable[..., None]:
    """``CheckpointStore.<name>``: the write of the anchor *pair* (``save_seen``,
    ``save_processed``), through ``_write_fields``."""

    def write(
        self: CheckpointStore,
        stream_name: str,
        token: Token | None,
        at: datetime | None,
        heartbeat_at: datetime | None = None,
    ) -> None:
        self._write_fields(stream_name, anchor_fields(pair, stream_name, token, at, heartbeat_at))

    write.__name__, write.__qualname__, write.__doc__ = name, f"CheckpointStore.{name}", doc
    return write


@dataclasses.dataclass(frozen=True, slots=True)
class Checkpoint:
    """One stream's persisted position: both anchors, the heartbeat, owner and metadata.

    Every token and timestamp may be ``None``: a new stream has no anchor yet, and
    an idle stream may have certified a seen position but processed nothing.
    Timestamps are timezone-aware datetimes. ``initial_sync`` is the progress of the
    stream's initial copy (see :func:`check_initial_sync`), ``None`` when there is none.
    """

    stream_name: str
    instance_id: str | None = None
    last_seen_token: Token | None = None
    last_seen_at: datetime | None = None
    last_processed_token: Token | None = None
    last_processed_at: datetime | None = None
    last_heartbeat_at: datetime | None = None
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    initial_sync: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        check_stream_name(self.stream_name)
        check_token(self.last_seen_token, "last_seen_token")
        check_token(self.last_processed_token, "last_processed_token")
        for name in CHECKPOINT_TIMES:
            _check_aware(getattr(self, name), name)
        if self.metadata is None:
            object.__setattr__(self, "metadata", {})
        elif not isinstance(self.metadata, Mapping):
            raise TypeError("metadata must be a mapping")
        check_initial_sync(self.initial_sync)

    def replace(self, **changes: Any) -> Checkpoint:
        """Return a copy with *changes* applied."""
        return dataclasses.replace(self, **changes)


class CheckpointStore(RunsSync, ABC):
    """Persists checkpoints, keyed by stream name.

    Only :meth:`save`, :meth:`find` and :meth:`delete` are abstract. The partial
    operations have read-modify-write defaults that are correct for a single
    writer only: under concurrent anchor writers they can resurrect a stale value
    of the other anchor, and neither the history-lost guard nor the condition of
    :meth:`save_initial_sync` is atomic. Every production backend overrides each
    of them with one targeted, upserting (or conditional) write.

    Async API: ``asave``, ``afind``, ``adelete``, ``alist_checkpoints``, ``asave_seen``,
    ``asave_processed``, ``asave_heartbeat``, ``areset_after_history_lost`` and
    ``asave_initial_sync`` have the semantics and errors of their sync twins. The
    defaults run the sync method through
    ``asgiref.sync.sync_to_async(thread_sensitive=async_thread_sensitive)``: ``True``
    here and on the ORM store (Django's connections and transactions belong to the
    thread-sensitive executor), ``False`` on the memory, Redis and MongoDB stores,
    which never touch the Django database, so their calls run in parallel on the
    default executor. Every operation of a store touches the same storage, so one
    class attribute decides for all of them; a backend with a native async client
    overrides the ``a…`` methods themselves. A wrapper such as
    ``ObservedCheckpointStore`` inherits the defaults, so its async writes keep its
    fencing and its signals.
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

    save_seen = _anchor_write(
        SEEN_PAIR,
        "save_seen",
        "Set the seen pair (and the heartbeat, when given, in the same write).",
    )
    save_processed = _anchor_write(
        PROCESSED_PAIR,
        "save_processed",
        "Set the processed pair (and the heartbeat, when given, in the same write).",
    )

    def save_heartbeat(self, stream_name: str, at: datetime) -> None:
        """Set only the heartbeat: the position was re-certified unchanged."""
        self._write_fields(stream_name, heartbeat_fields(stream_name, at))

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
        fields = {"last_seen_token": fresh_seen_token, "last_seen_at": stamp}
        self._reset_fields(
            stream_name, {**fields, "last_heartbeat_at": stamp}, expected_dead_processed
        )

    def save_initial_sync(
        self,
        stream_name: str,
        progress: Mapping[str, Any] | None,
        *,
        expected_batch: int | None,
    ) -> bool:
        """Set the initial-sync progress (``None`` clears it) if its batch is as expected.

        The write happens only while the stored progress's ``"batch"`` equals
        *expected_batch*; ``None`` matches "no progress stored", a missing record
        included, and then the record is created. Returns ``True`` when written,
        ``False`` when the condition failed and nothing was written. No other field
        is touched, and no other partial operation touches this one (``save``
        replaces the whole record, progress included).

        This default reads then saves, so the condition is not atomic; every
        production backend evaluates it in the write itself.
        """
        check_initial_sync_write(stream_name, progress, expected_batch)
        return self._write_initial_sync(stream_name, plain_progress(progress), expected_batch)

    def close(self) -> None:
        """Release connections the store opened itself (none by default)."""

    # -- the async API: the sync operations run through ``sync_to_async`` ------------

    _thread_twinned = (
        "save",
        "find",
        "delete",
        "list_checkpoints",
        "save_seen",
        "save_processed",
        "save_heartbeat",
        "reset_after_history_lost",
        "save_initial_sync",
    )

    # -- the writes of the partial operations, validated already ----------------------

    def _write_fields(self, stream_name: str, fields: dict[str, Any]) -> None:
        """Set *fields* of the record (created when missing), and nothing else."""
        self._read_modify_write(stream_name, lambda current: fields)

    def _reset_fields(
        self, stream_name: str, fields: dict[str, Any], expected_dead_processed: Token | None
    ) -> None:
        """Set *fields*, and remove the processed pair while its token still equals
        *expected_dead_processed*, in one write (the guard of
        :meth:`reset_after_history_lost`)."""

        def changes(current: Checkpoint) -> dict[str, Any]:
            if tokens_equal(current.last_processed_token, expected_dead_processed):
                return {**fields, "last_processed_token": None, "last_processed_at": None}
            return fields

        self._read_modify_write(stream_name, changes)

    def _write_initial_sync(
        self, stream_name: str, stored: dict[str, Any] | None, expected_batch: int | None
    ) -> bool:
        """Set the (plain) progress *stored* if the stored batch is *expected_batch*."""

        def changes(current: Checkpoint) -> dict[str, Any] | None:
            if progress_batch(current.initial_sync) != expected_batch:
                return None
            return {"initial_sync": stored}

        return self._read_modify_write(stream_name, changes)

    def _read_modify_write(
        self, stream_name: str, changes: Callable[[Checkpoint], dict[str, Any] | None]
    ) -> bool:
        """Apply ``changes(current)`` to the record (created when missing).

        ``changes`` returns ``None`` to write nothing (a failed condition); the
        result says whether anything was written. This default reads then saves,
        so it is not atomic; a store that can hold a lock across both (the
        in-memory one) overrides it.
        """
        current = self.find(stream_name) or Checkpoint(stream_name)
        update = changes(current)
        if update is None:
            return False
        self.save(current.replace(**update))
        return True

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

    def _read_modify_write(
        self, stream_name: str, changes: Callable[[Checkpoint], dict[str, Any] | None]
    ) -> bool:
        """Store nothing and report success: the partial writes (the base class's)
        validate their arguments, then come here; ``save_initial_sync`` returns
        ``True``, as nothing is ever stored to fail its condition."""
        return True


_NOOP = NoopCheckpointStore()
