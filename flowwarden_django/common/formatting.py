"""Text helpers shared by the admin and the management commands: ages, timestamps,
truncation, tables, JSON.

Everything here is pure: callers pass ``now`` (``django.utils.timezone.now()``)
so that output is reproducible in tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

#: Shown for a missing token or timestamp.
NONE_TEXT = "—"

_UNITS = ((86400, "d"), (3600, "h"), (60, "m"))


class _CountedWords:
    """One of Django's ``timesince`` unit texts (``"%(num)d minute"``), translated
    when formatted: the same catalogue entry as Django's lazy text, without a lazy
    proxy per use (a changelist shows two ages a row)."""

    __slots__ = ("plural", "singular")

    def __init__(self, singular: str, plural: str) -> None:
        self.singular = singular
        self.plural = plural

    def __mod__(self, values: Mapping[str, int]) -> str:
        from django.utils.translation import ngettext

        return ngettext(self.singular, self.plural, values["num"]) % values


#: Django's ``timesince.TIME_STRINGS``, with the same texts.
_TIME_STRINGS = {
    unit: _CountedWords(f"%(num)d {unit}", f"%(num)d {unit}s")
    for unit in ("year", "month", "week", "day", "hour", "minute")
}


def relative_time(at: datetime, now: datetime | None = None) -> str:
    """``"3 minutes ago"``, or ``"in 2 days"`` for a time still to come (an expiry),
    in words the admin uses (translated)."""
    from django.utils import timezone
    from django.utils.timesince import timesince, timeuntil
    from django.utils.translation import gettext, ngettext

    now = now or timezone.now()
    seconds = (now - at).total_seconds()
    if abs(seconds) < 60:  # Django would say "0 minutes"
        count = int(abs(seconds))
        delta = ngettext("%(count)d second", "%(count)d seconds", count) % {"count": count}
        return (
            gettext("in %(delta)s") % {"delta": delta}
            if seconds < 0
            else (gettext("%(delta)s ago") % {"delta": delta})
        )
    if at > now:
        return gettext("in %(delta)s") % {"delta": timeuntil(at, now, _TIME_STRINGS)}
    return gettext("%(delta)s ago") % {"delta": timesince(at, now, time_strings=_TIME_STRINGS)}


def age_text(at: datetime | None, now: datetime) -> str:
    """How long ago *at* was, in its largest whole unit: ``"12s ago"``, ``"3m ago"``, ``"4d ago"``.

    ``None`` gives ``"—"``; a time in the future (clock skew between hosts) gives ``"in 5s"``.
    """
    if at is None:
        return NONE_TEXT
    seconds = int((now - at).total_seconds())
    amount = _duration_text(abs(seconds))
    return f"in {amount}" if seconds < 0 else f"{amount} ago"


def _duration_text(seconds: int) -> str:
    for size, unit in _UNITS:
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def truncate(text: str, width: int) -> str:
    """*text* cut to *width* characters, ending with ``…`` when it was cut."""
    if len(text) <= width:
        return text
    return text[: max(width - 1, 0)] + "…"


def timestamp_text(at: datetime | None, now: datetime) -> str:
    """The exact ISO 8601 timestamp, then its age: ``"2025-01-01T12:00:00+00:00 (3m ago)"``."""
    if at is None:
        return NONE_TEXT
    return f"{at.isoformat()} ({age_text(at, now)})"


def dump_json(value: Any) -> str:
    """Indented JSON for operators and scripts; values JSON cannot hold are ``str()``-ed."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def format_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """Left-aligned columns separated by two spaces; the first line holds the headers."""
    rows = [list(row) for row in rows]
    widths = [len(header) for header in headers]
    for row in rows:
        widths = [max(width, len(cell)) for width, cell in zip(widths, row, strict=True)]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in [list(headers), *rows]
    ]


def mapping_text(value: Mapping[str, Any]) -> str:
    """A mapping as one line of JSON (``{}`` when empty)."""
    return json.dumps(dict(value), ensure_ascii=False, default=str, sort_keys=True)


def state_json(state: Any) -> str:
    """*state* as JSON indented by 2 with sorted keys; values JSON cannot hold (dates,
    decimals, objects) are written with ``str()``."""
    try:
        return json.dumps(state, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    except (TypeError, ValueError):  # keys json cannot sort or write (tuples, mixed types)
        return json.dumps(_plain(state), indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _plain(value: Any) -> Any:
    """*value* with every mapping key made a string, so that it sorts and dumps."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, set | frozenset):
        return sorted((_plain(item) for item in value), key=repr)
    return value
