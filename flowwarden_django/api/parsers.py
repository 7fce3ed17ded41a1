"""The API's request body parser: JSON that every supported database can store."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


class StorableJSONParser(JSONParser):
    """DRF's JSON parser, refusing (400) what would fail only when written: strings
    with NUL characters (PostgreSQL text and jsonb cannot hold them) or unpaired
    surrogates (``"\\ud800"``, not encodable as UTF-8), and absurdly deep nesting."""

    def parse(
        self,
        stream: Any,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None
        problem = unstorable_text(data)
        if problem is not None:
            raise ParseError(f"JSON parse error - {problem} in a string")
        return data


def unstorable_text(data: Any) -> str | None:
    """What makes a string (or key) in the JSON value *data* unstorable, or ``None``."""
    pending = [data]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str):
            if "\x00" in item:
                return "a NUL character"
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "an unpaired surrogate"
    return None
