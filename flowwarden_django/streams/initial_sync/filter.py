"""The ``find`` filter of an initial sync, from the stream's change-stream pipeline.

An initial sync hands each existing document to the stream as if it had just been
inserted, so it must copy exactly the documents whose insert the stream would see.
:func:`copy_filter` translates the pipeline's ``$match`` stages to that filter:

* a condition on ``fullDocument.<field>`` becomes the same condition on ``<field>``
  (any value operator: ``$in``, ``$gt``, ``$exists``, ``$elemMatch``...);
* ``$and``, ``$or`` and ``$nor`` of such conditions keep their shape;
* a condition on ``operationType`` is decided for ``"insert"``: one that admits it
  does not restrict the copy (it is dropped), one that excludes it matches nothing
  (a branch of an ``$or`` drops out, an ``$and`` matches nothing);
* ``$comment`` is dropped.

Anything else (another stage such as ``$project`` or ``$addFields``, a ``$match``
on another path such as ``updateDescription...``, ``$expr``) raises
:class:`CopyFilterError`, naming the stage by its 1-based index in ``pipeline()``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_FULL_DOCUMENT = "fullDocument."
_LOGICAL = ("$and", "$or", "$nor")


class CopyFilterError(ValueError):
    """The pipeline cannot be applied to the documents an initial sync copies."""


class _Untranslatable(Exception):
    """Raised inside a ``$match``; becomes a ``CopyFilterError`` naming the stage."""


# A translated expression is a filter dict, or one of these two constants.
_TRUE = "true"  # restricts nothing
_FALSE = "false"  # matches no document


def copy_filter(stages: Sequence[Mapping[str, Any]], stream_name: str = "") -> dict[str, Any]:
    """The ``find`` filter matching the documents the stream's *stages* admit as inserts.

    Raises :class:`CopyFilterError` for a stage it cannot translate, and when the
    pipeline admits no insert at all (the copy would copy nothing).
    """
    conditions: list[dict[str, Any]] = []
    for index, stage in enumerate(stages, start=1):
        operator = _stage_operator(stage)
        if operator != "$match":
            raise CopyFilterError(_message(stream_name, index, operator))
        try:
            translated = _expression(stage["$match"])
        except _Untranslatable as exc:
            raise CopyFilterError(_message(stream_name, index, operator, str(exc))) from None
        if translated == _FALSE:
            raise CopyFilterError(
                f"stream {stream_name!r}: pipeline stage {index} ($match) admits no insert, "
                "so COPY_EXISTING would copy nothing"
            )
        if translated != _TRUE:
            conditions.append(translated)
    if not conditions:
        return {}
    return conditions[0] if len(conditions) == 1 else {"$and": conditions}


def _stage_operator(stage: Any) -> str:
    if isinstance(stage, Mapping) and len(stage) == 1:
        return str(next(iter(stage)))
    return repr(stage)


def _message(stream_name: str, index: int, operator: str, detail: str = "") -> str:
    text = (
        f"stream {stream_name!r}: COPY_EXISTING cannot apply pipeline stage {index} "
        f"({operator}) to the copy"
    )
    return f"{text}: {detail}" if detail else text


def _expression(match: Any) -> dict[str, Any] | str:
    if not isinstance(match, Mapping):
        raise _Untranslatable("$match takes a document")
    parts: list[dict[str, Any] | str] = []
    for key, value in match.items():
        if key in _LOGICAL:
            parts.append(_logical(key, value))
        elif key == "$comment":
            continue
        elif key == "operationType":
            parts.append(_TRUE if _admits_insert(value) else _FALSE)
        elif isinstance(key, str) and key.startswith(_FULL_DOCUMENT) and len(key) > 13:
            parts.append({key[len(_FULL_DOCUMENT) :]: value})
        else:
            raise _Untranslatable(
                f"a condition on {key!r} (only fullDocument.<field> and operationType "
                "conditions apply to copied documents)"
            )
    return _all_of(parts)


def _all_of(parts: list[dict[str, Any] | str]) -> dict[str, Any] | str:
    if _FALSE in parts:
        return _FALSE
    kept = [part for part in parts if part != _TRUE]
    if not kept:
        return _TRUE
    merged: dict[str, Any] = {}
    for part in kept:
        assert isinstance(part, dict)
        if any(key in merged for key in part):
            return {"$and": kept}
        merged.update(part)
    return merged


def _logical(operator: str, branches: Any) -> dict[str, Any] | str:
    if not isinstance(branches, list | tuple) or not branches:
        raise _Untranslatable(f"{operator} takes a non-empty array")
    translated = [_expression(branch) for branch in branches]
    if operator == "$and":
        return _all_of(translated)
    if _TRUE in translated:  # $or: always true; $nor: never
        return _TRUE if operator == "$or" else _FALSE
    kept = [branch for branch in translated if branch != _FALSE]
    if not kept:
        return _FALSE if operator == "$or" else _TRUE
    return {operator: kept}


def _admits_insert(condition: Any) -> bool:
    """Whether the ``operationType`` condition *condition* holds for ``"insert"``."""
    if not isinstance(condition, Mapping) or not any(str(k).startswith("$") for k in condition):
        return condition == "insert"
    results = []
    for operator, operand in condition.items():
        if operator == "$eq":
            results.append(operand == "insert")
        elif operator == "$ne":
            results.append(operand != "insert")
        elif operator in ("$in", "$nin"):
            if not isinstance(operand, list | tuple):
                raise _Untranslatable(f"operationType {operator} takes an array")
            inside = "insert" in operand
            results.append(inside if operator == "$in" else not inside)
        elif operator == "$exists":
            results.append(bool(operand))
        elif operator == "$not" and isinstance(operand, Mapping):
            results.append(not _admits_insert(operand))
        else:
            raise _Untranslatable(f"operationType with {operator}")
    return all(results)
