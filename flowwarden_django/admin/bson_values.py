"""Stored BSON bytes (resume tokens, document keys, documents) as the admin pages
show them: decoded and drawn, or the reason they cannot be."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.utils.safestring import SafeString
from django.utils.translation import gettext

from ..common.formatting import NONE_TEXT
from ..streams.tokens import decode_token


def decode_bson(data: bytes | memoryview | None) -> tuple[dict[str, Any] | None, str | None]:
    """Return ``(document, None)``, ``(None, None)`` for no bytes, or ``(None, why)``
    when the bytes are not a BSON document."""
    if not data:
        return None, None
    try:
        return decode_token(data), None
    except Exception as exc:  # corrupt bytes, or pymongo missing: show it, don't crash
        return None, gettext("undecodable (%(size)d bytes): %(error)s") % {
            "size": len(data),
            "error": exc,
        }


def bson_html(
    data: bytes | memoryview | None, draw: Callable[[dict[str, Any]], SafeString | str]
) -> SafeString | str:
    """*draw* of the decoded document; why the bytes are not BSON; ``"—"`` for none."""
    document, error = decode_bson(data)
    if error:
        return error
    if document is None:
        return NONE_TEXT
    return draw(document)
