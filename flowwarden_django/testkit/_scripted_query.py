"""Reads of the stored documents for :mod:`.scripted_mongo`: ``find``, ``count`` and
collection ``aggregate`` pipelines, and the cursors that serve their batches.

Find-cursor consistency: a find cursor is a *position in its sort order*, not a
snapshot. Each batch (the first one and every ``getMore``) reads the documents as they
are at that moment, keeps those matching the filter, orders them and returns the next
ones strictly after the sort key of the last document already returned. Explicit sorts
end with ``_id`` ascending as a tiebreaker (so positions are unique); without a sort
(or with ``$natural``) the order is the record order: insertion order, a document
keeping its place through updates and a re-inserted one going to the end. So, like a
real server reading without snapshot isolation between batches:

* a document inserted (or updated into the filter) ahead of the position is returned
  by a later batch; one inserted behind it is not;
* a document deleted (or updated out of the filter) before its batch is not returned;
* a document is returned as it is at its batch, not as it was at the ``find``;
* an update that moves a document's sort key across the position can make it seen
  twice (moved ahead) or never (moved behind), as with an index scan on that field.

``skip`` applies to the first batch that is asked for documents; ``limit`` counts every
document returned. An ``aggregate`` cursor is different: its results are computed when
the ``aggregate`` runs and served from that list.

``readConcern`` (``majority``, ``snapshot`` with or without ``atClusterTime``...) is
accepted and ignored: reads always see the current documents.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import InitVar, dataclass, field
from functools import total_ordering
from operator import itemgetter
from typing import Any

from bson import Decimal128, encode

from ._scripted_events import EventLog
from ._scripted_match import RANK_MINKEY, Predicate, bson_sort_key, compile_filter, resolve_path
from ._scripted_wire import MAX_BSON_SIZE, CommandError, check_projection, project

__all__ = [
    "DEFAULT_FIRST_BATCH",
    "CollectionSnapshot",
    "CountQuery",
    "DocumentCursor",
    "FindQuery",
    "Ordering",
    "ResultCursor",
    "compile_pipeline",
    "count_command",
    "parse_count",
    "parse_find",
    "parse_sort",
    "run_pipeline",
    "run_stages",
]

#: Documents in a find's or an aggregate's first batch when the driver names no batchSize.
DEFAULT_FIRST_BATCH = 101

_NULL_KEY = bson_sort_key(None)
# The server orders an empty array below null and missing fields.
_EMPTY_ARRAY_KEY = (RANK_MINKEY, 1)
_MISSING = object()
_START = object()

# Find options the fake refuses rather than silently ignoring when they are set.
_UNMODELLED_FIND_OPTIONS = (
    "tailable",
    "awaitData",
    "min",
    "max",
    "returnKey",
    "showRecordId",
    "let",
    "collation",
    "oplogReplay",
)
_PIPELINE_STAGES = ("$match", "$group", "$sort", "$skip", "$limit", "$project", "$count")


# -- ordering ------------------------------------------------------------------------------ #
@total_ordering
class _Descending:
    """Wraps a sort key so that it orders backwards (for ``-1`` sort fields)."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and self.key == other.key

    def __lt__(self, other: _Descending) -> bool:
        return bool(other.key < self.key)

    def __hash__(self) -> int:
        return hash(self.key)


def _field_key(doc: Mapping[str, Any], parts: tuple[str, ...], descending: bool) -> Any:
    """The sort key of one field: the smallest array element ascending, the largest
    descending, an empty array below null, a missing field as null (as the server)."""
    if len(parts) == 1:
        value = doc.get(parts[0], _MISSING)
        values = [] if value is _MISSING else [value]
    else:
        values = resolve_path(doc, list(parts))
    keys: list[Any] = []
    for value in values:
        if isinstance(value, list):
            if value:
                keys.extend(bson_sort_key(item) for item in value)
            else:
                keys.append(_EMPTY_ARRAY_KEY)
        else:
            keys.append(bson_sort_key(value))
    if not keys:
        return _NULL_KEY
    if len(keys) == 1:
        return keys[0]
    return max(keys) if descending else min(keys)


