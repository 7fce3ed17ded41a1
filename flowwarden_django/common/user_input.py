"""The one validator of what people hand to flowwarden: JSON (fork states, resume
inputs, decision payloads) and text (decision comments, dead-letter notes), whether
it comes through the API, the admin, a management command, a sample view or a direct
call of the core (``decide``, ``Workflow.resume``, ``acknowledge_dead_letter``...),
which checks it again so that no front end is the only guard.

A JSON value passes when it is plain JSON (``dict`` with string keys, ``list``,
``str``, ``int``, finite ``float``, ``bool``, ``None``), nests at most ``MAX_DEPTH``
levels, serialises to at most its size limit, and no string holds a NUL character or
an unpaired surrogate (PostgreSQL cannot store either). Text passes under the same
character rules and a length limit. Anything else raises ``UserJSONError`` with a
stable ``code`` and a message that names the problem, never a traceback from deep
inside a store.

The walk is iterative, so a hostile value cannot exhaust the interpreter's stack
while being checked.
"""

from __future__ import annotations

import json
import math
from typing import Any

#: How deep a value may nest (objects and arrays).
MAX_DEPTH = 64
#: The most UTF-8 bytes a workflow state (a fork's) may take, serialised.
MAX_STATE_BYTES = 1024 * 1024
#: The most UTF-8 bytes a decision payload or a resume input may take, serialised.
MAX_PAYLOAD_BYTES = 64 * 1024
#: The most characters of a decision comment.
MAX_COMMENT_CHARS = 2000
#: The most characters of a dead letter's note (acknowledged, discarded).
MAX_NOTE_CHARS = 2000


class UserJSONError(ValueError):
    """A JSON value from a person was refused; ``code`` says why (``json_invalid``,
    ``json_not_finite``, ``json_too_deep``, ``json_too_large``, ``json_bad_text``,
    ``json_not_object``)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def parse_user_json(
    text: str | bytes, *, what: str = "value", max_bytes: int = MAX_STATE_BYTES
) -> Any:
    """Parse *text* as JSON and ``check_user_json`` the result.

    NaN, Infinity and numbers too large for a float (``1e309``) are refused, as is
    text over *max_bytes*.
    """
    size = len(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise UserJSONError(f"{what} is {size} bytes; the most is {max_bytes}", "json_too_large")
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except UserJSONError:
        raise
    except RecursionError:
        raise UserJSONError(
            f"{what} nests too deeply (the most is {MAX_DEPTH} levels)", "json_too_deep"
        ) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise UserJSONError(f"{what} is not valid JSON: {exc}", "json_invalid") from None
    return check_user_json(value, what=what, max_bytes=max_bytes)


def check_user_json(
    value: Any,
    *,
    what: str = "value",
    max_bytes: int = MAX_STATE_BYTES,
    max_depth: int = MAX_DEPTH,
    require_object: bool = False,
) -> Any:
    """Return *value* when it is plain, storable JSON within the limits (see the
    module); else raise ``UserJSONError``. *require_object*: it must be a JSON object
    (or null)."""
    if require_object and value is not None and not isinstance(value, dict):
        raise UserJSONError(f"{what} must be a JSON object, not {_kind(value)}", "json_not_object")
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict | list):
            if depth > max_depth:
                raise UserJSONError(f"{what} nests deeper than {max_depth} levels", "json_too_deep")
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        raise UserJSONError(f"{what} has a non-string key {key!r}", "json_invalid")
                    _check_text(key, what)
                    pending.append((child, depth + 1))
            else:
                pending.extend((child, depth + 1) for child in item)
        elif isinstance(item, str):
            _check_text(item, what)
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise UserJSONError(
                    f"{what} holds {item!r}: numbers must be finite", "json_not_finite"
                )
        elif item is not None and not isinstance(item, bool | int):
            raise UserJSONError(f"{what} holds {_kind(item)}, which is not JSON", "json_invalid")
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    if size > max_bytes:
        raise UserJSONError(f"{what} is {size} bytes; the most is {max_bytes}", "json_too_large")
    return value


def parse_decision_payload(text: str, *, what: str = "the payload") -> Any:
    """A decision payload typed by a person: empty text is ``None``, else a JSON object
    of at most ``MAX_PAYLOAD_BYTES``."""
    if not text.strip():
        return None
    value = parse_user_json(text, what=what, max_bytes=MAX_PAYLOAD_BYTES)
    return check_user_json(value, what=what, max_bytes=MAX_PAYLOAD_BYTES, require_object=True)


def check_comment(text: Any, *, what: str = "comment") -> str:
    """A decision comment: text of at most ``MAX_COMMENT_CHARS``, storable."""
    return check_text(text, what=what, max_chars=MAX_COMMENT_CHARS)


def check_note(text: Any, *, what: str = "note") -> str:
    """A dead letter's note: text of at most ``MAX_NOTE_CHARS``, storable."""
    return check_text(text, what=what, max_chars=MAX_NOTE_CHARS)


def check_text(text: Any, *, what: str, max_chars: int) -> str:
    """*text* when it is a string of at most *max_chars*, with no NUL and no unpaired
    surrogate; else ``UserJSONError``."""
    if not isinstance(text, str):
        raise UserJSONError(f"{what} must be text, not {_kind(text)}", "json_invalid")
    if len(text) > max_chars:
        raise UserJSONError(
            f"{what} is {len(text)} characters; the most is {max_chars}", "json_too_large"
        )
    _check_text(text, what)
    return text


def check_resume_input(value: Any, *, what: str = "the resume input") -> Any:
    """A resume input or decision payload: plain JSON of at most
    ``MAX_PAYLOAD_BYTES``."""
    return check_user_json(value, what=what, max_bytes=MAX_PAYLOAD_BYTES)


def check_message_payload(value: Any, *, what: str = "the message payload") -> dict[str, Any]:
    """A message's payload (``Workflow.send``): a JSON object (never ``null``) of at
    most ``MAX_PAYLOAD_BYTES``, plain and storable as ``check_user_json`` has it."""
    if not isinstance(value, dict):
        raise UserJSONError(f"{what} must be a JSON object, not {_kind(value)}", "json_not_object")
    return check_user_json(value, what=what, max_bytes=MAX_PAYLOAD_BYTES)


def unknown_usernames(names: list[str]) -> list[str]:
    """The *names* (usernames, in their order) that no user has: one query."""
    from django.contrib.auth import get_user_model

    users = get_user_model()
    key = users.USERNAME_FIELD
    known = set(users.objects.filter(**{f"{key}__in": names}).values_list(key, flat=True))
    return [name for name in names if name not in known]


def _check_text(text: str, what: str) -> None:
    if "\x00" in text:
        raise UserJSONError(f"{what} holds a NUL character", "json_bad_text")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UserJSONError(f"{what} holds an unpaired surrogate", "json_bad_text") from None


def _refuse_constant(name: str) -> Any:
    raise UserJSONError(f"{name} is not a JSON number: numbers must be finite", "json_not_finite")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise UserJSONError(
            f"the number {text[:40]} is too large: numbers must be finite", "json_not_finite"
        )
    return number


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), f"a {type(value).__name__}")
