"""The API's request body parser: JSON that every supported database can store."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from ..common.user_input import MAX_STATE_BYTES, UserJSONError, parse_user_json

#: The largest body read: a fork's state at its limit, plus the object around it.
MAX_BODY_BYTES = MAX_STATE_BYTES + 4096


class StorableJSONParser(JSONParser):
    """JSON bodies through ``common.user_input`` (400 ``parse_error``): finite
    numbers only (``1e309`` and ``NaN`` are refused), at most ``MAX_DEPTH`` levels,
    at most ``MAX_BODY_BYTES``, no NUL characters or unpaired surrogates (PostgreSQL
    text and jsonb cannot hold them)."""

    def parse(
        self,
        stream: Any,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        parser_context = parser_context or {}
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        raw = stream.read(MAX_BODY_BYTES + 1) if stream is not None else b""
        if len(raw) > MAX_BODY_BYTES:
            raise ParseError(f"JSON parse error - the body is over {MAX_BODY_BYTES} bytes")
        try:
            text = raw.decode(encoding)
        except (UnicodeDecodeError, LookupError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        try:
            return parse_user_json(text, what="the body", max_bytes=MAX_BODY_BYTES)
        except UserJSONError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
