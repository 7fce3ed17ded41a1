"""The query subset that :mod:`.scripted_mongo` evaluates, and BSON value ordering.

Used for a change stream's ``$match`` on events and for ``find`` filters, ``count``
queries and ``$match`` stages on stored documents. Supported: equality (including on
array elements and sub-documents, field order significant as in BSON), ``$eq``,
``$ne``, ``$in``, ``$nin``, ``$exists``, the range operators ``$gt``, ``$gte``, ``$lt``
and ``$lte`` (type-bracketed, like the server: a number only compares with numbers, a
string with strings...), and the logical ``$and``, ``$or`` and ``$nor``, on dotted
paths. Anything else is refused with an error instead of being ignored, so a test
never passes because the fake quietly skipped part of a pipeline.

:func:`bson_sort_key` orders values the way the server's BSON comparison does: first
by type (MinKey, null, numbers, strings, objects, arrays, binary data, ObjectId,
booleans, dates, timestamps, regular expressions, MaxKey), then by value.
"""

from __future__ import annotations

import operator as _op
import re
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from bson import Decimal128, ObjectId, Timestamp
from bson.datetime_ms import DatetimeMS
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.regex import Regex

from ._scripted_wire import CommandError

Predicate = Callable[[Mapping[str, Any]], bool]

_FIELD_OPERATORS = ("$eq", "$ne", "$in", "$nin", "$exists", "$gt", "$gte", "$lt", "$lte")
_RANGE_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "$gt": _op.gt,
    "$gte": _op.ge,
    "$lt": _op.lt,
    "$lte": _op.le,
}

# The server's canonical type order (bsontypes.h canonicalizeBSONType), as small ranks.
RANK_MINKEY = 1
RANK_NULL = 2
RANK_NUMBER = 3
RANK_STRING = 4
RANK_OBJECT = 5
RANK_ARRAY = 6
RANK_BINARY = 7
RANK_OBJECTID = 8
RANK_BOOL = 9
RANK_DATE = 10
RANK_TIMESTAMP = 11
RANK_REGEX = 12
RANK_MAXKEY = 13
_LOGICAL_OPERATORS = ("$and", "$or", "$nor")


def bson_equal(left: Any, right: Any) -> bool:
    """Equality as the server's query engine sees it for the types the fake meets.

    Numbers compare by value across int/float/Int64 but never equal booleans;
    sub-documents compare field by field *in order*; datetimes compare as UTC.
    """
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return left == right
    if isinstance(left, Mapping) and isinstance(right, Mapping):
        return list(left) == list(right) and all(bson_equal(left[k], right[k]) for k in left)
    if isinstance(left, list | tuple) and isinstance(right, list | tuple):
        return len(left) == len(right) and all(
            bson_equal(a, b) for a, b in zip(left, right, strict=True)
        )
    if isinstance(left, datetime) and isinstance(right, datetime):
        return _as_utc(left) == _as_utc(right)
    if type(left) is not type(right) and not (isinstance(left, str) and isinstance(right, str)):
        return False
    return bool(left == right)


