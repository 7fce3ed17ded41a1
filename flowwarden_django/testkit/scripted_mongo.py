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

import copy
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

try:
    from bson import ObjectId, Timestamp
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "flowwarden_django.testkit.scripted_mongo needs pymongo and mockupdb: "
        'pip install "flowwarden-django[testkit]"'
    ) from exc

from ._scripted_cli import serve
from ._scripted_commands import DEFAULT_BATCH_SIZE as DEFAULT_BATCH_SIZE
from ._scripted_commands import HANGUP, CommandHandlersMixin, ReadCursor, StreamCursor
from ._scripted_commands import MAX_INTERNAL_ERRORS as MAX_INTERNAL_ERRORS
from ._scripted_commands import RecordedCommand as RecordedCommand
from ._scripted_commands import logger as logger
from ._scripted_events import EventLog, Position, make_token, parse_token, to_timestamp
from ._scripted_wire import CommandError
from ._scripted_writes import field_names

__all__ = ["RecordedCommand", "ScriptedReplicaSet", "main"]


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


class ScriptedReplicaSet(CommandHandlersMixin):
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
        self._cursors: dict[int, StreamCursor | ReadCursor] = {}
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
            self._faults.setdefault(command.lower(), deque()).extend([HANGUP] * times)

    # -- inspection ------------------------------------------------------------------------ #
    def commands(self, name: str | None = None) -> list[dict[str, Any]]:
        """Documents of the commands received, all or those named *name* (any case)."""
        with self._cond:
            return [
                copy.deepcopy(recorded.doc)
                for recorded in self._recorded
                if name is None or recorded.name.lower() == name.lower()
            ]

    def _copy_of(self, attribute: str) -> list[Any]:
        """A list of what the collection *attribute* holds, taken under the server's lock."""
        with self._cond:
            return list(getattr(self, attribute))

    @property
    def recorded(self) -> list[RecordedCommand]:
        """Every command received, in order (at most ``max_recorded``)."""
        return self._copy_of("_recorded")

    @property
    def killed_cursors(self) -> list[int]:
        """Every cursor id the driver sent in ``killCursors``, in order."""
        return self._copy_of("_killed")

    @property
    def open_cursors(self) -> list[int]:
        """Ids of the cursors the server still holds (change streams, finds, aggregates)."""
        return self._copy_of("_cursors")

    @property
    def internal_errors(self) -> list[str]:
        """Tracebacks of handler bugs, the newest :data:`MAX_INTERNAL_ERRORS` (each was
        logged once and answered with a short InternalError, code 1, naming no file)."""
        return self._copy_of("_internal_errors")


def main(argv: list[str] | None = None) -> int:
    """Serve a ScriptedReplicaSet until SIGTERM/SIGINT; print ``READY <uri>`` once listening."""
    return serve(ScriptedReplicaSet, argv, main.__doc__)


if __name__ == "__main__":
    sys.exit(main())
