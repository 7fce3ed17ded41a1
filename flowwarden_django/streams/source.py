"""Where change events come from: the narrow port the runtime reads through.

``PymongoChangeSource`` is the production implementation over
``collection.watch()``; ``flowwarden_django.testkit.fake_source`` is an
in-process one for fast tests. Both raise pymongo's own exceptions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

#: Server errors meaning a resume position is no longer usable: ChangeStreamHistoryLost,
#: ChangeStreamFatalError, CappedPositionLost, InvalidResumeToken, and the codes of
#: older servers for "resume token not found".
HISTORY_LOST_CODES = frozenset({286, 280, 136, 260, 40576, 40585, 40615})

#: Prefix of the ``comment`` stamped on every cursor the runtime opens.
CURSOR_COMMENT_PREFIX = "flowwarden:"


def is_history_lost(exc: BaseException) -> bool:
    """Whether *exc* says the requested position has left the server's history."""
    return getattr(exc, "code", None) in HISTORY_LOST_CODES


class ChangeCursor(Protocol):
    """An open change stream (pymongo's ``ChangeStream`` has exactly this shape)."""

    @property
    def alive(self) -> bool: ...

    @property
    def resume_token(self) -> Mapping[str, Any] | None: ...

    def try_next(self) -> Mapping[str, Any] | None: ...

    def close(self) -> None: ...


class ChangeSource(Protocol):
    """Opens change streams on one collection, answers the two position questions, and
    reads the collection's documents for an initial sync."""

    def open(
        self,
        *,
        resume_after: Mapping[str, Any] | None = None,
        start_after: Mapping[str, Any] | None = None,
        start_at_operation_time: Any = None,
    ) -> ChangeCursor: ...

    def initial_position(self) -> Mapping[str, Any]:
        """The server's current position (the postBatchResumeToken of a fresh stream)."""
        ...

    def oldest_oplog_time(self) -> Any:
        """The oldest operation time still in the oplog, or ``None`` if unreadable."""
        ...

    def copy_batch(
        self, query: Mapping[str, Any], after_id: Any, limit: int
    ) -> list[Mapping[str, Any]]:
        """Up to *limit* documents matching *query* with ``_id`` above *after_id*
        (``None``: from the first), in ``_id`` order."""
        ...

    def estimated_count(self) -> int:
        """The collection's estimated document count (metadata, not a scan)."""
        ...


class CollectionStreamSettings:
    """What the sync and async pymongo sources share: the collection, the pipeline and
    the change-stream options, and the arguments of ``watch()`` and of the bootstrap
    ``aggregate`` built from them. Subclasses send them through their client."""

    def __init__(
        self,
        client: Any,
        database: str | None,
        collection: str,
        *,
        stream_name: str,
        pipeline: Sequence[Mapping[str, Any]] = (),
        full_document: str = "default",
        full_document_before_change: str = "off",
        max_await_ms: int = 1000,
    ) -> None:
        self.client = client
        self.database = client[database] if database else client.get_default_database()
        self.collection = self.database[collection]
        self.stream_name = stream_name
        self.pipeline = list(pipeline)
        self.full_document = None if full_document == "default" else full_document
        self.full_document_before_change = (
            None if full_document_before_change == "off" else full_document_before_change
        )
        self.max_await_ms = max_await_ms

    def watch_arguments(
        self,
        resume_after: Mapping[str, Any] | None,
        start_after: Mapping[str, Any] | None,
        start_at_operation_time: Any,
    ) -> dict[str, Any]:
        """The keyword arguments of ``collection.watch(self.pipeline, ...)``."""
        return {
            "full_document": self.full_document,
            "full_document_before_change": self.full_document_before_change,
            "resume_after": resume_after,
            "start_after": start_after,
            "start_at_operation_time": start_at_operation_time,
            "max_await_time_ms": self.max_await_ms,
            "comment": f"{CURSOR_COMMENT_PREFIX}{self.stream_name}",
        }

    def _change_stream_stage(self) -> dict[str, Any]:
        stage: dict[str, Any] = {}
        if self.full_document:
            stage["fullDocument"] = self.full_document
        if self.full_document_before_change:
            stage["fullDocumentBeforeChange"] = self.full_document_before_change
        return stage

    def bootstrap_command(self) -> dict[str, Any]:
        """The ``aggregate`` that reads the current position. batchSize 0: the reply
        carries no event, only the position, so nothing can slip between reading it
        and resuming after it."""
        return {
            "pipeline": [{"$changeStream": self._change_stream_stage()}, *self.pipeline],
            "cursor": {"batchSize": 0},
            "comment": f"{CURSOR_COMMENT_PREFIX}bootstrap:{self.stream_name}",
        }

    def bootstrap_position(self, reply: Mapping[str, Any]) -> Mapping[str, Any]:
        """The position in the bootstrap's *reply* (kill its cursor, ``reply["cursor"]
        ["id"]`` when not 0, first)."""
        token = reply["cursor"].get("postBatchResumeToken")
        if token is None:
            raise RuntimeError(
                f"stream {self.stream_name!r}: the server returned no postBatchResumeToken "
                "(change streams need MongoDB 4.0.7+ running as a replica set)"
            )
        return token


