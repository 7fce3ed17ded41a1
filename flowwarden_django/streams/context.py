"""What a handler receives: ``ChangeContext`` and its ``UpdateDescription``."""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from asgiref.sync import sync_to_async

from .checkpoint import as_utc
from .spec import SNAPSHOT_OPERATION


@dataclasses.dataclass(frozen=True)
class UpdateDescription:
    """The ``updateDescription`` of an update event."""

    updated_fields: Mapping[str, Any]
    removed_fields: tuple[str, ...]
    truncated_arrays: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def from_event(cls, raw: Mapping[str, Any] | None) -> UpdateDescription | None:
        """Build it from the event's sub-document (``None`` when absent)."""
        if raw is None:
            return None
        return cls(
            updated_fields=dict(raw.get("updatedFields") or {}),
            removed_fields=tuple(raw.get("removedFields") or ()),
            truncated_arrays=tuple(raw.get("truncatedArrays") or ()),
        )

    def has_field_changed(self, path: str) -> bool:
        """Whether *path* (dotted) or anything inside or above it was updated or removed."""
        for changed in (*self.updated_fields, *self.removed_fields):
            if changed == path or changed.startswith(path + ".") or path.startswith(changed + "."):
                return True
        return False

    def get_updated_field_value(self, path: str, default: Any = None) -> Any:
        """The new value of an updated field (exact dotted key), else *default*."""
        return self.updated_fields.get(path, default)


@dataclasses.dataclass(frozen=True)
class TransactionInfo:
    """The transaction an event was written in (both parts present, else no info)."""

    lsid: Mapping[str, Any]
    txn_number: int


#: The version (4) and variant bits of a random UUID, and the bits they replace.
_UUID4_BITS = (0x4 << 76) | (0x8 << 60)
_UUID4_MASK = ~((0xF << 76) | (0xC << 60)) & ((1 << 128) - 1)
#: The event ids' own generator, seeded from the OS (not the global one, which a
#: ``random.seed(n)`` elsewhere would make repeat), and reseeded in a forked child.
_ids = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ids.seed)


def new_event_id() -> str:
    """A fresh delivery id: a random (version 4) UUID as 32 hex digits.

    Drawn from a generator seeded by the OS rather than from ``uuid.uuid4()``, which
    reads the OS entropy pool on every call and costs several times as much: an event
    id must be unique, not secret.
    """
    return "%032x" % (_ids.getrandbits(128) & _UUID4_MASK | _UUID4_BITS)


def aware_datetime(value: Any) -> datetime | None:
    """An event's time (``bson.Timestamp`` or datetime) as an aware datetime, else None."""
    if value is None:
        return None
    if type(value) is datetime and value.tzinfo is None:
        # A naive BSON date (the event's wallTime): as_utc's replace(tzinfo=UTC), made
        # as combine() does it in a fifth of the time (this runs once per event).
        return datetime.combine(value.date(), value.time(), UTC)
    if isinstance(value, datetime):
        return as_utc(value)
    as_datetime = getattr(value, "as_datetime", None)  # bson.Timestamp
    return as_datetime() if as_datetime else None


