"""Putting a run on a queue: ``Workflow.define(..., queue=...)`` for every run of a
workflow, ``start(..., queue=..., priority=..., partition_key=...)`` for one."""

from __future__ import annotations

from typing import Any

from .settings import MAX_NAME, queue_config


def check_queue_name(value: Any) -> str | None:
    """A workflow's queue as declared (``None``: none); whether it is configured is
    checked when a run starts, and by ``manage.py check``."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_NAME:
        raise ValueError(
            f"queue must be a non-blank string of at most {MAX_NAME} characters, not {value!r}"
        )
    return value


def placement(
    declared: str | None, queue: str | None, priority: int | None, partition_key: str | None
) -> dict[str, Any]:
    """The ``WorkflowRun`` fields of a run started with *queue*, *priority* and
    *partition_key* (its workflow's queue being *declared*); empty when there is
    nothing to write. ``UnknownQueueError`` for a queue not configured, ``ValueError``
    for a priority or key the queue does not take."""
    name = check_queue_name(queue) if queue is not None else declared
    if name is None:
        if priority is not None or partition_key is not None:
            raise ValueError("priority and partition_key need a queue: start(..., queue=...)")
        return {}
    config = queue_config(name)
    fields: dict[str, Any] = {}
    if queue is not None:
        fields["queue"] = name
    if priority is not None:
        if (
            isinstance(priority, bool)
            or not isinstance(priority, int)
            or not 0 <= priority <= 2**31 - 1
        ):
            raise ValueError(f"priority must be a whole number from 0 (first) up, not {priority!r}")
        if not config.priority:
            raise ValueError(
                f'queue {name!r} does not order by priority: set "priority": True in its '
                'FLOWWARDEN["WORKFLOW_QUEUES"] entry'
            )
        fields["queue_priority"] = priority
    if partition_key is not None:
        if not isinstance(partition_key, str) or len(partition_key) > 255:
            raise ValueError(
                f"partition_key must be a string of at most 255 characters, not {partition_key!r}"
            )
        if not config.partitioned:
            raise ValueError(
                f'queue {name!r} is not partitioned: set "partitioned": True in its '
                'FLOWWARDEN["WORKFLOW_QUEUES"] entry'
            )
        fields["queue_partition"] = partition_key
    return fields
