"""How the actions write runs and snapshots: the command's name in hints, a
snapshot's position, step and state as text."""

from __future__ import annotations

import json
from typing import Any

from ...common.formatting import NONE_TEXT
from ...workflows import WorkflowSnapshot
from ...workflows.definition.metadata import CANCELLED, LAST_STEP

COMMAND = "manage.py flowwarden_workflows"


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