@dataclass(frozen=True)
class Ordering:
    """A validated sort: fields with their directions, or natural (record) order.

    Explicit sorts end with ``_id`` ascending as a tiebreaker when they do not name it,
    so every document has a distinct position.
    """

    fields: tuple[tuple[tuple[str, ...], bool], ...] = ()
    natural: int = 1

    def key(self, doc: Mapping[str, Any], record: int) -> Any:
        """The position of *doc* (whose record id is *record*) in this order."""
        if not self.fields:
            return record if self.natural == 1 else -record
        parts: list[Any] = []
        for path, descending in self.fields:
            field_key = _field_key(doc, path, descending)
            parts.append(_Descending(field_key) if descending else field_key)
        if not any(path == ("_id",) for path, _ in self.fields):
            parts.append(bson_sort_key(doc.get("_id")))
        return tuple(parts)


def parse_sort(spec: Any, *, allow_natural: bool = True) -> Ordering:
    """Validate a ``sort`` document (``{field: 1 | -1, ...}`` or ``{"$natural": ±1}``)."""
    if spec is None:
        return Ordering()
    if not isinstance(spec, Mapping):
        raise CommandError(14, "Expected field sort to be of type object")
    fields: list[tuple[tuple[str, ...], bool]] = []
    natural = 0
    for path, direction in spec.items():
        if isinstance(direction, Mapping):
            raise CommandError(
                2, f"ScriptedReplicaSet does not model $meta sorts ({path!r}: {direction!r})"
            )
        if isinstance(direction, bool) or direction not in (1, -1):
            raise CommandError(
                15975, "$sort key ordering must be 1 (for ascending) or -1 (for descending)"
            )
        if path == "$natural":
            if not allow_natural:
                raise CommandError(2, "ScriptedReplicaSet does not model $natural in $sort")
            natural = int(direction)
            continue
        if not path or path.startswith("$"):
            raise CommandError(2, f"ScriptedReplicaSet cannot sort on {path!r}")
        fields.append((tuple(path.split(".")), direction == -1))
    if natural and fields:
        raise CommandError(2, "ScriptedReplicaSet does not model $natural combined with fields")
    return Ordering(tuple(fields), natural or 1)


# -- batches ------------------------------------------------------------------------------- #
def _fill(
    docs: Iterator[dict[str, Any]], wanted: int | None, projection: Any
) -> list[dict[str, Any]]:
    """Up to *wanted* documents (None: no count limit) that fit in one 16 MiB reply.

    Consumes from *docs* only what it returns.
    """
    batch: list[dict[str, Any]] = []
    used = 0
    while wanted is None or len(batch) < wanted:
        doc = next(docs, None)
        if doc is None:
            break
        out = project(doc, projection) if projection else doc
        size = len(encode(out))
        if batch and used + size > MAX_BSON_SIZE:
            break
        batch.append(out)
        used += size
    return batch


class _ListReader:
    """An iterator over a list from *start* that counts what was taken."""

    def __init__(self, items: list[Any], start: int) -> None:
        self.items = items
        self.index = start

    def __iter__(self) -> _ListReader:
        return self

    def __next__(self) -> Any:
        if self.index >= len(self.items):
            raise StopIteration
        item = self.items[self.index]
        self.index += 1
        return item


@dataclass(frozen=True)
class CollectionSnapshot:
    """A collection's stored documents with their record ids, at one ``EventLog.version``."""

    stamp: tuple[int, int]
    rows: list[tuple[int, dict[str, Any]]]


