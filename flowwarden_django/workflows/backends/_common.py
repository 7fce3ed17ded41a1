"""What the snapshot store backends share: query checks and the metadata text."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from typing import Any

from django.core import checks

from ..storage.serializers import json_text_encoder, resolve_serializer
from ..storage.snapshot import CheckpointQuery, UnreadableSnapshot, WorkflowSnapshot

logger = logging.getLogger("flowwarden_django.workflows")


def check_query(query: CheckpointQuery | None) -> CheckpointQuery:
    """*query* (or "everything"), after checking what the dataclass does not."""
    if query is None:
        return CheckpointQuery()
    for name in ("since", "until"):
        moment = getattr(query, name)
        if moment is not None and moment.tzinfo is None:
            raise ValueError(f"CheckpointQuery.{name} must be timezone-aware")
    if not isinstance(query.limit, int) or query.limit < 0:
        raise ValueError(f"CheckpointQuery.limit must be 0 (all) or more, not {query.limit!r}")
    if query.after is not None and query.after.seq is None:
        raise ValueError("CheckpointQuery.after must be a snapshot returned by the store")
    if query.coordination_ids is not None:
        if isinstance(query.coordination_ids, str) or not all(
            isinstance(cid, str) for cid in query.coordination_ids
        ):
            raise ValueError("CheckpointQuery.coordination_ids must be a set of strings")
        query = dataclasses.replace(query, coordination_ids=frozenset(query.coordination_ids))
    return query


def unreadable(snapshot: WorkflowSnapshot | Any, exc: Exception) -> UnreadableSnapshot:
    """The listing row of *snapshot* (a snapshot, or a stored row with the same
    fields) whose stored text could not be read."""
    logger.warning(
        "snapshot %s of %s cannot be read: %s: %s",
        snapshot.id,
        snapshot.coordination_id,
        type(exc).__name__,
        exc,
    )
    place = {name: getattr(snapshot, name) for name in _PLACE_FIELDS}
    return UnreadableSnapshot(**place, error=f"{type(exc).__name__}: {exc}"[:200])


#: What an ``UnreadableSnapshot`` keeps of its row: its place in the chain.
_PLACE_FIELDS = ("id", "coordination_id", "parent_id", "agent_name", "seq", "created_at")


_dump_metadata = json_text_encoder(sort_keys=True)


def dump_metadata(metadata: Mapping[str, str]) -> str:
    """The stored text of a snapshot's metadata (a JSON object)."""
    return _dump_metadata(metadata if type(metadata) is dict else dict(metadata))


def load_metadata(text: str | None) -> dict[str, str]:
    """The metadata a stored text holds (``{}`` for empty text)."""
    if not text:
        return {}
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("stored snapshot metadata is not a JSON object")
    return value


def check_serializer_option(where: str, value: Any) -> list[checks.CheckMessage]:
    """An E008 error when ``OPTIONS["serializer"]`` names no serializer."""
    try:
        resolve_serializer(value)
    except ValueError as exc:
        return [
            checks.Error(
                f'{where}["serializer"] = {value!r} {exc}.',
                hint="Use the dotted path of a StateSerializer subclass, for example "
                "flowwarden_django.workflows.storage.serializers.JsonStateSerializer.",
                id="flowwarden_django.E008",
            )
        ]
    return []
