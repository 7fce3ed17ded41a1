"""Which snapshots ``SnapshotStore.prune`` removes: the rules every backend shares.

Within each coordination a snapshot is a *candidate* when no retention rule keeps it:
``keep_last=N`` keeps the N highest ``seq``; ``older_than=age`` keeps those created
at or after ``now - age``. With both, a snapshot either rule keeps is kept. A
candidate is still kept when it is

* the coordination's newest snapshot (highest ``seq``: where the run resumes);
* protected: the head of a run waiting for approval, or an id passed in; or
* an ancestor (parent, grandparent, ...) of a kept *fork*.

A fork is a snapshot that branches off an earlier snapshot instead of continuing
from the newest one: its parent is in the coordination but is not the snapshot just
before it (``parent.seq != seq - 1``). A plain chain (each step's parent is the
step before) is trimmed by the rules; a kept branch keeps its whole line back to
the root, so it never loses its origin. Ancestors are followed within the
coordination. Seqs never change, so pruning again with the same rules removes
nothing more.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime, timedelta
from typing import NamedTuple


class PruneRow(NamedTuple):
    """What the plan needs of one snapshot (no state)."""

    id: str
    parent_id: str | None
    seq: int
    created_at: datetime


def check_prune_arguments(keep_last: int | None, older_than: timedelta | None) -> None:
    """Raise ``ValueError`` unless at least one valid rule is given."""
    if keep_last is None and older_than is None:
        raise ValueError("prune needs keep_last, older_than or both")
    if keep_last is not None and (
        not isinstance(keep_last, int) or isinstance(keep_last, bool) or keep_last < 1
    ):
        raise ValueError(f"keep_last must be a positive integer, not {keep_last!r}")
    if older_than is not None and (
        not isinstance(older_than, timedelta) or older_than < timedelta(0)
    ):
        raise ValueError(f"older_than must be a timedelta of zero or more, not {older_than!r}")


def plan_prune(
    rows: Iterable[PruneRow],
    *,
    keep_last: int | None,
    cutoff: datetime | None,
    protected: Collection[str] = (),
) -> list[str]:
    """The ids of one coordination's *rows* that prune removes, oldest ``seq`` first.

    *cutoff* is ``now - older_than`` (``None`` without an age rule).
    """
    ordered = sorted(rows, key=lambda row: row.seq, reverse=True)
    if not ordered:
        return []
    kept: set[str] = set()
    for rank, row in enumerate(ordered):
        if (
            rank == 0
            or row.id in protected
            or (keep_last is not None and rank < keep_last)
            or (cutoff is not None and row.created_at >= cutoff)
        ):
            kept.add(row.id)
    by_id = {row.id: row for row in ordered}
    for row in ordered:
        if row.id in kept and _is_fork(row, by_id):
            _keep_ancestors(row, by_id, kept)
    return [row.id for row in reversed(ordered) if row.id not in kept]


def _is_fork(row: PruneRow, by_id: dict[str, PruneRow]) -> bool:
    parent = by_id.get(row.parent_id) if row.parent_id is not None else None
    return parent is not None and parent.seq != row.seq - 1


def _keep_ancestors(row: PruneRow, by_id: dict[str, PruneRow], kept: set[str]) -> None:
    seen = {row.id}
    parent_id = row.parent_id
    while parent_id is not None and parent_id in by_id and parent_id not in seen:
        seen.add(parent_id)
        kept.add(parent_id)
        parent_id = by_id[parent_id].parent_id
