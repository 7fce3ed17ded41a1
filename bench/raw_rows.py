"""The rows the raw anchors of ``bench/workflow_providers.py`` write (the raw Celery
chain and the raw temporalio worker): snapshot-shaped rows, one single-row ``INSERT``
each, built without Django (the raw temporalio worker has none)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

#: The snapshot table (``SnapshotRecord``'s) and the columns every row fills.
TABLE = "flowwarden_django_snapshotrecord"
COLUMNS = (
    "id",
    "parent_id",
    "coordination_id",
    "seq",
    "agent_name",
    "state",
    "state_type",
    "metadata",
    "created_at",
)


def insert_sql() -> str:
    """The single-row ``INSERT`` of a snapshot-shaped row."""
    names = ", ".join(f'"{column}"' for column in COLUMNS)
    return f'INSERT INTO "{TABLE}" ({names}) VALUES ({", ".join(["%s"] * len(COLUMNS))})'


def row(cid: str, seq: int, parent: str | None, state: dict[str, Any], name: str) -> tuple:
    """One row as a step of the benchmark workflow writes it."""
    metadata = {"workflow.done": "false", "workflow.lastStep": name, "workflow.name": "raw"}
    return (
        uuid.uuid4().hex,
        parent,
        cid,
        seq,
        "raw",
        json.dumps(state, separators=(",", ":")),
        "dict",
        json.dumps(metadata, separators=(",", ":"), sort_keys=True),
        datetime.now(UTC),
    )
