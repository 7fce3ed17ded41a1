"""How the actions write runs and snapshots: the command's name in hints, a
snapshot's position, step and state as text."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from ...common.formatting import NONE_TEXT, format_table, truncate
from ...workflows import WorkflowSnapshot
from ...workflows.definition.metadata import CANCELLED, LAST_STEP

COMMAND = "manage.py flowwarden_workflows"
#: The widest line a table is cut to.
LINE_WIDTH = 100
#: The narrowest a shrinking column gets.
MIN_COLUMN = 8


def seq(snapshot: WorkflowSnapshot) -> int:
    """The snapshot's position in its coordination (0 when it has none)."""
    return snapshot.seq or 0


def step_text(snapshot: WorkflowSnapshot) -> str:
    """The step the snapshot was saved after, as shown."""
    if CANCELLED in snapshot.metadata:
        # The cancel's snapshot repeats the position it cancelled at; it is no step's.
        return "(cancel)"
    if LAST_STEP not in snapshot.metadata:
        return NONE_TEXT
    return snapshot.metadata[LAST_STEP] or "(start)"


def state_text(state: Any) -> str:
    """A state as one line of JSON."""
    return json.dumps(state, ensure_ascii=False, default=str, sort_keys=True)


def iso(at: Any) -> str | None:
    """A timestamp in ISO 8601, or ``None``."""
    return None if at is None else at.isoformat()


def fit_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    shrink: Sequence[int] = (),
    width: int = LINE_WIDTH,
) -> list[str]:
    """``format_table``, with the columns at the indexes *shrink* narrowed (the widest
    first, down to ``MIN_COLUMN`` characters or their header's width) until a line
    fits in *width*; a cell cut short ends with ``…``."""
    rows = [list(row) for row in rows]
    widths = [len(header) for header in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    floors = {i: max(MIN_COLUMN, len(headers[i])) for i in shrink}
    excess = sum(widths) + 2 * (len(widths) - 1) - width
    while excess > 0:
        room = [i for i in shrink if widths[i] > floors[i]]
        if not room:
            break
        widest = max(room, key=lambda i: widths[i])
        widths[widest] -= 1
        excess -= 1
    return format_table(
        headers, [[truncate(cell, w) for cell, w in zip(row, widths, strict=True)] for row in rows]
    )
