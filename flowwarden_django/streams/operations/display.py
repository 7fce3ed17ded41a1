"""How tokens and checkpoints are shown to people: short and compact token forms for
tables, checkpoints as JSON values, an initial sync's counts, times and last ``_id``,
and the notes on a stream's state (the admin and the management commands)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from django.utils.translation import gettext_noop

from ...common.formatting import NONE_TEXT, truncate
from ..checkpoint import Checkpoint, plain_progress
from ..tokens import Token, token_to_json
from .status import PAUSED, StreamStatus

_Shown = TypeVar("_Shown")

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


def progress_time_text(value: Any, show: Callable[[datetime], _Shown]) -> _Shown | str:
    """A time of an initial sync's progress record (``started_at``, ``updated_at``,
    ``finished_at``: ISO 8601 text) as *show* shows it (the time with its age);
    ``"—"`` when there is none, the text as it is when it does not parse, and the
    ISO text of a time without a time zone."""
    if not value:
        return NONE_TEXT
    try:
        at = datetime.fromisoformat(str(value))
    except ValueError:
        return str(value)
    return show(at) if at.tzinfo is not None else at.isoformat()


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


def state_notes(status: StreamStatus, translate: Callable[[str], str] = str) -> list[str]:
    """What the Streams console and ``flowwarden_streams status`` note about the state
    of a stream: disabled or without auto-start, or a pause requested that is not done
    yet (these words through *translate*: the console passes ``gettext``), then
    :meth:`~.status.StreamStatus.restart_note`, ``stopped_note`` and ``window_note``."""
    notes = []
    if not status.enabled:
        notes.append(translate(gettext_noop("disabled")))
    elif not status.auto_start:
        notes.append(translate(gettext_noop("no auto-start")))
    if status.paused and status.state != PAUSED:
        notes.append(translate(gettext_noop("pause requested")))
    found = (status.restart_note(), status.stopped_note(), status.window_note())
    return notes + [note for note in found if note]
