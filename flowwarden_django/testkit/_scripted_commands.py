"""How :class:`~.scripted_mongo.ScriptedReplicaSet` answers the driver: each command
received is recorded, an injected fault is served first, then its handler answers
(``hello``, ``find``, ``count``, ``aggregate`` on a collection or a change stream,
``getMore``, ``killCursors``; the writes of ``_scripted_writes``), a handler's bug
becoming a short ``InternalError``. The cursors it keeps between a command and its
``getMore`` are here too."""

from __future__ import annotations

import contextlib
import logging
import random
import time
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from bson import Int64, Timestamp

from ..common.plain_data import plain
from ._scripted_events import Position, StreamView, make_token, parse_change_stream, to_timestamp
from ._scripted_match import compile_filter
from ._scripted_query import (
    DEFAULT_FIRST_BATCH,
    DocumentCursor,
    ResultCursor,
    compile_pipeline,
    parse_count,
    parse_find,
    run_stages,
)
from ._scripted_wire import CommandError, build_info_reply, hello_reply, oplog_entry, project
from ._scripted_writes import WRITE_COMMANDS

DEFAULT_BATCH_SIZE = DEFAULT_FIRST_BATCH  # 101, a server's first-batch default
#: Tracebacks of handler bugs kept for :attr:`ScriptedReplicaSet.internal_errors`.
MAX_INTERNAL_ERRORS = 100
HANGUP = object()

logger = logging.getLogger("flowwarden_django.testkit.scripted_mongo")


@dataclass(frozen=True)
class RecordedCommand:
    """One command the server received: its name as sent, its document, when."""

    name: str
    doc: dict[str, Any]
    at: float = field(default_factory=time.monotonic)


@dataclass
class StreamCursor:
    view: StreamView
    after: Position
    batch_size: int | None
    ns: str


@dataclass
class ReadCursor:
    """A find or collection-aggregate cursor (no resume tokens, never waits)."""

    reader: DocumentCursor | ResultCursor
    ns: str


