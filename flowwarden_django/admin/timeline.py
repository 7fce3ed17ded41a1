"""Where the run timeline builder was first written; it is now
``flowwarden_django.workflows.operations.timeline``, shared by the admin and
``manage.py flowwarden_workflows show``. Kept so that imports of this internal
module go on working."""

from ..workflows.operations.timeline import (
    MAX_CHILDREN,
    MAX_SNAPSHOTS,
    MIN_WIDTH,
    OUTCOMES,
    WAIT_KINDS,
    Bar,
    ChildRun,
    Tick,
    Timeline,
    build_timeline,
    duration_text,
    head_chain,
    load_timeline,
)

__all__ = [
    "MAX_CHILDREN",
    "MAX_SNAPSHOTS",
    "MIN_WIDTH",
    "OUTCOMES",
    "WAIT_KINDS",
    "Bar",
    "ChildRun",
    "Tick",
    "Timeline",
    "build_timeline",
    "duration_text",
    "head_chain",
    "load_timeline",
]
