"""Which trace an execution of a run continues (``common.tracing``): the trace context
the run's seed snapshot keeps, read once per run and process."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from ...common import tracing
from ..storage.snapshot import CheckpointQuery

_seen = tracing.HeadersCache()


def trace_parent(workflow: Any, head: Any) -> dict[str, str] | None:
    """The trace-context headers *workflow*'s run started in (``None``: none, or
    nothing records); *head*: the run's latest snapshot when known (the seed, often)."""
    if not tracing.recording():
        return None
    cid = workflow.coordination_id
    found = _seen.get(cid)
    if found is None:
        if head is not None and head.seq == 1:
            seed = head
        else:
            query = CheckpointQuery(coordination_id=cid, limit=1, with_state=False)
            seeds = workflow.store.list(query)
            seed = seeds[0] if seeds else None
        if seed is None:  # a run this execution starts: the current context is its own
            return None
        found = tracing.headers_of(seed.metadata)
        _seen.put(cid, found)
    return found or None


def run_span(workflow: Any, head: Any) -> AbstractContextManager[Any]:
    """The ``flowwarden.workflow.run`` span of one execution of *workflow*'s run (a
    no-op when nothing records); *head* as ``trace_parent`` takes it."""
    parent = trace_parent(workflow, head)
    return tracing.span("flowwarden.workflow.run", lambda: run_attributes(workflow), parent=parent)


def run_attributes(workflow: Any) -> dict[str, Any]:
    """The attributes of a run's spans."""
    return {
        "flowwarden.coordination_id": workflow.coordination_id,
        "flowwarden.workflow": workflow.name,
        "flowwarden.workflow.version": workflow.version,
    }
