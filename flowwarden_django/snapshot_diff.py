"""A workflow state as pretty JSON, and the line diff of two states, for the admin."""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Mapping
from typing import Any

#: Lines of unchanged text shown around each change.
DIFF_CONTEXT = 3


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


@dataclasses.dataclass(frozen=True)
class DiffLine:
    """One line of a diff: ``kind`` is ``"add"``, ``"del"``, ``"hunk"`` or ``"context"``."""

    kind: str
    text: str


def state_diff(before: str, after: str, *, context: int = DIFF_CONTEXT) -> list[DiffLine]:
    """The unified line diff from *before* to *after* (two :func:`state_json` texts),
    without the file header; empty when they are equal."""
    lines = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=context)
    diff = []
    for line in lines:
        if line.startswith(("---", "+++")) and not diff:
            continue  # the file header
        if line.startswith("@@"):
            diff.append(DiffLine("hunk", line))
        elif line.startswith("+"):
            diff.append(DiffLine("add", line))
        elif line.startswith("-"):
            diff.append(DiffLine("del", line))
        else:
            diff.append(DiffLine("context", line))
    return diff
