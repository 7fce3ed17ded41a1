"""What the operator typed: JSON values, ages and the confirmation."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...common.durations import parse_duration
from ...common.formatting import truncate
from ...common.user_input import MAX_STATE_BYTES, UserJSONError, parse_user_json
from ..base import confirmed

#: The longest ``--older-than``: older than anything a database keeps.
MAX_AGE = timedelta(days=36500)


def parse_json(option: str, text: str | None, max_bytes: int = MAX_STATE_BYTES) -> Any:
    """*text*, the value of *option*, parsed as JSON (``None`` stays ``None``); a
    ``CommandError`` that shows how to quote it when it is no JSON."""
    if text is None:
        return None
    try:
        return parse_user_json(text, what=option, max_bytes=max_bytes)
    except UserJSONError as exc:
        if exc.code != "json_invalid":
            raise CommandError(f"{exc}: {truncate(text, 60)!r}.") from exc
        raise CommandError(
            f"{exc}: {truncate(text, 60)!r}. Quote it for the "
            f"shell and use JSON syntax, for example {option} '{{\"approved\": true}}' "
            f"(strings in double quotes: {option} '\"text\"')."
        ) from exc


def parse_age(text: str) -> timedelta:
    """``--older-than``'s value as a duration."""
    try:
        seconds = parse_duration(text)
    except ValueError:
        raise CommandError(
            f"--older-than {text!r} is not an age: use a number with s, m, h, d or w, "
            "for example --older-than 30d or --older-than 12h."
        ) from None
    if seconds < 0:
        raise CommandError(f"--older-than {text!r} is negative: give an age, like 30d.")
    if seconds > MAX_AGE.total_seconds():
        raise CommandError(
            f"--older-than {text!r} is longer than anything kept: the most is 36500d (100 years)."
        )
    return timedelta(seconds=seconds)


def confirm(
    command: BaseCommand, verb: str, *, yes: bool, interactive: bool, **options: Any
) -> bool:
    """Whether to go on with *verb* (``--yes``, ``--no-input`` or a typed ``yes``)."""
    return confirmed(command, verb, yes=yes, interactive=interactive)
