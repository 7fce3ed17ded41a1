"""The ``$match`` subset that :mod:`.scripted_mongo` evaluates on change events.

Supported: equality (including on array elements and sub-documents, field order
significant as in BSON), ``$eq``, ``$ne``, ``$in``, ``$nin``, ``$exists``, and the
logical ``$and``, ``$or`` and ``$nor``, on dotted paths. Anything else is refused
with an error instead of being ignored, so a test never passes because the fake
quietly skipped part of a pipeline.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from ._scripted_wire import CommandError

Predicate = Callable[[Mapping[str, Any]], bool]

_FIELD_OPERATORS = ("$eq", "$ne", "$in", "$nin", "$exists")
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


def _bad(message: str) -> CommandError:
    return CommandError(2, message)


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
            options = list(operand)

            def is_in(values: list[Any], options: list[Any] = options) -> bool:
                return any(_equals_any(values, option) for option in options)

            if operator == "$in":
                tests.append(is_in)
            else:
                tests.append(lambda values, is_in=is_in: not is_in(values))
        elif operator == "$exists":
            tests.append(lambda values, wanted=bool(operand): bool(values) == wanted)
        else:
            raise _bad(
                f"unsupported query operator {operator!r} on {path!r}: ScriptedReplicaSet "
                f"evaluates only {', '.join(_FIELD_OPERATORS)} in a change-stream $match"
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
                f"{', '.join(_LOGICAL_OPERATORS)} and field conditions in a change-stream $match"
            )
        else:
            predicates.append(_field_predicate(str(key), value))
    return lambda doc: all(predicate(doc) for predicate in predicates)
