"""JSON objects kept as text in a string mapping (a snapshot's metadata)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def json_object(metadata: Mapping[str, str] | None, key: str) -> dict[str, Any] | None:
    """The JSON object *metadata* keeps under *key*; ``None`` when there is none
    (no key, an empty text), or what is there is not JSON or not an object."""
    raw = (metadata or {}).get(key)
    if not raw:
        return None
    try:
        found = json.loads(raw)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None