def _as_utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def bson_sort_key(value: Any) -> tuple[Any, ...]:
    """A key that orders *value* among any other BSON values like the server does.

    Keys start with the canonical type rank, so values of different types order by
    type (numbers before strings before ObjectIds before dates...); within a type:
    numbers by value across int/float/Int64/Decimal128 (NaN below every number),
    strings by code point (the server's binary comparison, no collation), documents
    field by field (type, then name, then value), arrays element by element, dates as
    UTC milliseconds (naive datetimes are UTC). Equal keys mean equal BSON values.
    Raises ``CommandError`` (code 2) for a Python value BSON cannot hold.
    """
    if value is None:
        return (RANK_NULL,)
    if isinstance(value, bool):
        return (RANK_BOOL, value)
    if isinstance(value, int | float):
        return (RANK_NUMBER, 0) if value != value else (RANK_NUMBER, 1, value)
    if isinstance(value, Decimal128):
        number = value.to_decimal()
        return (RANK_NUMBER, 0) if number.is_nan() else (RANK_NUMBER, 1, number)
    if isinstance(value, str):
        return (RANK_STRING, value)
    if isinstance(value, Mapping):
        elements = []
        for name, item in value.items():
            key = bson_sort_key(item)
            elements.append((key[0], name, key))
        return (RANK_OBJECT, tuple(elements))
    if isinstance(value, list | tuple):
        return (RANK_ARRAY, tuple(bson_sort_key(item) for item in value))
    if isinstance(value, ObjectId):
        return (RANK_OBJECTID, value.binary)
    if isinstance(value, datetime):
        delta = _as_utc(value) - _EPOCH
        return (
            RANK_DATE,
            (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000,
        )
    if isinstance(value, DatetimeMS):
        return (RANK_DATE, int(value))
    if isinstance(value, Timestamp):
        return (RANK_TIMESTAMP, value.time, value.inc)
    if isinstance(value, bytes):
        # The server compares binary data by length, then subtype, then bytes.
        return (RANK_BINARY, len(value), int(getattr(value, "subtype", 0)), bytes(value))
    if isinstance(value, uuid.UUID):
        return (RANK_BINARY, 16, 4, value.bytes)
    if isinstance(value, Regex):
        return (RANK_REGEX, value.pattern, str(value.flags))
    if isinstance(value, re.Pattern):
        return (RANK_REGEX, value.pattern, str(value.flags))
    if isinstance(value, MinKey):
        return (RANK_MINKEY,)
    if isinstance(value, MaxKey):
        return (RANK_MAXKEY,)
    raise CommandError(2, f"ScriptedReplicaSet cannot order a value of type {type(value).__name__}")


def resolve_path(doc: Any, parts: list[str]) -> list[Any]:
    """Every value *parts* reaches in *doc*, walking into arrays like the server does."""
    if not parts:
        return [doc]
    head, rest = parts[0], parts[1:]
    if isinstance(doc, Mapping):
        return resolve_path(doc[head], rest) if head in doc else []
    if isinstance(doc, list):
        found: list[Any] = []
        if head.isdigit() and int(head) < len(doc):
            found.extend(resolve_path(doc[int(head)], rest))
        for element in doc:
            if isinstance(element, Mapping):
                found.extend(resolve_path(element, parts))
        return found
    return []


def _equals_any(values: list[Any], target: Any) -> bool:
    if target is None and not values:
        return True  # {field: null} also matches a missing field
    for value in values:
        if bson_equal(value, target):
            return True
        if isinstance(value, list) and any(bson_equal(element, target) for element in value):
            return True
    return False


def equality_key(value: Any) -> tuple[Any, ...] | None:
    """A hashable key equal for two scalars exactly when :func:`bson_equal` says they are
    equal; None for values compared one by one (documents, arrays, NaN, other types).

    A scalar with a key never equals a value without one, so an ``$in`` can look its
    options up in a set instead of comparing each document with each option.
    """
    if value is None:
        return ("null",)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return None if value != value else ("number", value)
    if isinstance(value, str):
        return ("string", str(value))
    if isinstance(value, datetime):
        return ("date", _as_utc(value))
    if type(value) is ObjectId:
        return ("objectid", value.binary)
    return None


def _membership_test(options: list[Any]) -> Callable[[list[Any]], bool]:
    """``$in``: whether any reached value (or array element) equals one of *options*.

    Options with an :func:`equality_key` go into a set; only the others (documents,
    arrays...) are compared one by one, so a 2,000-value ``$in`` costs a lookup per value,
    not 2,000 comparisons.
    """
    keyed: set[tuple[Any, ...]] = set()
    others: list[Any] = []
    for option in options:
        key = equality_key(option)
        if key is None:
            others.append(option)
        else:
            keyed.add(key)
    matches_missing = ("null",) in keyed

    def equals_an_option(value: Any) -> bool:
        key = equality_key(value)
        if key is not None:
            return key in keyed
        return any(bson_equal(value, option) for option in others)

    def is_in(values: list[Any]) -> bool:
        if not values:
            return matches_missing  # {field: {$in: [null]}} also matches a missing field
        for value in values:
            if equals_an_option(value):
                return True
            if isinstance(value, list) and any(equals_an_option(item) for item in value):
                return True
        return False

    return is_in


def _bad(message: str) -> CommandError:
    return CommandError(2, message)


def _range_test(operator: str, operand: Any) -> Callable[[list[Any]], bool]:
    """``$gt``/``$gte``/``$lt``/``$lte``: any reached value (or array element) of the
    operand's type that compares as asked. ``{$gte: null}`` and ``{$lte: null}`` are
    equality with null (missing fields included); ``$gt``/``$lt`` null match nothing."""
    if operand is None:
        if operator in ("$gte", "$lte"):
            return lambda values: _equals_any(values, None)
        return lambda values: False
    target = bson_sort_key(operand)
    compare = _RANGE_OPERATORS[operator]

    def test(values: list[Any]) -> bool:
        for value in values:
            candidates = [value, *value] if isinstance(value, list) else [value]
            for candidate in candidates:
                key = bson_sort_key(candidate)
                if key[0] == target[0] and compare(key, target):
                    return True
        return False

    return test


def _field_predicate(path: str, condition: Any) -> Predicate:
    parts = path.split(".")
    is_operator_doc = isinstance(condition, Mapping) and any(
        str(key).startswith("$") for key in condition
    )
    if not is_operator_doc:
        return lambda doc: _equals_any(resolve_path(doc, parts), condition)

    tests: list[Callable[[list[Any]], bool]] = []
    for operator, operand in condition.items():
        if operator == "$eq":
            tests.append(lambda values, target=operand: _equals_any(values, target))
        elif operator == "$ne":
            tests.append(lambda values, target=operand: not _equals_any(values, target))
        elif operator in ("$in", "$nin"):
            if not isinstance(operand, list | tuple):
                raise _bad(f"{operator} needs an array")
            is_in = _membership_test(list(operand))
            if operator == "$in":
                tests.append(is_in)
            else:
                tests.append(lambda values, is_in=is_in: not is_in(values))
        elif operator == "$exists":
            tests.append(lambda values, wanted=bool(operand): bool(values) == wanted)
        elif operator in _RANGE_OPERATORS:
            tests.append(_range_test(operator, operand))
        else:
            raise _bad(
                f"unsupported query operator {operator!r} on {path!r}: ScriptedReplicaSet "
                f"evaluates only {', '.join(_FIELD_OPERATORS)} in a filter or $match"
            )
    return lambda doc: all(test(resolve_path(doc, parts)) for test in tests)


def compile_filter(spec: Any) -> Predicate:
    """Turn a ``$match`` document into a predicate, or raise ``CommandError`` (code 2)."""
    if not isinstance(spec, Mapping):
        raise _bad("the match filter must be an expression in an object")
    predicates: list[Predicate] = []
    for key, value in spec.items():
        if key in _LOGICAL_OPERATORS:
            if not isinstance(value, list | tuple) or not value:
                raise _bad(f"{key} must be a nonempty array")
            branches = [compile_filter(branch) for branch in value]
            if key == "$and":
                predicates.append(lambda doc, bs=branches: all(b(doc) for b in bs))
            elif key == "$or":
                predicates.append(lambda doc, bs=branches: any(b(doc) for b in bs))
            else:
                predicates.append(lambda doc, bs=branches: not any(b(doc) for b in bs))
        elif str(key).startswith("$"):
            raise _bad(
                f"unsupported top-level operator {key!r}: ScriptedReplicaSet evaluates only "
                f"{', '.join(_LOGICAL_OPERATORS)} and field conditions in a filter or $match"
            )
        else:
            predicates.append(_field_predicate(str(key), value))
    return lambda doc: all(predicate(doc) for predicate in predicates)