class ChangeContext:
    """One change event as a handler sees it, plus the actions it may take.

    The raw event stays available as ``event``. ``save_checkpoint_now()`` is an
    early acknowledgement: it persists this event as processed immediately (in
    transactional streams, inside the handler's transaction).

    A document copied by an initial sync (:meth:`for_snapshot`) is no change event:
    ``operation_type`` is ``"snapshot"``, ``full_document`` is the document,
    ``document_key`` is ``{"_id": ...}``, ``is_snapshot`` is true and
    ``resume_token`` is ``None`` (it has no position in the change stream), so
    ``save_checkpoint_now()`` returns ``False`` for it.
    """

    @classmethod
    def for_snapshot(
        cls,
        doc: Mapping[str, Any],
        *,
        stream_name: str,
        database: str | None = None,
        collection: str | None = None,
        send_to_dlq: Callable[[ChangeContext, str], None] | None = None,
    ) -> ChangeContext:
        """The context of one document copied by an initial sync."""
        event = {
            "operationType": SNAPSHOT_OPERATION,
            "fullDocument": doc,
            "documentKey": {"_id": doc["_id"]},
            "ns": {"db": database, "coll": collection},
        }
        return cls(event, stream_name=stream_name, send_to_dlq=send_to_dlq)

    def __init__(
        self,
        event: Mapping[str, Any],
        *,
        stream_name: str,
        attempt_number: int = 1,
        save_now: Callable[[ChangeContext], bool] | None = None,
        send_to_dlq: Callable[[ChangeContext, str], None] | None = None,
        event_id: str | None = None,
        asave_now: Callable[[ChangeContext], Awaitable[bool]] | None = None,
        asend_to_dlq: Callable[[ChangeContext, str], Awaitable[None]] | None = None,
    ) -> None:
        self.event = event
        self._event_id = event_id
        self.stream_name = stream_name
        self.attempt_number = attempt_number
        self._save_now = save_now
        self._send_to_dlq = send_to_dlq
        self._asave_now = asave_now
        self._asend_to_dlq = asend_to_dlq
        self._metadata: dict[str, Any] | None = None  # made by the first add_metadata()
        self.saved_manually = False

    # -- what happened ------------------------------------------------------------

    @property
    def event_id(self) -> str:
        """A unique id of this delivery (made on first use)."""
        if self._event_id is None:
            self._event_id = new_event_id()
        return self._event_id

    @property
    def operation_type(self) -> str:
        return self.event.get("operationType", "")

    @property
    def is_snapshot(self) -> bool:
        """Whether this is a document copied by an initial sync, not a change event."""
        return self.operation_type == SNAPSHOT_OPERATION

    @property
    def resume_token(self) -> Mapping[str, Any] | None:
        """The event's resume token; ``None`` for a copied document (``is_snapshot``)."""
        if self.is_snapshot:
            return None
        return self.event["_id"]

    @property
    def collection_name(self) -> str | None:
        return (self.event.get("ns") or {}).get("coll")

    @property
    def database_name(self) -> str | None:
        return (self.event.get("ns") or {}).get("db")

    @property
    def cluster_time(self) -> Any:
        """The event's ``clusterTime`` (a ``bson.Timestamp``)."""
        return self.event.get("clusterTime")

    @property
    def cluster_datetime(self) -> datetime | None:
        """The cluster time as an aware datetime (second precision)."""
        return aware_datetime(self.cluster_time)

    @property
    def wall_time(self) -> datetime | None:
        """The event's ``wallTime`` (MongoDB 6.0+), aware, or ``None``."""
        return aware_datetime(self.event.get("wallTime"))

    @property
    def transaction_info(self) -> TransactionInfo | None:
        lsid, txn = self.event.get("lsid"), self.event.get("txnNumber")
        if lsid is None or txn is None:
            return None
        return TransactionInfo(lsid=lsid, txn_number=int(txn))

    @property
    def full_document(self) -> Mapping[str, Any] | None:
        return self.event.get("fullDocument")

    @property
    def full_document_before_change(self) -> Mapping[str, Any] | None:
        return self.event.get("fullDocumentBeforeChange")

    @property
    def update_description(self) -> UpdateDescription | None:
        return UpdateDescription.from_event(self.event.get("updateDescription"))

    @property
    def document_key(self) -> Mapping[str, Any] | None:
        return self.event.get("documentKey")

    def summary(self) -> str:
        """One line for logs: stream, operation, namespace and key."""
        key = (self.document_key or {}).get("_id")
        return (
            f"{self.stream_name}: {self.operation_type} {self.database_name}.{self.collection_name}"
            f" _id={key!r} (attempt {self.attempt_number})"
        )

    # -- actions ---------------------------------------------------------------------

    def save_checkpoint_now(self) -> bool:
        """Persist this event as processed now; ``False`` if the write failed or is not
        allowed (lifecycle events never become resume positions)."""
        if self._save_now is None:
            return False
        saved = self._save_now(self)
        self.saved_manually = self.saved_manually or saved
        return saved

    def send_to_dlq(self, reason: str) -> None:
        """Park this event in the stream's dead-letter queue now (error type ``ManualDlq``).

        It does not settle the event by itself: that follows from what the handler
        does next. If the write fails the error is raised here, into the handler.
        """
        if self._send_to_dlq is None:
            raise RuntimeError(f"{self.stream_name}: this context cannot send to the DLQ")
        self._send_to_dlq(self, reason)

    async def asave_checkpoint_now(self) -> bool:
        """:meth:`save_checkpoint_now` for an ``async def`` handler (same result).

        Under :class:`~.runtime.event_loop.AsyncStreamConsumer` it is native; elsewhere it
        runs the sync method on the handler's thread-sensitive thread, inside the
        transaction of a transactional stream.
        """
        if self._asave_now is None:
            return await sync_to_async(self.save_checkpoint_now, thread_sensitive=True)()
        saved = await self._asave_now(self)
        self.saved_manually = self.saved_manually or saved
        return saved

    async def asend_to_dlq(self, reason: str) -> None:
        """:meth:`send_to_dlq` for an ``async def`` handler (same errors)."""
        if self._asend_to_dlq is None:
            await sync_to_async(self.send_to_dlq, thread_sensitive=True)(reason)
            return
        await self._asend_to_dlq(self, reason)

    def add_metadata(self, key: str, value: Any) -> None:
        """Attach a value to this event (copied into dead letters later)."""
        if self._metadata is None:
            self._metadata = {}
        self._metadata[key] = value

    def get_metadata(self, key: str, default: Any = None) -> Any:
        return default if self._metadata is None else self._metadata.get(key, default)

    @property
    def metadata(self) -> dict[str, Any]:
        """A copy of everything attached with :meth:`add_metadata`."""
        return {} if self._metadata is None else dict(self._metadata)
