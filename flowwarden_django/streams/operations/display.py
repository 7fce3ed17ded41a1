"""How tokens and checkpoints are shown to people: short and compact token forms for
tables, checkpoints as JSON values, and an initial sync's counts and last ``_id`` (the
admin and the management commands)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ...common.formatting import NONE_TEXT, truncate
from ..checkpoint import Checkpoint, plain_progress
from ..tokens import Token, token_to_json

#: Default width of :func:`short_token`.
SHORT_TOKEN_WIDTH = 20


def token_json_value(token: Token | None) -> Any:
    """*token* as a JSON-compatible value in relaxed Extended JSON (``None`` stays ``None``)."""
    return json.loads(token_to_json(token))


def compact_token(token: Token | None) -> str:
    """*token* as one line of relaxed Extended JSON without spaces (``"—"`` for ``None``)."""
    if token is None:
        return NONE_TEXT
    return json.dumps(token_json_value(token), separators=(",", ":"), ensure_ascii=False)


def short_token(token: Token | None, width: int = SHORT_TOKEN_WIDTH) -> str:
    """A table-sized view of *token*: its ``_data`` string, else its compact JSON, truncated."""
    if token is None:
        return NONE_TEXT
    data = token.get("_data")
    text = data if isinstance(data, str) else compact_token(token)
    return truncate(text, width)


def checkpoint_to_json(checkpoint: Checkpoint) -> dict[str, Any]:
    """Every field of *checkpoint* as JSON-compatible values.

    Tokens become relaxed Extended JSON values, timestamps ISO 8601 strings, and
    the initial-sync progress (already JSON) a copy of its own, or ``None``;
    metadata values JSON cannot hold are written with ``str()`` by the caller's
    ``json.dumps(default=str)``.
    """
    return {
        "stream_name": checkpoint.stream_name,
        "instance_id": checkpoint.instance_id,
        "last_processed_token": token_json_value(checkpoint.last_processed_token),
        "last_processed_at": _iso(checkpoint.last_processed_at),
        "last_seen_token": token_json_value(checkpoint.last_seen_token),
        "last_seen_at": _iso(checkpoint.last_seen_at),
        "last_heartbeat_at": _iso(checkpoint.last_heartbeat_at),
        "metadata": dict(checkpoint.metadata),
        "initial_sync": plain_progress(checkpoint.initial_sync),
    }


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def copied_text(progress: Mapping[str, Any]) -> str:
    """An initial sync's ``"12,000 of ~50,000 (24%)"``; without an estimate only the count."""
    copied, estimated = progress.get("copied"), progress.get("estimated")
    if not isinstance(copied, int):
        return NONE_TEXT
    if not isinstance(estimated, int):
        return f"{copied:,}"
    text = f"{copied:,} of ~{estimated:,}"
    if estimated > 0:
        text += f" ({min(100.0, 100.0 * copied / estimated):.0f}%)"
    return text


def last_id_text(stored: Any) -> str:
    """An initial sync's last copied ``_id`` as relaxed Extended JSON (``300``,
    ``{"$oid": "65a1…"}``); the stored text as it is when it is not
    ``initial_sync.encode_id``'s form (or pymongo, which brings bson, is missing)."""
    if stored is None:
        return NONE_TEXT
    try:
        from bson import json_util

        from ..initial_sync.copier import decode_id

        value = decode_id(str(stored))
    except Exception:  # no pymongo, or an unexpected form: show what is stored
        return str(stored)
    return json_util.dumps(value, json_options=json_util.RELAXED_JSON_OPTIONS)