@dataclass(eq=False, repr=False)
class DocumentCursor:
    """A find cursor over one collection: a position in its sort order (see the module).

    Not thread-safe; the server calls it under its lock. Each batch re-reads the
    collection, except that the filtered and sorted rows are cached until the stored
    documents change (``EventLog.version``), so paging through an unchanged collection
    costs one sort.
    """

    db: str
    coll: str
    matches: Predicate
    ordering: Ordering
    projection: Any = None
    skip: InitVar[int] = 0
    limit: InitVar[int] = 0
    _skip: int = field(init=False)
    _left: int | None = field(init=False)
    _after: Any = field(default=_START, init=False)
    # (stamp, sort keys, documents), replaced as one so a reader never mixes two reads.
    _rows: tuple[tuple[int, int] | None, list[Any], list[dict[str, Any]]] = field(
        default=(None, [], []), init=False
    )

    def __post_init__(self, skip: int, limit: int) -> None:
        self._skip = skip
        self._left = limit or None

    def snapshot(self, log: EventLog) -> CollectionSnapshot | None:
        """What :meth:`refresh` needs to read the collection without the server's lock;
        None when the cached rows are current. Call it under the lock."""
        stamp = (id(log), log.version)
        if self._rows[0] == stamp:
            return None
        documents = log.documents.get((self.db, self.coll), {})
        records = log.record_ids(self.db, self.coll)
        return CollectionSnapshot(stamp, [(records[k], doc) for k, doc in documents.items()])

    def refresh(self, snapshot: CollectionSnapshot | None) -> None:
        """Filter and sort *snapshot* (the slow part of a batch), needing no lock: stored
        documents are never changed in place, a write replaces them."""
        if snapshot is None or self._rows[0] == snapshot.stamp:
            return
        key, matches = self.ordering.key, self.matches
        rows = [(key(doc, record), doc) for record, doc in snapshot.rows if matches(doc)]
        rows.sort(key=itemgetter(0))
        self._rows = (snapshot.stamp, [row[0] for row in rows], [row[1] for row in rows])

    def _read(self, log: EventLog) -> None:
        self.refresh(self.snapshot(log))

    def next_batch(self, log: EventLog, size: int | None) -> tuple[list[dict[str, Any]], bool]:
        """The next documents after the position and whether the cursor is exhausted.

        *size* counts documents (None: as many as fit in 16 MiB); 0 returns an empty
        batch and leaves the cursor open, as the server does for ``batchSize: 0``.
        """
        if size == 0:
            return [], False
        self._read(log)
        _, keys, docs = self._rows
        start = 0 if self._after is _START else bisect_right(keys, self._after)
        if self._skip:
            skipped = min(self._skip, len(keys) - start)
            if skipped:
                self._after = keys[start + skipped - 1]
            start += skipped
            self._skip -= skipped
        wanted = size if self._left is None else min(size or self._left, self._left)
        rows = _ListReader(docs, start)
        batch = _fill(rows, wanted, self.projection)
        if rows.index > start:
            self._after = keys[rows.index - 1]
        if self._left is not None:
            self._left -= len(batch)
        return batch, rows.index >= len(keys) or self._left == 0


class ResultCursor:
    """An aggregate's cursor: results computed when the aggregate ran, served in batches."""

    def __init__(self, results: list[dict[str, Any]]) -> None:
        self._results = results
        self._index = 0

    def next_batch(self, log: EventLog, size: int | None) -> tuple[list[dict[str, Any]], bool]:
        """The next results and whether none remain (*size* as for DocumentCursor)."""
        if size == 0:
            return [], False
        rows = _ListReader(self._results, self._index)
        batch = _fill(rows, size, None)
        self._index = rows.index
        return batch, self._index >= len(self._results)


# -- find and count ------------------------------------------------------------------------ #
def _count_option(doc: Mapping[str, Any], name: str, *, allow_negative: bool = False) -> int:
    value = doc.get(name)
    if value is None:
        return 0
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise CommandError(14, f"BSON field '{name}' is the wrong type '{type(value).__name__}'")
    if value < 0:
        if allow_negative:
            return -value
        raise CommandError(51024, f"BSON field '{name}' value must be >= 0, actual value '{value}'")
    return value


def _filter(spec: Any, name: str) -> Predicate:
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping):
        raise CommandError(14, f"BSON field '{name}' is the wrong type, expected type 'object'")
    return compile_filter(spec)


@dataclass
class FindQuery:
    """A validated ``find`` command: its cursor and how the first batch is sized."""

    cursor: DocumentCursor
    first_batch: int
    single_batch: bool


def parse_find(doc: Mapping[str, Any]) -> FindQuery:
    """Validate a ``find`` command on a normal collection; refuses unmodelled options."""
    for option in _UNMODELLED_FIND_OPTIONS:
        if doc.get(option):
            raise CommandError(2, f"ScriptedReplicaSet does not model the find option {option!r}")
    coll = doc.get("find")
    if not isinstance(coll, str) or not coll:
        raise CommandError(73, f"Invalid namespace specified '{coll!r}'")
    projection = doc.get("projection")
    check_projection(projection)
    batch_size = doc.get("batchSize")
    first = DEFAULT_FIRST_BATCH if batch_size is None else _count_option(doc, "batchSize")
    limit = _count_option(doc, "limit")
    if limit and first:
        first = min(first, limit)
    cursor = DocumentCursor(
        doc.get("$db", "test"),
        coll,
        _filter(doc.get("filter"), "filter"),
        parse_sort(doc.get("sort")),
        projection or None,
        _count_option(doc, "skip"),
        limit,
    )
    return FindQuery(cursor, first, bool(doc.get("singleBatch")))