class PymongoChangeSource(CollectionStreamSettings):
    """Change streams on one collection through pymongo's ``watch()``.

    ``pipeline`` stages follow ``$changeStream`` on every cursor, the bootstrap
    included. Cursors carry the comment ``flowwarden:<stream>``.
    """

    def open(
        self,
        *,
        resume_after: Mapping[str, Any] | None = None,
        start_after: Mapping[str, Any] | None = None,
        start_at_operation_time: Any = None,
    ) -> ChangeCursor:
        arguments = self.watch_arguments(resume_after, start_after, start_at_operation_time)
        return self.collection.watch(self.pipeline, **arguments)

    def initial_position(self) -> Mapping[str, Any]:
        reply = self.database.command("aggregate", self.collection.name, **self.bootstrap_command())
        cursor_id = reply["cursor"].get("id")
        if cursor_id:
            self.database.command("killCursors", self.collection.name, cursors=[cursor_id])
        return self.bootstrap_position(reply)

    def oldest_oplog_time(self) -> Any:
        from pymongo.errors import PyMongoError

        try:
            first = self.client.local["oplog.rs"].find_one({}, sort=[("$natural", 1)])
        except PyMongoError:
            return None
        return None if first is None else first.get("ts")

    def copy_batch(
        self, query: Mapping[str, Any], after_id: Any, limit: int
    ) -> list[Mapping[str, Any]]:
        criteria: dict[str, Any] = dict(query)
        if after_id is not None:
            after = {"_id": {"$gt": after_id}}
            criteria = {"$and": [criteria, after]} if criteria else after
        cursor = (
            self.collection.find(
                criteria, comment=f"{CURSOR_COMMENT_PREFIX}copy:{self.stream_name}"
            )
            .sort("_id", 1)
            .limit(limit)
        )
        try:
            return list(cursor)
        finally:
            cursor.close()

    def estimated_count(self) -> int:
        return int(self.collection.estimated_document_count())

    def oplog_window(self) -> tuple[Any, Any] | None:
        """The oldest and newest operation times of the oplog (``bson.Timestamp``),
        or ``None`` when it cannot be read as a plain oplog (no ``local.oplog.rs``,
        not allowed); other errors are raised."""
        from pymongo.errors import OperationFailure

        oplog = self.client.local["oplog.rs"]
        try:
            first = oplog.find_one({}, {"ts": 1}, sort=[("$natural", 1)])
            last = oplog.find_one({}, {"ts": 1}, sort=[("$natural", -1)])
        except OperationFailure:
            return None
        if first is None or last is None:
            return None
        return first.get("ts"), last.get("ts")
