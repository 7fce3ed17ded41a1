"""The write commands of the scripted replica set, as the real driver sends them:
``insert``, ``update``, ``delete`` and ``findAndModify``. An application's own code
(``collection.insert_one``, ``update_many``, ``find_one_and_update``...) can so write
to a development server, and its streams see the changes as change events.

Updates take ``$set``, ``$unset`` and ``$inc`` (dotted paths), or a replacement
document. Anything else (another operator, an aggregation pipeline, an upsert, a
transaction) is refused with a clear ``BadValue`` error, never answered wrongly.
Filters are those ``find`` takes. Each function works on the event log under the
server's lock and returns the reply's fields.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._scripted_events import EventLog
from ._scripted_match import compile_filter
from ._scripted_wire import CommandError

#: The update operators the server applies.
OPERATORS = ("$set", "$unset", "$inc")
BAD_VALUE = 2
DUPLICATE_KEY = 11000
TYPE_MISMATCH = 14
IMMUTABLE_FIELD = 66


def _unsupported(what: str) -> CommandError:
    return CommandError(
        BAD_VALUE,
        f"{what} is not supported by the scripted replica set (flowwarden's development "
        f"MongoDB); it supports insert, delete, findAndModify and updates with "
        f"{', '.join(OPERATORS)} or a replacement document",
    )


def _refuse_transactions(doc: Mapping[str, Any]) -> None:
    if doc.get("startTransaction") or doc.get("autocommit") is False:
        raise _unsupported("a multi-document transaction")


def _namespace(doc: Mapping[str, Any], command: str) -> tuple[str, str]:
    return str(doc.get("$db", "test")), str(doc[command])


def _matching(
    log: EventLog, db: str, coll: str, query: Any, *, sort: Any = None
) -> list[dict[str, Any]]:
    """The stored documents *query* matches, in insertion (or *sort*'s ``_id``) order."""
    predicate = compile_filter(query or {})
    found = [d for d in log.documents.get((db, coll), {}).values() if predicate(d)]
    if sort:
        if list(sort) != ["_id"]:
            raise _unsupported(f"sort {dict(sort)!r} (only on _id)")
        found.sort(key=lambda d: d["_id"], reverse=sort["_id"] < 0)
    return found


def insert_command(log: EventLog, doc: Mapping[str, Any]) -> dict[str, Any]:
    """``insert``: one insert event per document; duplicates are write errors."""
    _refuse_transactions(doc)
    db, coll = _namespace(doc, "insert")
    ordered = doc.get("ordered", True)
    n, errors = 0, []
    for index, document in enumerate(doc.get("documents") or []):
        try:
            log.insert(db, coll, document)
        except ValueError as exc:
            errors.append({"index": index, "code": DUPLICATE_KEY, "errmsg": str(exc)})
            if ordered:
                break
            continue
        n += 1
    return _write_reply(n, errors)


def _write_reply(n: int, errors: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    reply: dict[str, Any] = {"n": n, **extra}
    if errors:
        reply["writeErrors"] = errors
    return reply


class _Change:
    """An update document: operators (``$set``/``$unset``/``$inc``) or a replacement."""

    def __init__(self, update: Any) -> None:
        if isinstance(update, list):
            raise _unsupported("an aggregation pipeline update")
        if not isinstance(update, Mapping) or not update:
            raise CommandError(BAD_VALUE, "the update document must be a non-empty document")
        keys = list(update)
        self.replacement = not keys[0].startswith("$")
        if self.replacement:
            if any(key.startswith("$") for key in keys):
                raise CommandError(BAD_VALUE, "a replacement document may not hold operators")
            self.document = dict(update)
            return
        unknown = [key for key in keys if key not in OPERATORS]
        if unknown:
            raise _unsupported(f"the update operator {unknown[0]}")
        self.set = dict(update.get("$set") or {})
        self.unset = list(update.get("$unset") or {})
        self.inc = dict(update.get("$inc") or {})

    def apply(self, log: EventLog, db: str, coll: str, current: dict[str, Any]) -> bool:
        """Apply to the stored *current*; whether it changed (an event was logged)."""
        if self.replacement:
            if "_id" in self.document and self.document["_id"] != current["_id"]:
                raise CommandError(IMMUTABLE_FIELD, "the replacement may not change _id")
            replaced = {**self.document, "_id": current["_id"]}
            if replaced == current:
                return False
            log.replace(db, coll, replaced)
            return True
        fields = dict(self.set)
        for path, amount in self.inc.items():
            if not isinstance(amount, int | float) or isinstance(amount, bool):
                raise CommandError(TYPE_MISMATCH, f"$inc of {path!r} needs a number")
            value = _value_at(current, path)
            if value is not None and (
                not isinstance(value, int | float) or isinstance(value, bool)
            ):
                raise CommandError(TYPE_MISMATCH, f"$inc of a non-number at {path!r}")
            fields[path] = (value or 0) + amount
        try:
            entry = log.update(db, coll, current["_id"], fields, self.unset)
        except ValueError as exc:
            raise CommandError(IMMUTABLE_FIELD, str(exc)) from exc
        return entry is not None


def _value_at(doc: Mapping[str, Any], path: str) -> Any:
    node: Any = doc
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def update_command(log: EventLog, doc: Mapping[str, Any]) -> dict[str, Any]:
    """``update``: each statement's matching documents (the first, or all with
    ``multi``), one update (or replace) event each that changes something."""
    _refuse_transactions(doc)
    db, coll = _namespace(doc, "update")
    matched = modified = 0
    for statement in doc.get("updates") or []:
        if statement.get("upsert"):
            raise _unsupported("upsert")
        change = _Change(statement.get("u"))
        if change.replacement and statement.get("multi"):
            raise CommandError(BAD_VALUE, "multi update is not supported with a replacement")
        targets = _matching(log, db, coll, statement.get("q"))
        if not statement.get("multi"):
            targets = targets[:1]
        for current in targets:
            matched += 1
            modified += change.apply(log, db, coll, current)
    return _write_reply(matched, [], nModified=modified)


def delete_command(log: EventLog, doc: Mapping[str, Any]) -> dict[str, Any]:
    """``delete``: each statement's matching documents (all, or the first with
    ``limit: 1``), one delete event each."""
    _refuse_transactions(doc)
    db, coll = _namespace(doc, "delete")
    deleted = 0
    for statement in doc.get("deletes") or []:
        targets = _matching(log, db, coll, statement.get("q"))
        if statement.get("limit"):
            targets = targets[:1]
        for current in targets:
            log.delete(db, coll, current["_id"])
            deleted += 1
    return _write_reply(deleted, [])


def find_and_modify_command(log: EventLog, doc: Mapping[str, Any]) -> dict[str, Any]:
    """``findAndModify``: update or remove the first matching document; the document
    before (or, with ``new``, after) the change."""
    _refuse_transactions(doc)
    name = next(key for key in doc if key.lower() == "findandmodify")
    db, coll = _namespace(doc, name)
    if doc.get("upsert"):
        raise _unsupported("upsert")
    if doc.get("fields") or doc.get("arrayFilters"):
        raise _unsupported("a projection or arrayFilters in findAndModify")
    targets = _matching(log, db, coll, doc.get("query"), sort=doc.get("sort"))
    if not targets:
        return {"lastErrorObject": {"n": 0, "updatedExisting": False}, "value": None}
    current = copy.deepcopy(targets[0])
    if doc.get("remove"):
        log.delete(db, coll, current["_id"])
        return {"lastErrorObject": {"n": 1}, "value": current}
    if "update" not in doc:
        raise CommandError(BAD_VALUE, "findAndModify needs an update or remove: true")
    _Change(doc["update"]).apply(log, db, coll, current)
    after = copy.deepcopy(log.get(db, coll, current["_id"]))
    value = after if doc.get("new") else current
    return {"lastErrorObject": {"n": 1, "updatedExisting": True}, "value": value}


#: The write commands by lower-cased name.
WRITE_COMMANDS: dict[str, Callable[[EventLog, Mapping[str, Any]], dict[str, Any]]] = {
    "insert": insert_command,
    "update": update_command,
    "delete": delete_command,
    "findandmodify": find_and_modify_command,
}


def field_names(fields: Iterable[str]) -> list[str]:
    """*fields* that look like an update document's operators (``$set``...): passed as
    field names, they would be stored as fields named ``$set``."""
    return [name for name in fields if str(name).startswith("$")]