@dataclass(frozen=True)
class CountQuery:
    """A validated ``count`` command."""

    db: str
    coll: str
    matches: Predicate
    skip: int
    limit: int

    def count(self, documents: Iterable[Mapping[str, Any]]) -> int:
        """The ``n`` over *documents*: matching ones after ``skip``, up to ``limit``."""
        matches = self.matches
        found = max(0, sum(1 for stored in documents if matches(stored)) - self.skip)
        return min(found, self.limit) if self.limit else found


def parse_count(doc: Mapping[str, Any]) -> CountQuery:
    """Validate a ``count`` command."""
    coll = doc.get("count")
    if not isinstance(coll, str) or not coll:
        raise CommandError(73, f"Invalid namespace specified '{coll!r}'")
    return CountQuery(
        doc.get("$db", "test"),
        coll,
        _filter(doc.get("query"), "query"),
        _count_option(doc, "skip"),
        _count_option(doc, "limit", allow_negative=True),
    )


def count_command(log: EventLog, doc: Mapping[str, Any]) -> int:
    """The ``n`` of a ``count`` command: matching documents after ``skip``, up to ``limit``."""
    query = parse_count(doc)
    return query.count(log.documents.get((query.db, query.coll), {}).values())


# -- collection aggregates ----------------------------------------------------------------- #
Stage = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


def _path_value(node: Any, parts: list[str]) -> Any:
    """A ``"$a.b"`` field path's value: arrays map over their documents, missing is _MISSING."""
    for index, part in enumerate(parts):
        if isinstance(node, Mapping):
            if part not in node:
                return _MISSING
            node = node[part]
        elif isinstance(node, list):
            found = (_path_value(item, parts[index:]) for item in node)
            return [value for value in found if value is not _MISSING]
        else:
            return _MISSING
    return node


def _expression(spec: Any) -> Callable[[Mapping[str, Any]], Any]:
    """A ``$group`` expression: a ``"$field.path"``, a literal, or a document of those."""
    if isinstance(spec, str) and spec.startswith("$"):
        if spec.startswith("$$") or len(spec) == 1:
            raise CommandError(2, f"ScriptedReplicaSet does not model the expression {spec!r}")
        parts = spec[1:].split(".")

        def field_path(doc: Mapping[str, Any]) -> Any:
            value = _path_value(doc, parts)
            return None if value is _MISSING else value

        return field_path
    if isinstance(spec, Mapping):
        if any(str(key).startswith("$") for key in spec):
            raise CommandError(
                2, f"ScriptedReplicaSet does not model expression operators: {dict(spec)!r}"
            )
        members = {key: _expression(value) for key, value in spec.items()}
        return lambda doc: {key: member(doc) for key, member in members.items()}
    if isinstance(spec, list):
        raise CommandError(2, "ScriptedReplicaSet does not model array expressions")
    return lambda doc: spec


def _sum_accumulator(argument: Any, name: str) -> Callable[[Iterable[Mapping[str, Any]]], Any]:
    expression = _expression(argument)

    def total(docs: Iterable[Mapping[str, Any]]) -> Any:
        result: int | float = 0
        for doc in docs:
            value = expression(doc)
            if isinstance(value, Decimal128):
                raise CommandError(2, f"ScriptedReplicaSet does not sum Decimal128 ({name!r})")
            if isinstance(value, int | float) and not isinstance(value, bool):
                result += value
        return result

    return total