class CommandHandlersMixin:
    """``ScriptedReplicaSet``'s wire: mockupdb calls ``_handle`` for every request, on
    the connection's own thread; the handlers read and write the server's state under
    its condition (``_cond``)."""

    @contextlib.contextmanager
    def _without_server_lock(self) -> Iterator[None]:
        """Let mockupdb serve other connections while this one's command runs.

        mockupdb calls every handler holding one server-wide lock, so a slow command (a
        big query, an idle getMore) would hold up every client. The handlers guard the
        state with ``self._cond`` instead, and each connection has its own socket.
        """
        unlock = getattr(self._server, "_unlock", None)  # mockupdb 1.8's
        if unlock is None:
            yield
            return
        with unlock():
            yield

    def _handle(self, request: Any) -> bool:
        with self._without_server_lock():
            return self._handle_unlocked(request)

    def _handle_unlocked(self, request: Any) -> bool:
        name = request.command_name or ""
        doc = plain(request.doc)
        lowered = name.lower()
        with self._cond:
            self._recorded.append(RecordedCommand(name, doc))
            faults = self._faults.get(lowered)
            fault = faults.popleft() if faults else None
            if isinstance(fault, CommandError) and lowered == "getmore":
                self._cursors.pop(int(doc.get("getMore", 0)), None)
        if fault is HANGUP:
            return request.hangup()
        try:
            if isinstance(fault, CommandError):
                raise fault
            handler = self._handlers.get(lowered)
            if handler is not None:
                reply = handler(self, doc)
            elif lowered in WRITE_COMMANDS:
                with self._cond:
                    reply = WRITE_COMMANDS[lowered](self._log, doc)
                    reply["operationTime"] = to_timestamp(self._log.last_position)
                    self._cond.notify_all()  # idle change streams see the writes now
            else:
                raise CommandError(59, f"no such command: '{name}'")
        except CommandError as error:
            return request.command_err(**error.reply_fields())
        except Exception as exc:
            # The traceback (with this machine's file paths) stays here: logged once and
            # kept for the tests; the client gets a short message naming no file.
            logger.exception("ScriptedReplicaSet: %r failed with an internal error", name)
            with self._cond:
                self._internal_errors.append(traceback.format_exc())
            errmsg = (
                f"ScriptedReplicaSet internal error in {name!r} ({type(exc).__name__}); "
                "the server's log has the details"
            )
            return request.command_err(code=1, errmsg=errmsg, codeName="InternalError")
        return self._send(request, reply)

    def _send(self, request: Any, reply: dict[str, Any]) -> bool:
        reply["ok"] = 1
        if isinstance(request, self._mockupdb.OpMsg) and not self._verbose:
            # Request.replies() formats a repr of every reply for its log even when not
            # verbose: ~4 ms per 101-event batch, most of the cost of a bulk read.
            message = self._mockupdb.OpMsgReply(reply)
            request._client.sendall(message.reply_bytes(request))
            return True
        return request.ok(reply)

    def _hello(self, doc: dict[str, Any]) -> dict[str, Any]:
        return hello_reply(
            doc, set_name=self.set_name, address=self.address, election_id=self._election_id
        )

    def _ping(self, doc: dict[str, Any]) -> dict[str, Any]:
        return {}

    def _build_info(self, doc: dict[str, Any]) -> dict[str, Any]:
        return build_info_reply()

    def _kill_cursors(self, doc: dict[str, Any]) -> dict[str, Any]:
        ids = [int(cursor_id) for cursor_id in doc.get("cursors", [])]
        with self._cond:
            self._killed.extend(ids)
            killed = [i for i in ids if self._cursors.pop(i, None) is not None]
        return {
            "cursorsKilled": [Int64(i) for i in killed],
            "cursorsNotFound": [Int64(i) for i in ids if i not in killed],
            "cursorsAlive": [],
            "cursorsUnknown": [],
        }

    def _find(self, doc: dict[str, Any]) -> dict[str, Any]:
        db, coll = doc.get("$db", "test"), doc.get("find")
        if (db, coll) != ("local", "oplog.rs"):
            return self._find_documents(doc)
        # The oplog: only its first or last entry (how a stream finds its history).
        batch: list[dict[str, Any]] = []
        if abs(int(doc.get("limit") or 0)) == 1:
            natural = (doc.get("sort") or {"$natural": 1}).get("$natural")
            with self._cond:
                first = (self._start_seconds, 1)
                if natural in (1, -1):
                    position = self._log.oldest if natural == 1 else self._log.last_position
                    batch = [oplog_entry(to_timestamp(position), first=position == first)]
                now = to_timestamp(self._log.last_position)
            if batch and doc.get("filter") and not compile_filter(doc["filter"])(batch[0]):
                batch = []
            batch = [project(entry, doc.get("projection")) for entry in batch]
        else:
            with self._cond:
                now = to_timestamp(self._log.last_position)
        cursor = {"firstBatch": batch, "id": Int64(0), "ns": f"{db}.{coll}"}
        return {"cursor": cursor, "operationTime": now}

    def _find_documents(self, doc: dict[str, Any]) -> dict[str, Any]:
        query = parse_find(doc)
        ns = f"{query.cursor.db}.{query.cursor.coll}"
        with self._cond:
            snapshot = query.cursor.snapshot(self._log)
        query.cursor.refresh(snapshot)  # filtering and sorting hold no lock
        with self._cond:
            batch, exhausted = query.cursor.next_batch(self._log, query.first_batch)
            reply = self._open_read_cursor(query.cursor, batch, exhausted, query.single_batch, ns)
            return self._with_read_concern(doc, reply)

    def _open_read_cursor(
        self,
        reader: DocumentCursor | ResultCursor,
        batch: list[dict[str, Any]],
        exhausted: bool,
        single_batch: bool,
        ns: str,
    ) -> dict[str, Any]:
        """The reply to a find / aggregate; keeps the cursor unless it is done. Locked."""
        cursor_id = 0
        if not exhausted and not single_batch:
            cursor_id = self._new_cursor_id()
            self._cursors[cursor_id] = ReadCursor(reader, ns)
        cursor = {"firstBatch": batch, "id": Int64(cursor_id), "ns": ns}
        return {"cursor": cursor, "operationTime": to_timestamp(self._log.last_position)}

    def _with_read_concern(self, doc: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
        """Accept any readConcern; a snapshot read gets the atClusterTime drivers expect."""
        read_concern = doc.get("readConcern")
        if isinstance(read_concern, Mapping) and read_concern.get("level") == "snapshot":
            at = read_concern.get("atClusterTime")
            reply["cursor"]["atClusterTime"] = (
                at if isinstance(at, Timestamp) else reply["operationTime"]
            )
        return reply

    def _count(self, doc: dict[str, Any]) -> dict[str, Any]:
        query = parse_count(doc)
        with self._cond:
            documents = list(self._log.documents.get((query.db, query.coll), {}).values())
            now = to_timestamp(self._log.last_position)
        # Stored documents are replaced by writes, never changed in place: the count
        # reads them without the lock, so a slow one holds up no other client.
        return {"n": query.count(documents), "operationTime": now}

    def _collection_aggregate(self, doc: dict[str, Any]) -> dict[str, Any]:
        db, coll = doc.get("$db", "test"), doc.get("aggregate")
        if not isinstance(coll, str):
            raise CommandError(
                115,
                "ScriptedReplicaSet answers a database or cluster aggregate only with "
                "$changeStream as its first stage",
            )
        for option in ("explain", "collation", "let"):
            if doc.get(option):
                raise CommandError(
                    2, f"ScriptedReplicaSet does not model the aggregate option {option!r}"
                )
        stages = compile_pipeline(doc.get("pipeline") or [])
        cursor_options = doc.get("cursor") or {}
        batch_size = cursor_options.get("batchSize")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 0):
            raise CommandError(51024, "BSON field 'batchSize' value must be >= 0")
        with self._cond:
            documents = list(self._log.documents.get((db, coll), {}).values())
        reader = ResultCursor(run_stages(documents, stages))  # without the lock, as a count
        with self._cond:
            first = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
            batch, exhausted = reader.next_batch(self._log, first)
            reply = self._open_read_cursor(reader, batch, exhausted, False, f"{db}.{coll}")
            return self._with_read_concern(doc, reply)

    def _aggregate(self, doc: dict[str, Any]) -> dict[str, Any]:
        pipeline = doc.get("pipeline")
        first_stage = pipeline[0] if isinstance(pipeline, list) and pipeline else None
        if not (isinstance(first_stage, Mapping) and "$changeStream" in first_stage):
            return self._collection_aggregate(doc)
        view, ns, stage = parse_change_stream(doc)
        cursor_options = doc.get("cursor") or {}
        batch_size = cursor_options.get("batchSize")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 0):
            raise CommandError(51024, "BSON field 'batchSize' value must be >= 0")
        limit = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
        with self._cond:
            start = self._log.start_position(stage)
            batch, after, invalidated = self._log.scan(start, view, limit)
            cursor_id = 0
            if not invalidated:
                cursor_id = self._new_cursor_id()
                self._cursors[cursor_id] = StreamCursor(view, after, batch_size, ns)
            now = to_timestamp(self._log.last_position)
        cursor = {
            "firstBatch": batch,
            "postBatchResumeToken": make_token(after, invalidate=invalidated),
            "id": Int64(cursor_id),
            "ns": ns,
        }
        return {"cursor": cursor, "operationTime": now}

    def _new_cursor_id(self) -> int:
        while True:
            cursor_id = random.randrange(1, 2**62)
            if cursor_id not in self._cursors:
                return cursor_id

    def _get_more(self, doc: dict[str, Any]) -> dict[str, Any]:
        cursor_id = int(doc["getMore"])
        with self._cond:
            cursor = self._cursors.get(cursor_id)
            reader = cursor.reader if isinstance(cursor, ReadCursor) else None
            snapshot = reader.snapshot(self._log) if isinstance(reader, DocumentCursor) else None
        if isinstance(reader, DocumentCursor):
            reader.refresh(snapshot)  # a find's re-read after writes holds no lock
        with self._cond:
            cursor = self._cursors.get(cursor_id)
            if cursor is None:
                raise CommandError(43, f"cursor id {cursor_id} not found")
            if isinstance(cursor, ReadCursor):
                return self._read_more(cursor_id, cursor, doc)
            return self._stream_more(cursor_id, cursor, doc)

    def _read_more(self, cursor_id: int, cursor: ReadCursor, doc: dict[str, Any]) -> dict[str, Any]:
        """getMore on a find / aggregate cursor: the next documents, id 0 once done. Locked.

        Without a batchSize the batch is as large as fits in 16 MiB, as on the server.
        """
        size = doc.get("batchSize")
        if size is not None and (not isinstance(size, int) or size < 0):
            raise CommandError(51024, "BSON field 'batchSize' value must be >= 0")
        batch, exhausted = cursor.reader.next_batch(self._log, size or None)
        if exhausted:
            del self._cursors[cursor_id]
        reply_cursor = {
            "nextBatch": batch,
            "id": Int64(0 if exhausted else cursor_id),
            "ns": cursor.ns,
        }
        return {"cursor": reply_cursor, "operationTime": to_timestamp(self._log.last_position)}

    def _stream_more(
        self, cursor_id: int, cursor: StreamCursor, doc: dict[str, Any]
    ) -> dict[str, Any]:
        """getMore on a change stream: waits up to idle_wait for events. Locked."""
        max_time_ms = doc.get("maxTimeMS")
        wait = self.idle_wait if max_time_ms is None else min(self.idle_wait, max_time_ms / 1000)
        deadline = time.monotonic() + wait
        limit = doc.get("batchSize") or cursor.batch_size or DEFAULT_BATCH_SIZE
        while True:
            try:
                self._log.check_retained(cursor.after)
                batch, cursor.after, invalidated = self._log.scan(cursor.after, cursor.view, limit)
            except CommandError:
                self._cursors.pop(cursor_id, None)
                raise
            if batch or invalidated:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                # The server's periodic no-op write: an idle stream's PBRT still moves.
                cursor.after = self._log.tick()
                break
            self.idle_waiters += 1
            try:
                if self._cond.wait(remaining):
                    self.idle_wakeups += 1
            finally:
                self.idle_waiters -= 1
            if self._cursors.get(cursor_id) is not cursor:  # reset() while waiting
                raise CommandError(43, f"cursor id {cursor_id} not found")
        if invalidated:
            del self._cursors[cursor_id]
        now = to_timestamp(self._log.last_position)
        reply_cursor = {
            "nextBatch": batch,
            "postBatchResumeToken": make_token(cursor.after, invalidate=invalidated),
            "id": Int64(0 if invalidated else cursor_id),
            "ns": cursor.ns,
        }
        return {"cursor": reply_cursor, "operationTime": now}

    _handlers: dict[str, Any] = {
        "hello": _hello,
        "ismaster": _hello,
        "ping": _ping,
        "buildinfo": _build_info,
        "endsessions": _ping,
        "killcursors": _kill_cursors,
        "find": _find,
        "count": _count,
        "aggregate": _aggregate,
        "getmore": _get_more,
    }
