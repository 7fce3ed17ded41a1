"""The queries behind ``OrmSnapshotStore.list``: its order, the columns of a listing
without states, the rows after a page's last one, and a page of a few coordinations."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connections
from django.db.models import Q, QuerySet

from ...models import SnapshotRecord
from ..storage.snapshot import WorkflowSnapshot

#: ``list`` order across coordinations (within one: ``seq``).
LIST_ORDER = ("created_at", "coordination_id", "seq")

#: The columns of a listing without states.
LISTED_COLUMNS = (
    "id",
    "parent_id",
    "coordination_id",
    "seq",
    "agent_name",
    "metadata",
    "created_at",
)


def rows_after(mark: WorkflowSnapshot, order: Sequence[str], newest_first: bool) -> Q:
    """Rows after *mark* in the (ascending or descending) *order* of its fields.

    With more than one field, the first one is also bounded on its own (``created_at
    <= mark``): a condition the database can seek the index to, where the ``OR`` of
    the ties alone would make it scan every row before the mark (a deep page).
    """
    op = "lt" if newest_first else "gt"
    condition = Q()
    for index, field in enumerate(order):
        ties = {name: getattr(mark, name) for name in order[:index]}
        condition |= Q(**ties, **{f"{field}__{op}": getattr(mark, field)})
    if len(order) > 1:
        condition &= Q(**{f"{order[0]}__{op}e": getattr(mark, order[0])})
    return condition


#: The most coordinations ``list`` reads as one sub-select each (see ``of_coordinations``).
PER_COORDINATION_MAX = 100


def of_coordinations(
    rows: QuerySet[SnapshotRecord], ids: Sequence[str], order: Sequence[str], limit: int
) -> QuerySet[SnapshotRecord]:
    """*rows* of the coordinations *ids*, in *order*, at most *limit* (0: all).

    A page of a few coordinations (a user who may read some runs) is read as one
    sub-select per coordination, each stopping after *limit* rows of the
    ``(coordination_id, created_at, seq)`` index, merged in *order*: what it costs
    does not depend on where those runs sit among the others, as it would with one
    ``IN`` filter, which the database may answer by scanning the whole table in
    *order* until enough rows of the few coordinations turn up. SQLite cannot limit
    the parts of a ``UNION``; there, and for many coordinations, it is one ``IN``.
    """
    features = connections[rows.db].features
    if (
        limit
        and len(ids) <= PER_COORDINATION_MAX
        and features.supports_slicing_ordering_in_compound
    ):
        # An IN of one value is planned as "=" (the run's index range).
        parts = [rows.filter(coordination_id__in=[cid]).order_by(*order)[:limit] for cid in ids]
        if len(parts) == 1:
            return parts[0]
        return parts[0].union(*parts[1:], all=True).order_by(*order)[:limit]
    rows = rows.filter(coordination_id__in=ids).order_by(*order)
    return rows[:limit] if limit else rows