def _group_stage(spec: Any) -> Stage:
    if not isinstance(spec, Mapping):
        raise CommandError(15947, "a group's fields must be specified in an object")
    if "_id" not in spec:
        raise CommandError(15955, "a group specification must include an _id")
    group_id = _expression(spec["_id"])
    accumulators: list[tuple[str, Callable[[Iterable[Mapping[str, Any]]], Any]]] = []
    for name, accumulator in spec.items():
        if name == "_id":
            continue
        if "." in name:
            raise CommandError(40235, f"The field name '{name}' cannot contain '.'")
        if not isinstance(accumulator, Mapping) or len(accumulator) != 1:
            raise CommandError(40234, f"The field '{name}' must be an accumulator object")
        ((operator, argument),) = accumulator.items()
        if operator == "$sum":
            accumulators.append((name, _sum_accumulator(argument, name)))
        elif operator == "$count":
            if argument != {}:
                raise CommandError(2, "$count takes no arguments, i.e. $count:{}")
            accumulators.append((name, _sum_accumulator(1, name)))
        else:
            raise CommandError(
                2,
                f"ScriptedReplicaSet does not model the accumulator {operator!r} in $group "
                "(it evaluates $sum and $count)",
            )

    def group(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        groups: dict[Any, tuple[Any, list[dict[str, Any]]]] = {}
        for doc in docs:
            value = group_id(doc)
            members = groups.setdefault(bson_sort_key(value), (value, []))[1]
            members.append(doc)
        return [
            {"_id": value, **{name: run(members) for name, run in accumulators}}
            for value, members in groups.values()
        ]

    return group


def _skip_stage(spec: Any) -> Stage:
    if isinstance(spec, bool) or not isinstance(spec, int | float) or spec != int(spec):
        raise CommandError(15972, "Argument to $skip must be a number")
    if spec < 0:
        raise CommandError(15956, "Argument to $skip cannot be negative")
    return lambda docs: docs[int(spec) :]


def _limit_stage(spec: Any) -> Stage:
    if isinstance(spec, bool) or not isinstance(spec, int | float) or spec != int(spec):
        raise CommandError(15957, "the limit must be specified as a number")
    if spec <= 0:
        raise CommandError(15958, "the limit must be positive")
    return lambda docs: docs[: int(spec)]


def _sort_stage(spec: Any) -> Stage:
    if not isinstance(spec, Mapping) or not spec:
        raise CommandError(15976, "$sort stage must have at least one sort key")
    ordering = parse_sort(spec, allow_natural=False)

    def sort(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        keyed = sorted(
            ((ordering.key(doc, index), doc) for index, doc in enumerate(docs)),
            key=itemgetter(0),
        )
        return [doc for _, doc in keyed]

    return sort


def _project_stage(spec: Any) -> Stage:
    if not isinstance(spec, Mapping) or not spec:
        raise CommandError(51272, "projection specification must have at least one field")
    check_projection(spec)
    return lambda docs: [project(doc, spec) for doc in docs]


def _count_stage(spec: Any) -> Stage:
    if not isinstance(spec, str) or not spec or spec.startswith("$") or "." in spec:
        raise CommandError(
            40156, "the count field must be a non-empty string, not starting with '$' or with '.'"
        )
    return lambda docs: [{spec: len(docs)}] if docs else []


def _match_stage(spec: Any) -> Stage:
    matches = _filter(spec, "$match")
    return lambda docs: [doc for doc in docs if matches(doc)]


_STAGE_BUILDERS: dict[str, Callable[[Any], Stage]] = {
    "$match": _match_stage,
    "$group": _group_stage,
    "$sort": _sort_stage,
    "$skip": _skip_stage,
    "$limit": _limit_stage,
    "$project": _project_stage,
    "$count": _count_stage,
}


def compile_pipeline(pipeline: Any) -> list[Stage]:
    """Validate a collection ``aggregate`` pipeline (no ``$changeStream``) into stages.

    Anything beyond ``$match``, ``$group`` (``$sum``/``$count`` accumulators), ``$sort``,
    ``$skip``, ``$limit``, ``$project`` (1/0 fields) and ``$count`` is refused with a
    ``CommandError`` naming the stage.
    """
    if not isinstance(pipeline, list):
        raise CommandError(14, "'pipeline' option must be specified as an array")
    stages: list[Stage] = []
    for spec in pipeline:
        if not isinstance(spec, Mapping) or len(spec) != 1:
            raise CommandError(
                40323, "A pipeline stage specification object must contain exactly one field."
            )
        ((name, argument),) = spec.items()
        if name == "$changeStream":
            raise CommandError(
                40602, "$changeStream is only valid as the first stage in a pipeline"
            )
        builder = _STAGE_BUILDERS.get(name)
        if builder is None:
            raise CommandError(
                40324,
                f"Unrecognized pipeline stage name: '{name}' (ScriptedReplicaSet evaluates "
                f"only {', '.join(_PIPELINE_STAGES)} in a collection aggregate)",
            )
        stages.append(builder(argument))
    return stages


def run_pipeline(log: EventLog, db: str, coll: str, stages: list[Stage]) -> list[dict[str, Any]]:
    """Run compiled *stages* over the stored documents of ``db.coll`` in record order."""
    return run_stages(list(log.documents.get((db, coll), {}).values()), stages)


def run_stages(docs: list[dict[str, Any]], stages: list[Stage]) -> list[dict[str, Any]]:
    """Run compiled *stages* over *docs* (stored documents, never changed in place)."""
    for stage in stages:
        docs = stage(docs)
    return docs
