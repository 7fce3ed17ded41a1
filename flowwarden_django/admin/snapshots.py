"""How the admin shows a run's snapshots: as a tree, one page at a time, and each
state as JSON with the line diff against its parent.

Snapshots are read through the ``SnapshotStore`` SPI in ``seq`` order, a page of
``PAGE_SIZE`` at a time (keyset paging with ``CheckpointQuery.after``). A parent
always has a lower ``seq`` than its children, so each page can be attached to the
pages before it: a snapshot's first child (lowest ``seq``) continues its parent's
chain, and every later child starts a branch under the parent (a fork). The browser
applies the same rule to the pages it fetches (``snapshot_tree.js``).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable
from typing import Any

from ..workflows.definition.metadata import LAST_STEP
from ..workflows.storage.snapshot import CheckpointQuery, WorkflowSnapshot
from ..workflows.storage.store import SnapshotStore

#: Snapshots per page of the tree (the first page load shows one page).
PAGE_SIZE = 100


class NotListableError(Exception):
    """The store cannot list a coordination's snapshots (its ``list`` is not implemented)."""


@dataclasses.dataclass(frozen=True)
class TreePage:
    """One page of a coordination's snapshots, oldest first; ``after`` is the ``seq``
    it follows (0 for the first page), ``next_after`` the ``seq`` the next page follows
    (``None`` when this is the last)."""

    snapshots: list[WorkflowSnapshot]
    after: int
    next_after: int | None


def load_page(
    store: SnapshotStore, coordination_id: str, after: int = 0, size: int = PAGE_SIZE
) -> TreePage:
    """The snapshots of *coordination_id* with ``seq`` above *after*, at most *size*.

    Raises :class:`NotListableError` when the store cannot list; its other errors
    (an undecodable row, a database error) propagate.
    """
    mark = None
    if after > 0:
        # Keyset paging only reads the mark's ordering fields (its seq).
        mark = WorkflowSnapshot(id="page-mark", coordination_id=coordination_id, seq=after)
    # Positions only: the tree never shows a state, so the store need not read any.
    query = CheckpointQuery.for_coordination(
        coordination_id, limit=size + 1, after=mark, with_state=False
    )
    try:
        found = store.list(query)
    except NotImplementedError as exc:
        raise NotListableError(str(exc) or type(store).__name__) from exc
    found.sort(key=lambda s: s.seq or 0)
    more = len(found) > size
    snapshots = found[:size]
    next_after = (snapshots[-1].seq or 0) if more and snapshots else None
    return TreePage(snapshots, after, next_after)


@dataclasses.dataclass
class TreeNode:
    """A snapshot in the drawn tree: the chain it continues and the branches under it."""

    snapshot: WorkflowSnapshot
    #: The parent is on another page (or gone): the node starts a top-level chain.
    detached: bool = False
    next: TreeNode | None = None
    branches: list[TreeNode] = dataclasses.field(default_factory=list)
    children: int = 0

    @property
    def id(self) -> str:
        return self.snapshot.id

    @property
    def seq(self) -> int | None:
        return self.snapshot.seq

    @property
    def last_step(self) -> str:
        return self.snapshot.metadata.get(LAST_STEP, "")

    @property
    def is_root(self) -> bool:
        return self.snapshot.parent_id is None

    @property
    def is_fork(self) -> bool:
        """Whether it has more than one child on the pages drawn so far."""
        return self.children > 1

    @property
    def chain(self) -> list[TreeNode]:
        """This node and the nodes that continue it, in order."""
        nodes: list[TreeNode] = []
        node: TreeNode | None = self
        while node is not None:
            nodes.append(node)
            node = node.next
        return nodes


def build_forest(snapshots: Iterable[WorkflowSnapshot]) -> list[TreeNode]:
    """The chains that start the drawing of *snapshots* (taken in ``seq`` order):
    roots, and snapshots whose parent is not among them."""
    nodes: dict[str, TreeNode] = {}
    starts: list[TreeNode] = []
    for snapshot in sorted(snapshots, key=lambda s: s.seq or 0):
        node = TreeNode(snapshot)
        parent = nodes.get(snapshot.parent_id or "")
        if parent is None:
            node.detached = snapshot.parent_id is not None
            starts.append(node)
        else:
            parent.children += 1
            if parent.next is None:
                parent.next = node
            else:
                parent.branches.append(node)
        nodes[snapshot.id] = node
    return starts


def node_badges(node: TreeNode, head_id: str | None) -> list[str]:
    """The badges of a node: ``root``, ``fork``, ``head``."""
    badges = []
    if node.is_root:
        badges.append("root")
    if node.is_fork:
        badges.append("fork")
    if head_id is not None and node.id == head_id:
        badges.append("head")
    return badges


def flatten(starts: Iterable[TreeNode]) -> list[TreeNode]:
    """Every node of the forest, in ``seq`` order."""
    found: list[TreeNode] = []
    pending: list[TreeNode] = list(starts)
    while pending:
        node = pending.pop()
        for member in node.chain:
            found.append(member)
            pending.extend(member.branches)
    return sorted(found, key=lambda n: n.seq or 0)


def describe(snapshot: WorkflowSnapshot) -> dict[str, Any]:
    """What the page's JSON says about a snapshot besides its HTML."""
    return {"id": snapshot.id, "parent_id": snapshot.parent_id, "seq": snapshot.seq}


#: Lines of unchanged text shown around each change.
DIFF_CONTEXT = 3


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
