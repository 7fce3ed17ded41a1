"""A stateful, wire-level fake of a single-node MongoDB replica set, for change streams.

:class:`ScriptedReplicaSet` listens on localhost (through ``mockupdb``) and answers the
real ``pymongo`` driver: the handshake of a replica-set primary, ``aggregate`` /
``getMore`` on ``$changeStream`` cursors served from an event log the test appends to,
and the reads an initial sync makes of the current documents (``find`` with its
cursors, ``count``, ``count_documents``' aggregate). Resume tokens,
postBatchResumeTokens, history loss, invalidation and error labels follow what a
MongoDB 6.0+ server does, so ``collection.watch()`` runs the driver's real code paths
(auto-resume, retryable reads, PBRT tracking) against it.

It is a fake for tests and demos, not a database: reads go through a small evaluator
(see :mod:`._scripted_query`), there is no storage and no writes from clients. See
``ScriptedReplicaSet`` for what it models.

Run it as a process (for crash tests)::

    python -m flowwarden_django.testkit.scripted_mongo --port 0 --events 100 --feed-rate 50

``--seed N`` first stores N documents without events (``_id``/``seq`` 1..N), as a
collection that existed before the stream's history; the events then continue at N+1.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import logging
import random
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import FrameType
from typing import Any

try:
    from bson import Int64, ObjectId, Timestamp
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "flowwarden_django.testkit.scripted_mongo needs pymongo and mockupdb: "
        'pip install "flowwarden-django[testkit]"'
    ) from exc

from ._scripted_events import (
    EventLog,
    Position,
    StreamView,
    make_token,
    parse_change_stream,
    parse_token,
    to_timestamp,
)
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
from ._scripted_wire import (
    CommandError,
    build_info_reply,
    hello_reply,
    oplog_entry,
    plain,
    project,
)
from ._scripted_writes import WRITE_COMMANDS, field_names

__all__ = ["RecordedCommand", "ScriptedReplicaSet", "main"]

DEFAULT_BATCH_SIZE = DEFAULT_FIRST_BATCH  # 101, a server's first-batch default
#: Tracebacks of handler bugs kept for :attr:`ScriptedReplicaSet.internal_errors`.
MAX_INTERNAL_ERRORS = 100
_HANGUP = object()

logger = logging.getLogger("flowwarden_django.testkit.scripted_mongo")


@dataclass(frozen=True)
class RecordedCommand:
    """One command the server received: its name as sent, its document, when."""

    name: str
    doc: dict[str, Any]
    at: float = field(default_factory=time.monotonic)


@dataclass
class _Cursor:
    view: StreamView
    after: Position
    batch_size: int | None
    ns: str


@dataclass
class _ReadCursor:
    """A find or collection-aggregate cursor (no resume tokens, never waits)."""

    reader: DocumentCursor | ResultCursor
    ns: str


def _position_of(point: Timestamp | Mapping[str, Any]) -> Position:
    if isinstance(point, Timestamp):
        return (point.time, point.inc)
    return parse_token(point)[0]


def _seconds(when: datetime | float | None) -> int:
    if when is None:
        return int(time.time())
    if isinstance(when, datetime):
        return int((when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp())
    return int(when)


class ScriptedReplicaSet:
    """A fake single-node replica-set primary serving change streams, for tests and demos.

    It is not a database. The test appends change events with :meth:`insert`,
    :meth:`update`, :meth:`replace`, :meth:`delete`, :meth:`drop_collection`,
    :meth:`rename_collection` and :meth:`insert_many`; the server keeps them in one
    ordered log (plus the current documents, for ``updateLookup``, pre-images and
    reads) and serves ``collection.watch()``, ``database.watch()`` and
    ``client.watch()`` from it:

    * every event has a strictly increasing position (``clusterTime``) and a resume
      token ``{"_data": "82" + 8 hex + 8 hex + suffix}`` that sorts like the position;
    * ``resumeAfter`` / ``startAfter`` / ``startAtOperationTime`` / "now" starts,
      ``fullDocument`` and ``fullDocumentBeforeChange``, and ``$match`` (equality,
      ``$in``, ``$nin``, ``$exists``, ``$and``, ``$or``...); other stages are refused;
    * postBatchResumeTokens as a server computes them, including past filtered events,
      and idle ``getMore`` polls that advance to a fresh no-op position;
    * :meth:`lose_history` (ChangeStreamHistoryLost, 286), invalidate on drop/rename,
      injected errors with the labels a 4.4+ server attaches, and dropped connections.

    :meth:`seed` stores documents that existed before the stream's history (no events).
    The current documents are readable with the real driver, for an initial sync:

    * ``find``: ``filter`` (the ``$match`` subset plus ``$gt``/``$gte``/``$lt``/``$lte``),
      ``sort`` on one or more fields in BSON order (``_id`` breaks ties; no sort or
      ``$natural``: insertion order), ``projection`` (1/0 fields), ``skip``, ``limit``,
      ``batchSize``, ``singleBatch``, continued by ``getMore`` and closed by
      ``killCursors``. A find cursor is a *position in its sort order*, not a snapshot:
      every batch reads the documents as they are then and returns those after the last
      one returned, so a document inserted ahead of the position is seen, one deleted
      before its batch is not, and each comes in its current version (details in
      :mod:`._scripted_query`). ``local.oplog.rs`` answers only its first / last entry.
    * ``count`` (``estimated_document_count()``, with ``query``/``skip``/``limit``) and
      collection ``aggregate`` pipelines of ``$match``, ``$group`` (``$sum``,
      ``$count``), ``$sort``, ``$skip``, ``$limit``, ``$project`` and ``$count``, which is
      what ``count_documents()`` sends. Other stages fail with code 40324. Aggregate
      results are computed when the aggregate runs and then paged from that list.
    * ``readConcern`` is accepted and ignored (reads see the current documents); with
      ``level: snapshot`` the cursor reply carries ``atClusterTime`` (the requested one,
      or the current cluster time), which pymongo's snapshot sessions require.

    Use it as a context manager or with :meth:`start` / :meth:`stop`; :meth:`reset`
    clears everything between tests (``stop()`` takes about a second). Every command
    received is recorded for assertions (:meth:`commands`). Each connection is served
    on a thread of its own and reads evaluate their filters outside the server's lock,
    so a slow command holds up no other client; an idle ``getMore`` waits at most
    ``idle_wait`` seconds (or its ``maxTimeMS``, if shorter) for new events.

    The cluster clock runs with the wall clock from ``start_time`` (default: now), as
    a live replica set's does: events, idle ``getMore`` no-ops and, when nothing was
    written for ``noop_interval`` seconds, the ``operationTime`` of replies take the
    current second; positions still only ever increase, and every event gets a newer one
    than the last. ``follow_wall_clock=False`` keeps the clock where events,
    :meth:`advance_clock` and :meth:`set_clock` put it (for tests that pin times).
    """

    def __init__(
        self,
        *,
        port: int = 0,
        set_name: str = "rs0",
        start_time: datetime | float | None = None,
        idle_wait: float = 0.02,
        max_recorded: int = 100_000,
        verbose: bool = False,
        follow_wall_clock: bool = True,
    ) -> None:
        self.set_name = set_name
        self.idle_wait = idle_wait
        self._requested_port = port
        self._verbose = verbose
        self._start_time = start_time
        self._follow_wall_clock = follow_wall_clock
        self._start_seconds = _seconds(start_time)
        self._cond = threading.Condition()
        self._election_id = ObjectId()
        self._server: Any = None
        self._mockupdb: Any = None
        self._port = 0
        self._max_recorded = max_recorded
        #: Idle change-stream getMore commands waiting for events now, and how many of the
        #: waits so far a write ended early (rather than the time running out).
        self.idle_waiters = 0
        self.idle_wakeups = 0
        self._init_state()

    def _init_state(self) -> None:
        self._start_seconds = _seconds(self._start_time)
        self._log = EventLog(self._start_seconds, wall_clock=self._wall_clock())
        self._cursors: dict[int, _Cursor | _ReadCursor] = {}
        self._killed: list[int] = []
        self._faults: dict[str, deque[Any]] = {}
        self._recorded: deque[RecordedCommand] = deque(maxlen=self._max_recorded)
        self._internal_errors: deque[str] = deque(maxlen=MAX_INTERNAL_ERRORS)

    def _wall_clock(self) -> Callable[[], float] | None:
        """The clock the cluster time keeps up with: the wall clock's pace from the
        start time (monotonic, so a wall-clock step back does not show), or None."""
        if not self._follow_wall_clock:
            return None
        base = time.time() if self._start_time is None else float(self._start_seconds)
        origin = time.monotonic()
        return lambda: base + (time.monotonic() - origin)

    # -- lifecycle ------------------------------------------------------------------------- #
    def start(self) -> ScriptedReplicaSet:
        """Bind the port and start answering. Returns ``self``."""
        try:
            import mockupdb
        except ImportError as exc:
            raise ImportError(
                "ScriptedReplicaSet needs mockupdb: pip install mockupdb==1.8.1 "
                '(or pip install "flowwarden-django[testkit]")'
            ) from exc
        if self._server is not None:
            raise RuntimeError("ScriptedReplicaSet is already running")
        server = mockupdb.MockupDB(port=self._requested_port or None, verbose=self._verbose)
        self._port = server.run()
        server.autoresponds(self._handle)
        self._server = server
        self._mockupdb = mockupdb
        return self

    def stop(self) -> None:
        """Close the listening socket and every connection (takes about a second)."""
        server, self._server = self._server, None
        if server is not None:
            with self._cond:
                self._cond.notify_all()
            server.stop()

    def __enter__(self) -> ScriptedReplicaSet:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound TCP port (after :meth:`start`)."""
        if not self._port:
            raise RuntimeError("ScriptedReplicaSet is not started")
        return self._port

    @property
    def address(self) -> str:
        """``localhost:PORT``, the member name advertised in ``hello``."""
        return f"localhost:{self.port}"

    @property
    def uri(self) -> str:
        """``mongodb://localhost:PORT/?replicaSet=rs0``."""
        return f"mongodb://{self.address}/?replicaSet={self.set_name}"

    def reset(self) -> None:
        """Forget events, documents, cursors, injected faults and recorded commands.

        The clock restarts at ``start_time`` (now, when none was given); connections
        stay open.
        """
        with self._cond:
            self._init_state()
            self._cond.notify_all()

    # -- event log ------------------------------------------------------------------------- #
    def _event(self, entry: Any) -> dict[str, Any]:
        return copy.deepcopy(self._log.render(entry))

    def insert(self, db: str, coll: str, doc: Mapping[str, Any]) -> dict[str, Any]:
        """Insert *doc* (``_id`` generated if missing); returns the change event."""
        with self._cond:
            event = self._event(self._log.insert(db, coll, doc))
            self._cond.notify_all()
        return event

    def seed(self, db: str, coll: str, docs: Iterable[Mapping[str, Any]]) -> list[Any]:
        """Store documents that existed before the stream's history: no change events.

        They are returned by ``find`` / ``count`` / aggregates, by ``updateLookup``
        and as pre-images of later events, but no stream ever sees them inserted, and
        the cluster clock does not move. ``_id`` is generated when missing; a duplicate
        ``_id`` raises ``ValueError`` and stores nothing. Returns the ``_id`` values.
        Fast enough for bulk setups (10,000 small documents take tens of milliseconds).
        """
        with self._cond:
            return self._log.seed(db, coll, docs)

    def insert_many(
        self, db: str, coll: str, docs: Iterable[Mapping[str, Any]]
    ) -> list[dict[str, str]]:
        """Insert many documents as one insert event each; returns their resume tokens."""
        with self._cond:
            positions = self._log.insert_many(db, coll, docs)
            self._cond.notify_all()
        return [make_token(position) for position in positions]

    def update(
        self,
        db: str,
        coll: str,
        _id: Any,
        set_fields: Mapping[str, Any] | None = None,
        unset_fields: Iterable[str] | None = None,
    ) -> dict[str, Any] | None:
        """``$set``/``$unset`` on a stored document; returns the event, None if nothing changed.

        Like the server, an update that changes nothing writes no oplog entry.
        *set_fields* are field paths and values, not an update document: a key like
        ``"$set"`` raises ``ValueError`` (it would be stored as a field of that name).
        """
        operators = field_names(set_fields or {}) + field_names(unset_fields or ())
        if operators:
            raise ValueError(
                f"update() takes field paths, not an update document: {operators[0]!r} "
                "would be stored as a field. Pass set_fields={'path': value} and "
                "unset_fields=['path'] (or write through the driver: update_one works)."
            )
        with self._cond:
            entry = self._log.update(db, coll, _id, set_fields, unset_fields)
            self._cond.notify_all()
            return None if entry is None else self._event(entry)

    def replace(self, db: str, coll: str, doc: Mapping[str, Any]) -> dict[str, Any]:
        """Replace the stored document with ``doc["_id"]``; returns the change event."""
        with self._cond:
            event = self._event(self._log.replace(db, coll, doc))
            self._cond.notify_all()
        return event

    def delete(self, db: str, coll: str, _id: Any) -> dict[str, Any]:
        """Delete a stored document; returns the change event."""
        with self._cond:
            event = self._event(self._log.delete(db, coll, _id))
            self._cond.notify_all()
        return event

    def drop_collection(self, db: str, coll: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """Drop a collection: a ``drop`` event, then ``invalidate`` for its streams."""
        with self._cond:
            entries = self._log.drop(db, coll)
            self._cond.notify_all()
            return self._event(entries[0]), self._event(entries[1])

    def rename_collection(
        self, db: str, coll: str, new_coll: str
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Rename a collection: a ``rename`` event, then ``invalidate`` for its streams."""
        with self._cond:
            entries = self._log.rename(db, coll, new_coll)
            self._cond.notify_all()
            return self._event(entries[0]), self._event(entries[1])

    def events(self, db: str | None = None, coll: str | None = None) -> list[dict[str, Any]]:
        """The retained events (default rendering), optionally for one db / collection."""
        with self._cond:
            return [
                self._event(entry)
                for entry in self._log.entries
                if (db is None or entry.db == db) and (coll is None or entry.coll == coll)
            ]

    def document(self, db: str, coll: str, _id: Any) -> dict[str, Any] | None:
        """The current stored document with *_id*, or None."""
        with self._cond:
            return copy.deepcopy(self._log.get(db, coll, _id))

    def documents(self, db: str, coll: str) -> list[dict[str, Any]]:
        """Copies of the current stored documents of ``db.coll``, in insertion order."""
        with self._cond:
            stored = list(self._log.documents.get((db, coll), {}).values())
        return [copy.deepcopy(doc) for doc in stored]

    # -- clock and history ----------------------------------------------------------------- #
    @property
    def cluster_time(self) -> Timestamp:
        """The newest position issued (an event or an idle no-op)."""
        with self._cond:
            return to_timestamp(self._log.last_position)

    @property
    def data_version(self) -> int:
        """A number that changes with every write to the stored documents (an event,
        a seed), not with the clock: how a watcher tells that writes arrived."""
        with self._cond:
            return self._log.version

    @property
    def oldest_retained(self) -> Timestamp:
        """The oldest position still in the log: the oplog's first entry."""
        with self._cond:
            return to_timestamp(self._log.oldest)

    def advance_clock(self, seconds: int) -> Timestamp:
        """Move the cluster clock forward by whole *seconds*; returns the new time."""
        with self._cond:
            self._log.advance(int(seconds))
            return to_timestamp(self._log.last_position)

    def set_clock(self, when: datetime | float) -> Timestamp:
        """Move the cluster clock to *when* (never backwards); returns the new time."""
        with self._cond:
            self._log.set_time(_seconds(when))
            return to_timestamp(self._log.last_position)

    def lose_history(self, keep_last: int = 0) -> Timestamp:
        """Truncate the log to its newest *keep_last* events; returns the oldest retained time.

        With ``keep_last=0`` only the newest position survives. Resuming from anything
        older, or a ``getMore`` on a cursor positioned before it, fails with 286.
        """
        with self._cond:
            oldest = self._log.keep_last(keep_last)
            self._cond.notify_all()
            return to_timestamp(oldest)

    def truncate_before(self, position: Timestamp | Mapping[str, Any]) -> Timestamp:
        """Forget everything before *position* (a ``Timestamp`` or a resume token)."""
        with self._cond:
            oldest = self._log.truncate_before(_position_of(position))
            self._cond.notify_all()
            return to_timestamp(oldest)

    # -- faults ---------------------------------------------------------------------------- #
    def fail_next(
        self, command: str, code: int, times: int = 1, *, errmsg: str | None = None
    ) -> None:
        """Fail the next *times* *command* requests (e.g. ``"getMore"``) with *code*.

        The reply carries the codeName and the change-stream error labels a 4.4+ server
        would attach. A failed ``getMore`` destroys its cursor, as on the server. Note
        that pymongo retries a failed ``aggregate`` once on retryable codes.
        """
        error = CommandError.injected(command, code, errmsg)
        with self._cond:
            self._faults.setdefault(command.lower(), deque()).extend([error] * times)

    def hang_up_next(self, command: str, times: int = 1) -> None:
        """Close the connection instead of answering the next *times* *command* requests."""
        with self._cond:
            self._faults.setdefault(command.lower(), deque()).extend([_HANGUP] * times)

    # -- inspection ------------------------------------------------------------------------ #
    def commands(self, name: str | None = None) -> list[dict[str, Any]]:
        """Documents of the commands received, all or those named *name* (any case)."""
        with self._cond:
            return [
                copy.deepcopy(recorded.doc)
                for recorded in self._recorded
                if name is None or recorded.name.lower() == name.lower()
            ]

    @property
    def recorded(self) -> list[RecordedCommand]:
        """Every command received, in order (at most ``max_recorded``)."""
        with self._cond:
            return list(self._recorded)

    @property
    def killed_cursors(self) -> list[int]:
        """Every cursor id the driver sent in ``killCursors``, in order."""
        with self._cond:
            return list(self._killed)

    @property
    def open_cursors(self) -> list[int]:
        """Ids of the cursors the server still holds (change streams, finds, aggregates)."""
        with self._cond:
            return list(self._cursors)

    @property
    def internal_errors(self) -> list[str]:
        """Tracebacks of handler bugs, the newest :data:`MAX_INTERNAL_ERRORS` (each was
        logged once and answered with a short InternalError, code 1, naming no file)."""
        with self._cond:
            return list(self._internal_errors)

    # -- wire ------------------------------------------------------------------------------ #
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
        if fault is _HANGUP:
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
            self._cursors[cursor_id] = _ReadCursor(reader, ns)
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
                self._cursors[cursor_id] = _Cursor(view, after, batch_size, ns)
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
            reader = cursor.reader if isinstance(cursor, _ReadCursor) else None
            snapshot = reader.snapshot(self._log) if isinstance(reader, DocumentCursor) else None
        if isinstance(reader, DocumentCursor):
            reader.refresh(snapshot)  # a find's re-read after writes holds no lock
        with self._cond:
            cursor = self._cursors.get(cursor_id)
            if cursor is None:
                raise CommandError(43, f"cursor id {cursor_id} not found")
            if isinstance(cursor, _ReadCursor):
                return self._read_more(cursor_id, cursor, doc)
            return self._stream_more(cursor_id, cursor, doc)

    def _read_more(
        self, cursor_id: int, cursor: _ReadCursor, doc: dict[str, Any]
    ) -> dict[str, Any]:
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

    def _stream_more(self, cursor_id: int, cursor: _Cursor, doc: dict[str, Any]) -> dict[str, Any]:
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


def main(argv: list[str] | None = None) -> int:
    """Serve a ScriptedReplicaSet until SIGTERM/SIGINT; print ``READY <uri>`` once listening."""
    parser = argparse.ArgumentParser(
        prog="python -m flowwarden_django.testkit.scripted_mongo", description=main.__doc__
    )
    parser.add_argument("--port", type=int, default=0, help="TCP port (0: pick a free one)")
    parser.add_argument("--events", type=int, default=0, help="insert events logged up front")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="documents stored up front without events (_id/seq 1..N; events follow on)",
    )
    parser.add_argument("--db", default="app", help="database of the seeded and logged documents")
    parser.add_argument(
        "--coll", default="orders", help="collection of the seeded and logged documents"
    )
    parser.add_argument(
        "--feed-rate", type=float, default=0.0, help="keep inserting this many events per second"
    )
    parser.add_argument("--set-name", default="rs0", help="replica set name in the URI")
    parser.add_argument(
        "--idle-wait", type=float, default=0.02, help="longest wait of an idle getMore (s)"
    )
    parser.add_argument("--verbose", action="store_true", help="let mockupdb log every message")
    args = parser.parse_args(argv)

    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    server = ScriptedReplicaSet(
        port=args.port, set_name=args.set_name, idle_wait=args.idle_wait, verbose=args.verbose
    )
    with server:
        seeded = max(args.seed, 0)
        server.seed(args.db, args.coll, ({"_id": n, "seq": n} for n in range(1, seeded + 1)))
        last = seeded + args.events
        server.insert_many(
            args.db, args.coll, ({"_id": n, "seq": n} for n in range(seeded + 1, last + 1))
        )
        print(f"READY {server.uri}", flush=True)
        feeder = None
        if args.feed_rate > 0:
            feeder = threading.Thread(
                target=_feed,
                args=(server, args.db, args.coll, last + 1, args.feed_rate, stopping),
                daemon=True,
            )
            feeder.start()
        while not stopping.wait(0.1):
            pass
        if feeder is not None:
            feeder.join(5)
    return 0


def _feed(
    server: ScriptedReplicaSet,
    db: str,
    coll: str,
    first: int,
    rate: float,
    stopping: threading.Event,
) -> None:
    """Append inserts at *rate* per second (in small bursts) until *stopping* is set."""
    started, sent = time.monotonic(), 0
    while not stopping.wait(0.01):
        due = int((time.monotonic() - started) * rate) - sent
        if due > 0:
            seqs = range(first + sent, first + sent + due)
            server.insert_many(db, coll, ({"_id": n, "seq": n} for n in seqs))
            sent += due


if __name__ == "__main__":
    sys.exit(main())
