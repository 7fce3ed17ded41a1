"""An in-process change source for fast tests of stream logic (no sockets).

``FakeOplog`` holds events at increasing positions; ``FakeChangeSource`` opens
cursors on it with the same options and the same pymongo exceptions as the real
source. It does not imitate pymongo's own auto-resume or evaluate pipelines: the
wire-level tests against ``ScriptedReplicaSet`` cover those.

The oplog also keeps the collection's documents, for initial syncs: ``seed()`` adds
documents without events, and every event appended changes them as the server would
(insert/replace store ``fullDocument``, update applies ``updatedFields`` and
``removedFields``, delete removes, drop empties). ``FakeChangeSource.copy_batch``
reads them like a ``find`` sorted on ``_id`` (the ``$match`` subset of
``ScriptedReplicaSet``), as they are at that moment.

``AsyncFakeChangeSource`` is the same source through the async protocol that
``AsyncStreamConsumer`` reads (``await open()``, ``await cursor.try_next()``).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import threading
from collections import deque
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from bson import Timestamp
from pymongo.errors import OperationFailure

from ._scripted_match import bson_sort_key, compile_filter

_BASE_TIME = 1_700_000_000


def fake_token(position: int) -> dict[str, str]:
    """The resume token of a position: ``{"_data": "82…"}``, ordered like positions."""
    return {"_data": f"82{position:016X}"}


def _position_of(token: Mapping[str, Any]) -> int:
    return int(token["_data"][2:], 16)


def history_lost_error() -> OperationFailure:
    """The error a real server sends when a resume point left the oplog."""
    message = (
        "Resume of change stream was not possible, as the resume point may no longer be in "
        "the oplog."
    )
    return OperationFailure(
        message,
        code=286,
        details={
            "ok": 0,
            "errmsg": message,
            "code": 286,
            "codeName": "ChangeStreamHistoryLost",
            "errorLabels": ["NonResumableChangeStreamError"],
        },
    )


class FakeOplog:
    """Change events of one collection at increasing positions, plus idle no-ops."""

    def __init__(self, db: str = "app", coll: str = "orders") -> None:
        self.db, self.coll = db, coll
        self._events: list[tuple[int, dict[str, Any]]] = []
        self._positions = itertools.count(1)
        self._lock = threading.RLock()
        self.oldest = 1
        self.last_position = 0
        self.invalidate_positions: set[int] = set()
        #: The collection's current documents by ``_id``: seeded, then changed by events.
        self.documents: dict[Any, dict[str, Any]] = {}

    def seed(self, docs: Any) -> None:
        """Store documents that existed before the oplog's history (no events)."""
        with self._lock:
            for doc in docs:
                self.documents[doc["_id"]] = copy.deepcopy(dict(doc))

    def _apply(self, operation: str, fields: Mapping[str, Any]) -> None:
        key = (fields.get("documentKey") or {}).get("_id")
        if operation in ("insert", "replace") and fields.get("fullDocument") is not None:
            self.documents[key] = copy.deepcopy(dict(fields["fullDocument"]))
        elif operation == "update" and key in self.documents:
            doc = self.documents[key]
            description = fields.get("updateDescription") or {}
            for path, value in (description.get("updatedFields") or {}).items():
                _set_path(doc, path, copy.deepcopy(value))
            for path in description.get("removedFields") or ():
                _unset_path(doc, path)
        elif operation == "delete":
            self.documents.pop(key, None)
        elif operation in ("drop", "rename", "dropDatabase"):
            self.documents.clear()

    def _next_position(self) -> int:
        self.last_position = next(self._positions)
        return self.last_position

    def append(self, operation: str, **fields: Any) -> dict[str, Any]:
        """Append one event of *operation* with extra event fields."""
        with self._lock:
            position = self._next_position()
            event = {
                "_id": fake_token(position),
                "operationType": operation,
                "clusterTime": Timestamp(_BASE_TIME + position, 1),
                "wallTime": datetime.fromtimestamp(_BASE_TIME, UTC) + timedelta(seconds=position),
                "ns": {"db": self.db, "coll": self.coll},
                **fields,
            }
            self._events.append((position, event))
            self._apply(operation, fields)
            if operation == "invalidate":
                self.invalidate_positions.add(position)
            return event

    def insert(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        return self.append("insert", documentKey={"_id": doc["_id"]}, fullDocument=dict(doc))

    def update(self, _id: Any, set_fields: Mapping[str, Any]) -> dict[str, Any]:
        description = {
            "updatedFields": dict(set_fields),
            "removedFields": [],
            "truncatedArrays": [],
        }
        return self.append("update", documentKey={"_id": _id}, updateDescription=description)

    def delete(self, _id: Any) -> dict[str, Any]:
        return self.append("delete", documentKey={"_id": _id})

    def drop(self) -> None:
        """A collection drop: a ``drop`` event, then ``invalidate``."""
        self.append("drop")
        self.append("invalidate")

    def rename(self, to: str) -> None:
        """A collection rename: a ``rename`` event, then ``invalidate``."""
        self.append("rename", to={"db": self.db, "coll": to})
        self.append("invalidate")

    def noop(self) -> int:
        """An idle position (the server's periodic no-op write)."""
        with self._lock:
            return self._next_position()

    def lose_history(self, keep_last: int = 0) -> None:
        """Forget all but the last *keep_last* events: older positions cannot be resumed."""
        with self._lock:
            kept = self._events[-keep_last:] if keep_last else []
            self.oldest = kept[0][0] if kept else self.last_position + 1
            self._events = list(kept)

    def after(self, position: int) -> tuple[int, dict[str, Any]] | None:
        """The first event after *position*; ``OperationFailure(286)`` if it was forgotten."""
        with self._lock:
            if position + 1 < self.oldest:
                raise history_lost_error()
            for event_position, event in self._events:
                if event_position > position:
                    return event_position, event
            return None

    def next_or_idle(self, position: int, *, advance: bool) -> tuple[int, dict[str, Any] | None]:
        """The first event after *position*, or (with *advance*) a fresh idle position,
        decided under one lock: an event appended meanwhile is never skipped."""
        with self._lock:
            found = self.after(position)
            if found is not None:
                return found
            return (self._next_position() if advance else position), None

    def oldest_time(self) -> Timestamp:
        return Timestamp(_BASE_TIME + self.oldest, 1)


def _set_path(doc: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        doc = doc.setdefault(part, {})
    doc[last] = value


def _unset_path(doc: dict[str, Any], path: str) -> None:
    *parents, last = path.split(".")
    for part in parents:
        doc = doc.get(part)
        if not isinstance(doc, dict):
            return
    doc.pop(last, None)


class FakeCursor:
    """A cursor on a ``FakeOplog``: ``try_next`` returns the next event or ``None`` when
    idle, moving ``resume_token`` like pymongo does."""

    def __init__(self, source: FakeChangeSource, position: int) -> None:
        self.source = source
        self.position = position
        self.alive = True
        self.resume_token: dict[str, Any] | None = None

    def try_next(self) -> dict[str, Any] | None:
        if not self.alive:
            return None
        if self.source.errors:
            raise self.source.errors.popleft()
        self.position, event = self.source.oplog.next_or_idle(
            self.position, advance=self.source.idle_advances
        )
        if event is None:
            self.resume_token = fake_token(self.position)
            return None
        self.resume_token = dict(event["_id"])
        if event["operationType"] == "invalidate":
            self.alive = False
        return event

    def close(self) -> None:
        self.alive = False


class FakeChangeSource:
    """Opens ``FakeCursor``s; records every ``open`` call's arguments in ``opens``.

    ``errors``: exceptions the next ``try_next`` calls raise, in order.
    ``idle_advances``: whether an idle poll moves the position (a server's no-op).
    """

    def __init__(self, oplog: FakeOplog | None = None, *, idle_advances: bool = True) -> None:
        self.oplog = oplog or FakeOplog()
        self.idle_advances = idle_advances
        self.errors: deque[BaseException] = deque()
        self.opens: list[dict[str, Any]] = []
        #: Every ``copy_batch`` call's arguments.
        self.copy_queries: list[dict[str, Any]] = []

    def open(
        self,
        *,
        resume_after: Mapping[str, Any] | None = None,
        start_after: Mapping[str, Any] | None = None,
        start_at_operation_time: Any = None,
    ) -> FakeCursor:
        self.opens.append(
            {
                "resume_after": resume_after,
                "start_after": start_after,
                "start_at_operation_time": start_at_operation_time,
            }
        )
        token = resume_after or start_after
        if token is not None:
            position = _position_of(token)
            if resume_after is not None and position in self.oplog.invalidate_positions:
                raise OperationFailure(
                    "Attempting to resume a change stream using 'resumeAfter' is not allowed "
                    "from an invalidate notification.",
                    code=260,
                    details={"ok": 0, "code": 260, "codeName": "InvalidResumeToken"},
                )
            if position + 1 < self.oplog.oldest:
                raise history_lost_error()
        elif start_at_operation_time is not None:
            position = start_at_operation_time.time - _BASE_TIME - 1
            if position + 1 < self.oplog.oldest:
                raise history_lost_error()
        else:
            position = self.oplog.last_position
        return FakeCursor(self, position)

    def initial_position(self) -> Mapping[str, Any]:
        return fake_token(self.oplog.noop())

    def oldest_oplog_time(self) -> Any:
        return self.oplog.oldest_time()

    def copy_batch(
        self, query: Mapping[str, Any], after_id: Any, limit: int
    ) -> list[dict[str, Any]]:
        """Up to *limit* current documents matching *query* with ``_id`` above *after_id*,
        in ``_id`` order (BSON order), as copies."""
        self.copy_queries.append({"query": dict(query), "after_id": after_id, "limit": limit})
        matches = compile_filter(dict(query))
        after = None if after_id is None else bson_sort_key(after_id)
        with self.oplog._lock:
            found = [
                doc
                for doc in self.oplog.documents.values()
                if (after is None or bson_sort_key(doc["_id"]) > after) and matches(doc)
            ]
            found.sort(key=lambda doc: bson_sort_key(doc["_id"]))
            return [copy.deepcopy(doc) for doc in found[:limit]]

    def estimated_count(self) -> int:
        with self.oplog._lock:
            return len(self.oplog.documents)

    def oplog_window(self) -> tuple[Any, Any] | None:
        """The oldest and newest positions as times (like ``local.oplog.rs``'s ``ts``)."""
        return self.oplog.oldest_time(), Timestamp(_BASE_TIME + self.oplog.last_position, 1)


class AsyncFakeCursor:
    """A ``FakeCursor`` with ``await try_next()``; an idle poll waits a little, as a
    server's ``maxAwaitTimeMS`` does, so an idle consumer does not spin."""

    def __init__(self, cursor: FakeCursor, idle_wait_seconds: float) -> None:
        self.cursor = cursor
        self.idle_wait_seconds = idle_wait_seconds

    @property
    def alive(self) -> bool:
        return self.cursor.alive

    @property
    def resume_token(self) -> dict[str, Any] | None:
        return self.cursor.resume_token

    async def try_next(self) -> dict[str, Any] | None:
        event = self.cursor.try_next()
        if event is None:
            await asyncio.sleep(self.idle_wait_seconds)
        return event

    async def close(self) -> None:
        self.cursor.close()


class AsyncFakeChangeSource:
    """A ``FakeChangeSource`` for ``AsyncStreamConsumer``: the same oplog, errors and
    recorded ``opens`` (``sync`` is the wrapped source)."""

    def __init__(
        self,
        oplog: FakeOplog | None = None,
        *,
        idle_advances: bool = True,
        idle_wait_seconds: float = 0.005,
    ) -> None:
        self.sync = FakeChangeSource(oplog, idle_advances=idle_advances)
        self.idle_wait_seconds = idle_wait_seconds

    @classmethod
    def wrapping(cls, source: FakeChangeSource, **options: Any) -> AsyncFakeChangeSource:
        """The async view of an existing *source* (its oplog, errors and ``opens``)."""
        view = cls(source.oplog, **options)
        view.sync = source
        return view

    @property
    def oplog(self) -> FakeOplog:
        return self.sync.oplog

    @property
    def errors(self) -> deque[BaseException]:
        return self.sync.errors

    @property
    def opens(self) -> list[dict[str, Any]]:
        return self.sync.opens

    async def open(
        self,
        *,
        resume_after: Mapping[str, Any] | None = None,
        start_after: Mapping[str, Any] | None = None,
        start_at_operation_time: Any = None,
    ) -> AsyncFakeCursor:
        cursor = self.sync.open(
            resume_after=resume_after,
            start_after=start_after,
            start_at_operation_time=start_at_operation_time,
        )
        return AsyncFakeCursor(cursor, self.idle_wait_seconds)

    async def initial_position(self) -> Mapping[str, Any]:
        return self.sync.initial_position()

    async def oldest_oplog_time(self) -> Any:
        return self.sync.oldest_oplog_time()
