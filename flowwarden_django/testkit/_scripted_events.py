"""The event log behind :class:`.scripted_mongo.ScriptedReplicaSet`, and its streams.

One oplog-like list of entries ordered by position, the current documents of every
collection (for ``updateLookup``, pre-images and the ``find`` / ``count`` /
``aggregate`` reads of :mod:`._scripted_query`), a cluster clock, the parsing of a
change-stream ``aggregate`` and the scan its cursor runs over the log. Nothing in here
locks: the server calls it under its own lock.

Stored documents are never modified in place (an update stores a new dict), so a
reader may hold on to one after the lock is released.

Positions are ``(seconds, increment)`` pairs, the two halves of a BSON ``Timestamp``.
Idle polls "write" no-op positions (they advance the clock but add no entry), so a
position is not necessarily an event.
"""

from __future__ import annotations

import copy
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any

from bson import ObjectId, Timestamp, encode

from ._scripted_match import Predicate, bson_equal, compile_filter
from ._scripted_wire import RESUME_FROM_INVALIDATE_MESSAGE, CommandError

Position = tuple[int, int]

TOKEN_PREFIX = "82"
# Fixed KeyString-looking tails; only the invalidate flag differs between the two.
_EVENT_SUFFIX = "2B022C0100296E5A1004"
_INVALIDATE_SUFFIX = "2B022C0100296F5A1004"
_MAX_INC = 0xFFFFFFFF
#: A live replica set's primary writes a no-op to an idle oplog this often (seconds):
#: mongod's ``periodicNoopIntervalSecs``.
NOOP_INTERVAL = 10.0

FULL_DOCUMENT_MODES = ("default", "updateLookup", "whenAvailable", "required")
BEFORE_CHANGE_MODES = ("off", "whenAvailable", "required")
_STAGE_OPTIONS = frozenset(
    {
        "resumeAfter",
        "startAfter",
        "startAtOperationTime",
        "fullDocument",
        "fullDocumentBeforeChange",
        "allChangesForCluster",
    }
)
# Real options this fake does not model: refused rather than silently ignored.
_UNMODELLED_OPTIONS = frozenset(
    {"showExpandedEvents", "showSystemEvents", "showRawUpdateDescription", "allowToRunOnConfigDB"}
)
_INTERNAL_DBS = ("admin", "config", "local")


def make_token(position: Position, *, invalidate: bool = False) -> dict[str, str]:
    """The resume token of *position*: ``{"_data": "82" + 8 hex + 8 hex + suffix}``.

    Uppercase fixed-width hex, so tokens sort lexically in position order.
    """
    suffix = _INVALIDATE_SUFFIX if invalidate else _EVENT_SUFFIX
    return {"_data": f"{TOKEN_PREFIX}{position[0]:08X}{position[1]:08X}{suffix}"}


def parse_token(token: Any) -> tuple[Position, bool]:
    """The position of a token made by :func:`make_token` and whether it is an invalidate."""
    data = token.get("_data") if isinstance(token, Mapping) else None
    if not isinstance(data, str):
        raise CommandError(9, "Bad resume token: _data of missing or of wrong type")
    data = data.upper()
    suffix = data[18:]
    try:
        position = (int(data[2:10], 16), int(data[10:18], 16))
    except ValueError:
        position = None
    if not data.startswith(TOKEN_PREFIX) or position is None:
        raise CommandError(9, f"resume token string was not a valid hex string: {data!r}")
    if suffix not in (_EVENT_SUFFIX, _INVALIDATE_SUFFIX):
        raise CommandError(260, f"resume token was not issued by this server: {data!r}")
    return position, suffix == _INVALIDATE_SUFFIX


def to_timestamp(position: Position) -> Timestamp:
    """``Timestamp(seconds, increment)`` for *position*."""
    return Timestamp(position[0], position[1])


def before(position: Position) -> Position:
    """The position just before *position* (``startAtOperationTime`` includes its own time)."""
    seconds, inc = position
    return (seconds, inc - 1) if inc > 0 else (seconds - 1, _MAX_INC)


