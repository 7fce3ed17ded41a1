"""Resume tokens: BSON documents, encoded so that equal tokens have equal bytes.

Every backend compares tokens exactly (the history-lost guard depends on it), so
all of them go through the same BSON encoding. ``bson`` ships with pymongo, the
``mongo`` extra; it is imported lazily so the core imports without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..exceptions import MissingExtraError

Token = Mapping[str, Any]


def _bson() -> Any:
    try:
        import bson
        import bson.json_util
    except ImportError as exc:  # pragma: no cover - exercised in the minimal tox env
        raise MissingExtraError(
            "pymongo", "mongo", "Storing resume tokens (BSON documents)"
        ) from exc
    return bson


def check_token(token: object, argument: str = "token") -> None:
    """Raise ``TypeError`` unless *token* is ``None`` or a mapping (a BSON document)."""
    if token is not None and not isinstance(token, Mapping):
        raise TypeError(
            f"{argument} must be a BSON document (a mapping such as {{'_data': '8263…'}}) "
            f"or None, not {type(token).__name__}"
        )


def encode_token(token: Token | None) -> bytes | None:
    """Return the BSON bytes of *token* (``None`` stays ``None``)."""
    check_token(token)
    if token is None:
        return None
    return _bson().encode(token)


def decode_token(data: bytes | memoryview | None) -> dict[str, Any] | None:
    """Return the document encoded by :func:`encode_token`."""
    if data is None:
        return None
    return _bson().decode(bytes(data))


def normalize_token(token: Token | None) -> dict[str, Any] | None:
    """Return *token* as pymongo returns it after a BSON round trip (same values, same types)."""
    return decode_token(encode_token(token))


def tokens_equal(left: Token | None, right: Token | None) -> bool:
    """Exact equality: same fields in the same order with the same BSON types and values."""
    return encode_token(left) == encode_token(right)


def token_to_json(token: Token | None) -> str:
    """Relaxed Extended JSON of *token*, for people to read (``"null"`` for ``None``)."""
    if token is None:
        return "null"
    json_util = _bson().json_util
    return json_util.dumps(token, json_options=json_util.RELAXED_JSON_OPTIONS)


def token_from_json(text: str) -> dict[str, Any]:
    """Parse Extended JSON (relaxed or canonical) into a token; ``ValueError`` if it is not one."""
    json_util = _bson().json_util

    try:
        value = json_util.loads(text)
    except ValueError as exc:
        raise ValueError(f"not valid Extended JSON: {exc}") from exc
    except RecursionError:
        raise ValueError("not a resume token: nested too deeply") from None
    if not isinstance(value, Mapping):
        raise ValueError('a resume token must be a JSON object, such as {"_data": "8263…"}')
    return dict(value)


def token_digest(token: Token) -> str:
    """The SHA-256 (hex) of *token*'s BSON bytes: a fixed-length key for an event."""
    import hashlib

    return hashlib.sha256(encode_token(token) or b"").hexdigest()