def copy_doc(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A private copy of *doc*; shallow when no value is a container (the common, fast case)."""
    copied = dict(doc)
    for value in copied.values():
        if isinstance(value, dict | list):
            return copy.deepcopy(copied)
    return copied


def _id_key(value: Any) -> Any:
    """A hashable key with the server's ``_id`` identity (1 == 1.0, True != 1)."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("number", value)
    try:
        hash(value)
    except TypeError:
        return ("bson", encode({"v": value}))
    return (type(value).__name__, value)


@dataclass(slots=True)
class LogEntry:
    """One oplog entry that streams can see (events; no-ops are not stored)."""

    pos: Position
    op: str
    db: str
    coll: str
    doc_id: Any = None
    post: dict[str, Any] | None = None
    pre: dict[str, Any] | None = None
    update: dict[str, Any] | None = None
    to: tuple[str, str] | None = None


@dataclass
class StreamView:
    """What one change stream watches and how it renders events."""

    scope: tuple[str, ...]  # ("collection", db, coll) | ("database", db) | ("cluster",)
    full_document: str = "default"
    before_change: str = "off"
    filters: list[Predicate] = field(default_factory=list)

    def sees(self, entry: LogEntry) -> bool:
        """Whether *entry* belongs to this stream (before any ``$match``)."""
        kind = self.scope[0]
        if entry.op == "invalidate":
            return kind == "collection" and self.scope[1:] == (entry.db, entry.coll)
        if kind == "collection":
            return entry.db == self.scope[1] and entry.coll == self.scope[2]
        if kind == "database":
            return entry.db == self.scope[1]
        return entry.db not in ("admin", "config", "local")


class EventLog:
    """Clock, entries and current documents. Not thread-safe: callers hold a lock.

    With *wall_clock* (seconds since the epoch, as ``time.time``) the clock keeps up
    with it: a new position takes the wall clock's second when that is ahead, and
    :attr:`last_position` issues a no-op once the wall clock is *noop_interval* seconds
    ahead (a live primary's periodic no-op). Positions never go back, whatever the
    wall clock does.
    """

    def __init__(
        self,
        start_seconds: int,
        *,
        wall_clock: Callable[[], float] | None = None,
        noop_interval: float = NOOP_INTERVAL,
    ) -> None:
        self._wall_clock = wall_clock
        self._noop_interval = noop_interval
        self._clock: Position = (start_seconds, 0)
        self.entries: list[LogEntry] = []
        self.documents: dict[tuple[str, str], dict[Any, dict[str, Any]]] = {}
        # Record ids, the storage order a collection scan ($natural) follows: a document
        # keeps its id through updates; a re-insert after a delete gets a new, larger one.
        self.records: dict[tuple[str, str], dict[Any, int]] = {}
        self._next_record = 0
        #: Bumped by every change to the stored documents (cursors cache their reads on it).
        self.version = 0
        # Like a fresh replica set, the oplog begins with one no-op ("initiating set").
        self.oldest: Position = self.tick()

    # -- clock ----------------------------------------------------------------------------- #
    @property
    def last_position(self) -> Position:
        """The newest position issued (event or no-op), after the periodic no-op when
        the wall clock is *noop_interval* seconds ahead."""
        if (
            self._wall_clock is not None
            and self._wall_clock() - self._clock[0] >= self._noop_interval
        ):
            self.tick()
        return self._clock

    def tick(self) -> Position:
        """Issue the next position: strictly after the last one, and in the wall
        clock's current second when that is ahead."""
        self._catch_up()
        seconds, inc = self._clock
        if inc >= _MAX_INC:
            seconds, inc = seconds + 1, 0
        self._clock = (seconds, inc + 1)
        return self._clock

    def _catch_up(self) -> None:
        """Move the clock to the wall clock's second when that is ahead."""
        if self._wall_clock is not None:
            now = int(self._wall_clock())
            if now > self._clock[0]:
                self._clock = (now, 0)

    def advance(self, seconds: int) -> None:
        """Move the clock forward by whole *seconds*."""
        if seconds < 0:
            raise ValueError("the cluster clock never goes back")
        if seconds:
            self._clock = (self._clock[0] + seconds, 0)

    def set_time(self, seconds: int) -> None:
        """Move the clock to *seconds* since the epoch (never backwards)."""
        if seconds < self._clock[0]:
            raise ValueError("the cluster clock never goes back")
        self.advance(seconds - self._clock[0])

    # -- writes ---------------------------------------------------------------------------- #
    def _collection(self, db: str, coll: str) -> dict[Any, dict[str, Any]]:
        return self.documents.setdefault((db, coll), {})

    def _append(self, entry: LogEntry) -> LogEntry:
        self.entries.append(entry)
        self.version += 1
        return entry

    def _store_new(self, db: str, coll: str, doc: Mapping[str, Any]) -> dict[str, Any]:
        stored = copy_doc(doc) if "_id" in doc else {"_id": ObjectId(), **copy_doc(doc)}
        documents = self._collection(db, coll)
        key = _id_key(stored["_id"])
        if key in documents:
            raise ValueError(f"E11000 duplicate key: {db}.{coll} already has _id {stored['_id']!r}")
        documents[key] = stored
        self._next_record += 1
        self.records.setdefault((db, coll), {})[key] = self._next_record
        return stored

    def insert(self, db: str, coll: str, doc: Mapping[str, Any]) -> LogEntry:
        """Store *doc* (an ``_id`` is added first when missing) and log an insert."""
        stored = self._store_new(db, coll, doc)
        return self._append(LogEntry(self.tick(), "insert", db, coll, stored["_id"], post=stored))

    def seed(self, db: str, coll: str, docs: Iterable[Mapping[str, Any]]) -> list[Any]:
        """Store documents that existed before the log's history: no entry, no position.

        All or nothing: a duplicate ``_id`` (among *docs* or with a stored document)
        raises ``ValueError`` before anything is stored. Returns the ``_id`` values.
        """
        documents = self.documents.get((db, coll), {})
        prepared: dict[Any, dict[str, Any]] = {}
        for doc in docs:
            stored = copy_doc(doc) if "_id" in doc else {"_id": ObjectId(), **copy_doc(doc)}
            key = _id_key(stored["_id"])
            if key in documents or key in prepared:
                raise ValueError(
                    f"E11000 duplicate key: {db}.{coll} already has _id {stored['_id']!r}"
                )
            prepared[key] = stored
        if prepared:
            first = self._next_record + 1
            self._collection(db, coll).update(prepared)
            self.records.setdefault((db, coll), {}).update(
                zip(prepared, range(first, first + len(prepared)), strict=True)
            )
            self._next_record += len(prepared)
            self.version += 1
        return [stored["_id"] for stored in prepared.values()]

    def record_ids(self, db: str, coll: str) -> dict[Any, int]:
        """The record id of every stored document of ``db.coll``, by ``_id`` key."""
        return self.records.get((db, coll), {})

    def insert_many(self, db: str, coll: str, docs: Iterable[Mapping[str, Any]]) -> list[Position]:
        """Log one insert per document; returns their positions, consecutive ones (one
        write, one moment: the wall clock is read once for the batch)."""
        self._catch_up()
        wall_clock, self._wall_clock = self._wall_clock, None
        try:
            return [self.insert(db, coll, doc).pos for doc in docs]
        finally:
            self._wall_clock = wall_clock

    def get(self, db: str, coll: str, doc_id: Any) -> dict[str, Any] | None:
        """The stored document with *doc_id*, or None."""
        return self.documents.get((db, coll), {}).get(_id_key(doc_id))

    def _existing(self, db: str, coll: str, doc_id: Any) -> dict[str, Any]:
        current = self.get(db, coll, doc_id)
        if current is None:
            raise ValueError(f"{db}.{coll} has no document with _id {doc_id!r}")
        return current

    def update(
        self,
        db: str,
        coll: str,
        doc_id: Any,
        set_fields: Mapping[str, Any] | None,
        unset_fields: Iterable[str] | None,
    ) -> LogEntry | None:
        """Apply ``$set``/``$unset`` (dotted paths); None when nothing changed (no oplog entry)."""
        before_doc = self._existing(db, coll, doc_id)
        after_doc = copy.deepcopy(before_doc)
        updated: dict[str, Any] = {}
        removed: list[str] = []
        for path, value in (set_fields or {}).items():
            if path == "_id" or path.startswith("_id."):
                raise ValueError("an update may not modify the immutable field '_id'")
            parent, leaf = _walk(after_doc, path, create=True)
            if leaf not in parent or not bson_equal(parent[leaf], value):
                parent[leaf] = copy.deepcopy(value)
                updated[path] = copy.deepcopy(value)
        for path in unset_fields or ():
            parent, leaf = _walk(after_doc, path, create=False)
            if parent is not None and leaf in parent:
                del parent[leaf]
                removed.append(path)
        if not updated and not removed:
            return None
        self._collection(db, coll)[_id_key(doc_id)] = after_doc
        description = {"updatedFields": updated, "removedFields": removed, "truncatedArrays": []}
        entry = LogEntry(
            self.tick(), "update", db, coll, doc_id, after_doc, before_doc, description
        )
        return self._append(entry)

    def replace(self, db: str, coll: str, doc: Mapping[str, Any]) -> LogEntry:
        """Replace the stored document with the same ``_id``."""
        if "_id" not in doc:
            raise ValueError("replace() needs a document with an _id")
        before_doc = self._existing(db, coll, doc["_id"])
        stored = copy_doc(doc)
        self._collection(db, coll)[_id_key(doc["_id"])] = stored
        entry = LogEntry(self.tick(), "replace", db, coll, doc["_id"], stored, before_doc)
        return self._append(entry)

    def delete(self, db: str, coll: str, doc_id: Any) -> LogEntry:
        """Remove the stored document and log a delete."""
        before_doc = self._existing(db, coll, doc_id)
        del self._collection(db, coll)[_id_key(doc_id)]
        self.records.get((db, coll), {}).pop(_id_key(doc_id), None)
        return self._append(LogEntry(self.tick(), "delete", db, coll, doc_id, pre=before_doc))

    def drop(self, db: str, coll: str) -> tuple[LogEntry, LogEntry]:
        """Log ``drop`` then the ``invalidate`` that closes streams on the collection."""
        self.documents.pop((db, coll), None)
        self.records.pop((db, coll), None)
        dropped = self._append(LogEntry(self.tick(), "drop", db, coll))
        return dropped, self._append(LogEntry(self.tick(), "invalidate", db, coll))

    def rename(self, db: str, coll: str, new_coll: str) -> tuple[LogEntry, LogEntry]:
        """Move the documents, log ``rename`` then ``invalidate`` for the old name."""
        if self.documents.get((db, new_coll)):
            raise ValueError(f"target namespace {db}.{new_coll} exists")
        self.documents[(db, new_coll)] = self.documents.pop((db, coll), {})
        self.records[(db, new_coll)] = self.records.pop((db, coll), {})
        renamed = self._append(LogEntry(self.tick(), "rename", db, coll, to=(db, new_coll)))
        return renamed, self._append(LogEntry(self.tick(), "invalidate", db, coll))

    # -- history --------------------------------------------------------------------------- #
    def truncate_before(self, position: Position) -> Position:
        """Forget entries before *position*, which becomes the oldest retained position."""
        if position > self._clock:
            raise ValueError("cannot truncate the log past the current cluster time")
        if position > self.oldest:
            cut = bisect_right(self.entries, before(position), key=attrgetter("pos"))
            del self.entries[:cut]
            self.oldest = position
        return self.oldest

    def keep_last(self, count: int) -> Position:
        """Keep only the newest *count* entries (0: only the newest position survives)."""
        if count < 0:
            raise ValueError("keep_last must be >= 0")
        if count == 0:
            self.entries.clear()
            self.oldest = self._clock
            return self.oldest
        if count >= len(self.entries):
            return self.oldest
        return self.truncate_before(self.entries[-count].pos)

    def check_retained(self, position: Position) -> None:
        """Raise 286 when resuming after *position* needs history that is gone."""
        if position < self.oldest:
            raise CommandError.history_lost()

    # -- change streams -------------------------------------------------------------------- #
    def start_position(self, stage: Mapping[str, Any]) -> Position:
        """Where a new stream starts reading (it returns events strictly after this)."""
        options = [k for k in ("resumeAfter", "startAfter", "startAtOperationTime") if k in stage]
        if len(options) > 1:
            raise CommandError(
                40674, "Only one type of resume option is allowed, but multiple were found."
            )
        if not options:
            return self.last_position
        if options[0] == "startAtOperationTime":
            ts = stage["startAtOperationTime"]
            if not isinstance(ts, Timestamp):
                raise CommandError(14, "startAtOperationTime must be a timestamp")
            wanted = (ts.time, ts.inc)
            self.check_retained(wanted)
            return before(wanted)
        position, invalidate = parse_token(stage[options[0]])
        if invalidate and options[0] == "resumeAfter":
            raise CommandError(260, RESUME_FROM_INVALIDATE_MESSAGE)
        self.check_retained(position)
        return position

    def scan(
        self, after: Position, view: StreamView, limit: int
    ) -> tuple[list[dict[str, Any]], Position, bool]:
        """Read up to *limit* events after *after*.

        Returns ``(batch, new_position, invalidated)``. ``new_position`` is the last entry
        examined (filtered-out entries count), or the newest position when the scan
        reached the end of the log: that is the postBatchResumeToken.
        """
        batch: list[dict[str, Any]] = []
        if limit <= 0:
            return batch, after, False
        entries = self.entries
        index = bisect_right(entries, after, key=attrgetter("pos"))
        while index < len(entries):
            entry = entries[index]
            index += 1
            after = entry.pos
            if not view.sees(entry):
                continue
            event = self.render(entry, view)
            if entry.op == "invalidate":
                # The server raises the invalidate past the user's stages: never filtered.
                batch.append(event)
                return batch, after, True
            if all(matches(event) for matches in view.filters):
                batch.append(event)
                if len(batch) >= limit:
                    return batch, after, False
        return batch, max(after, self._clock), False

    def render(self, entry: LogEntry, view: StreamView | None = None) -> dict[str, Any]:
        """The change event *view* receives for *entry* (shares stored sub-documents)."""
        full_mode = view.full_document if view else "default"
        before_mode = view.before_change if view else "off"
        op = entry.op
        event: dict[str, Any] = {
            "_id": make_token(entry.pos, invalidate=op == "invalidate"),
            "operationType": op,
            "clusterTime": to_timestamp(entry.pos),
            "wallTime": datetime.fromtimestamp(entry.pos[0], UTC),
        }
        if op == "invalidate":
            return event
        if op in ("insert", "replace"):
            event["fullDocument"] = entry.post
        elif op == "update" and full_mode == "updateLookup":
            # updateLookup reads the document as it is *now*, null once it is deleted.
            event["fullDocument"] = self.get(entry.db, entry.coll, entry.doc_id)
        elif op == "update" and full_mode in ("whenAvailable", "required"):
            event["fullDocument"] = entry.post
        event["ns"] = {"db": entry.db, "coll": entry.coll}
        if entry.to is not None:
            event["to"] = {"db": entry.to[0], "coll": entry.to[1]}
        if op in ("insert", "update", "replace", "delete"):
            event["documentKey"] = {"_id": entry.doc_id}
        if entry.update is not None:
            event["updateDescription"] = entry.update
        if before_mode != "off" and op in ("update", "replace", "delete"):
            if entry.pre is None and before_mode == "required":
                raise CommandError(
                    47,
                    "Change stream was configured to require a pre-image for all update, "
                    "delete and replace events, but the pre-image was not found",
                )
            event["fullDocumentBeforeChange"] = entry.pre
        return event


def _walk(doc: dict[str, Any], path: str, *, create: bool) -> tuple[Any, str]:
    """The parent mapping of a dotted *path* and the last key (parent None if absent)."""
    parts = path.split(".")
    node: Any = doc
    for part in parts[:-1]:
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
            continue
        if not isinstance(node, dict):
            if create:
                raise ValueError(f"Cannot create field {part!r} in element {node!r}")
            return None, parts[-1]
        if part not in node:
            if not create:
                return None, parts[-1]
            node[part] = {}
        node = node[part]
    if not isinstance(node, dict):
        if create:
            raise ValueError(f"Cannot create field {parts[-1]!r} in element {node!r}")
        return None, parts[-1]
    return node, parts[-1]


def parse_change_stream(doc: dict[str, Any]) -> tuple[StreamView, str, dict[str, Any]]:
    """Validate a change-stream ``aggregate``: its view, cursor namespace and stage."""
    db, target = doc.get("$db", "test"), doc.get("aggregate")
    pipeline = doc.get("pipeline") or []
    first = pipeline[0] if pipeline else None
    if not isinstance(first, Mapping) or "$changeStream" not in first:
        raise CommandError(
            115, "ScriptedReplicaSet answers only change-stream aggregates ($changeStream first)"
        )
    stage = first["$changeStream"]
    if not isinstance(stage, Mapping):
        raise CommandError(50808, "$changeStream stage expects a document as argument")
    for option in stage:
        if option in _UNMODELLED_OPTIONS:
            raise CommandError(2, f"ScriptedReplicaSet does not model $changeStream.{option}")
        if option not in _STAGE_OPTIONS:
            raise CommandError(40415, f"BSON field '$changeStream.{option}' is an unknown field.")
    if isinstance(target, str):
        if db in _INTERNAL_DBS or target.startswith("system.") or stage.get("allChangesForCluster"):
            raise CommandError(73, f"$changeStream may not be opened on {db}.{target}")
        scope: tuple[str, ...] = ("collection", db, target)
        ns = f"{db}.{target}"
    elif target == 1 and stage.get("allChangesForCluster"):
        if db != "admin":
            raise CommandError(
                73,
                "A $changeStream with 'allChangesForCluster:true' may only be opened on "
                "the 'admin' database",
            )
        scope, ns = ("cluster",), "admin.$cmd.aggregate"
    elif target == 1:
        if db in _INTERNAL_DBS:
            raise CommandError(73, f"$changeStream may not be opened on the internal {db} database")
        scope, ns = ("database", db), f"{db}.$cmd.aggregate"
    else:
        raise CommandError(14, "'aggregate' must be a collection name or 1")

    full_document = stage.get("fullDocument", "default")
    if full_document not in FULL_DOCUMENT_MODES:
        raise CommandError(2, f"unsupported fullDocument mode {full_document!r}")
    before_change = stage.get("fullDocumentBeforeChange", "off")
    if before_change not in BEFORE_CHANGE_MODES:
        raise CommandError(2, f"unsupported fullDocumentBeforeChange mode {before_change!r}")
    view = StreamView(scope, full_document, before_change)
    for extra in pipeline[1:]:
        if not isinstance(extra, Mapping) or len(extra) != 1:
            raise CommandError(
                40323, "A pipeline stage specification object must contain exactly one field."
            )
        ((stage_name, spec),) = extra.items()
        if stage_name == "$match":
            view.filters.append(compile_filter(spec))
        elif stage_name == "$changeStream":
            raise CommandError(
                40602, "$changeStream is only valid as the first stage in a pipeline"
            )
        else:
            raise CommandError(
                40324,
                f"Unrecognized pipeline stage name: '{stage_name}' (ScriptedReplicaSet "
                "evaluates only $match after $changeStream)",
            )
    return view, ns, stage
