"""Child runs: a step returns ``spawn(state, children=[(workflow, state), ...])``, the
run waits (status ``waiting_children``, holding nothing) until every child is
finished, and its next step reads their outcomes (``ctx.children``, and
``state[then]`` when ``then=`` names a key).

Children are ordinary runs of their workflows, with snapshots of their own; each
records its parent (``WorkflowRun.parent_coordination_id``). How it holds up:

* **Once.** The children's run rows and seeds are written in the transaction that
  saves the spawning step's snapshot and pauses the run (``Spawn.persist_with``), at
  ids made of a key the snapshot records (``<parent>.<n>.<key>``): a crash before it
  commits leaves no child, and the step runs again; after it, the children exist
  exactly once. (With a snapshot store on another database than the runs, the
  snapshot is saved on its own: a crash just after leaves a spawn without children,
  and the run fails with ``ChildrenLostError``'s reason, saying how to run the step
  again.) A fork of the spawning snapshot waits for the same children. The children
  are then started through the execution provider (``on_paused``); one a crash left
  unstarted is ``running`` and unclaimed, and the recovery sweep continues it.
* **Waking the parent.** A child that finishes (completed, failed or cancelled) checks,
  after its own commit, whether all its siblings have finished; the last one to
  commit sees them all and continues the parent through the provider. The sweep
  does the same for a parent whose last child's check was lost in a crash.
* **Early calls.** ``run()``/``resume()`` of a parent whose children are not all
  finished runs nothing: it waits again.
* **Cancel.** Cancelling a parent cancels its unfinished children.

A child's outcome (``ChildResult``) is its status, its final state (its latest
snapshot's) and its failure or cancel reason.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from django.db.models import Exists, OuterRef
from django.utils import timezone

from ...common.app_models import models
from ...common.json_metadata import json_object
from ..definition.metadata import LAST_STEP, WORKFLOW_DONE, WORKFLOW_NAME
from ..definition.steps import Pause
from ..runs.records import RunConflictError, RunRecords, RunStatus
from ..storage.snapshot import WorkflowSnapshot, new_snapshot_id

logger = logging.getLogger("flowwarden_django.workflows")

#: On the spawning step's snapshot: JSON ``{"workflows": [...], "then": key or null}``.
CHILDREN = "workflow.children"
#: Child statuses the parent waits for: a child in one of these is finished.
FINISHED = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)
#: The most children one ``spawn`` may start.
MAX_CHILDREN = 1000


@dataclasses.dataclass(frozen=True)
class ChildResult:
    """How one child run ended: ``status`` (completed, failed or cancelled), its
    final ``state`` and, failed or cancelled, the ``reason``."""

    coordination_id: str
    workflow: str
    status: str
    state: Any
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Spawn(Pause):
    """Persist *state*, start *children* (``(workflow name, initial state)`` pairs) and
    wait until every one has finished (see the module)."""

    children: tuple[tuple[str, Any], ...] = ()
    then: str | None = None
    #: What the children's ids are made of (random per spawn; kept in the metadata,
    #: so a fork of the spawning snapshot waits for the same children).
    key: str = ""
    status: ClassVar[str] = RunStatus.WAITING_CHILDREN

    def snapshot_metadata(self) -> dict[str, str]:
        names = [name for name, _ in self.children]
        return {CHILDREN: json.dumps({"workflows": names, "then": self.then, "key": self.key})}

    def persist_with(self, workflow: Any, snapshot: Any) -> None:
        db = workflow.runs.db
        for index, (name, state) in enumerate(self.children, start=1):
            _create_child(db, workflow.coordination_id, self.key, index, name, state)

    def on_paused(self, workflow: Any, snapshot: Any) -> None:
        for cid in child_ids(workflow.coordination_id, snapshot):
            start_child(cid, workflow.runs.db)


def spawn(state: Any, children: Iterable[tuple[Any, Any]], *, then: str | None = None) -> Spawn:
    """Start *children*, ``(workflow, initial state)`` pairs (a workflow's name or its
    ``WorkflowDefinition``), and wait until all have finished; the next step gets
    their ``ChildResult``\\ s as ``ctx.children`` and, when *then* names a key, in
    ``state[then]`` (as dicts; *state* must then be a dict). See the module."""
    from ..definition.registry import workflow_registry

    pairs = []
    for pair in children:
        try:
            workflow, child_state = pair
        except (TypeError, ValueError):
            raise TypeError(f"a child is a (workflow, state) pair, not {pair!r}") from None
        name = workflow if isinstance(workflow, str) else getattr(workflow, "name", None)
        if not isinstance(name, str) or name not in workflow_registry:
            raise ValueError(f"child workflow {workflow!r} is not defined (Workflow.define)")
        pairs.append((name, child_state))
    if not pairs:
        raise ValueError("spawn() needs at least one child")
    if len(pairs) > MAX_CHILDREN:
        raise ValueError(f"spawn() starts at most {MAX_CHILDREN} children, not {len(pairs)}")
    if then is not None and (not isinstance(then, str) or not isinstance(state, dict)):
        raise ValueError("then= names a key of the state, which must then be a dict")
    return Spawn(state, children=tuple(pairs), then=then, key=new_snapshot_id()[:12])


def spawned(snapshot: WorkflowSnapshot) -> dict[str, Any] | None:
    """What the spawning *snapshot* recorded (``{"workflows", "then"}``), else ``None``."""
    return json_object(snapshot.metadata, CHILDREN)


def child_id(parent: str, key: str, index: int) -> str:
    """The coordination id of child *index* (1-based) of the spawn *key*."""
    cid = f"{parent}.{index}.{key}"
    if len(cid) <= 255:
        return cid
    digest = hashlib.sha256(parent.encode()).hexdigest()[:24]
    return f"{digest}.{index}.{key}"


def child_ids(parent: str, snapshot: WorkflowSnapshot) -> list[str]:
    """The children of the spawning *snapshot*, in order (none for another snapshot)."""
    found = spawned(snapshot)
    if found is None:
        return []
    count = len(found.get("workflows") or [])
    key = str(found.get("key") or snapshot.id[:12])
    return [child_id(parent, key, index) for index in range(1, count + 1)]


def _create_child(db: str, parent: str, key: str, index: int, name: str, state: Any) -> None:
    from ..definition.registry import workflow_registry

    definition = workflow_registry.get(name)
    cid = child_id(parent, key, index)
    now = timezone.now()
    seed = WorkflowSnapshot(
        id=new_snapshot_id(),
        coordination_id=cid,
        state=state,
        agent_name=name,
        seq=1,
        metadata={LAST_STEP: "", WORKFLOW_NAME: name, WORKFLOW_DONE: "false"},
    )
    existing = models.WorkflowRun.objects.using(db).filter(pk=cid).first()
    if existing is not None:
        if existing.parent_coordination_id != parent:
            raise RunConflictError(f"coordination {cid!r} exists and is not a child of {parent!r}")
        return
    store = definition.workflow(cid).store
    saved = store.latest(cid) or store.save(seed)
    models.WorkflowRun.objects.using(db).create(
        coordination_id=cid,
        workflow_name=name,
        workflow_version=definition.version,
        status=RunStatus.RUNNING,
        head_snapshot_id=saved.id,
        parent_coordination_id=parent,
        created_at=now,
        updated_at=now,
    )


def start_child(coordination_id: str, using: str) -> None:
    """Continue child *coordination_id* through the configured provider; a failure is
    logged (the child is running and unclaimed: the recovery sweep continues it)."""
    from ..definition.registry import workflow_for

    try:
        workflow_for(coordination_id, using=using).run()
    except Exception:
        logger.warning(
            "workflow run %s: starting it failed; the recovery sweep continues it",
            coordination_id,
            exc_info=True,
        )


def children_results(
    parent: str, snapshot: WorkflowSnapshot, using: str
) -> tuple[ChildResult, ...] | None:
    """The outcomes of the children of spawning *snapshot*, in order; ``None`` while
    one of them has not finished (or does not exist)."""
    from ..definition.registry import store_for_workflow

    ids = child_ids(parent, snapshot)
    rows = {
        run.pk: run
        for run in models.WorkflowRun.objects.using(using).filter(
            pk__in=ids, parent_coordination_id=parent
        )
    }
    if not rows and ids:
        raise ChildrenLostError(
            f"the {len(ids)} child runs run {parent} spawned do not exist: its spawning "
            "snapshot was saved, but not the transaction that makes them (a crash, with a "
            "snapshot store on another database than the runs); fork the run from the "
            "snapshot before it to run that step again"
        )
    if len(rows) != len(ids) or any(run.status not in FINISHED for run in rows.values()):
        return None
    results = []
    for cid in ids:
        run = rows[cid]
        head = store_for_workflow(run.workflow_name).latest(cid)
        state = None if head is None else head.state
        results.append(ChildResult(cid, run.workflow_name, run.status, state, run.failure_reason))
    return tuple(results)


class ChildrenLostError(RuntimeError):
    """A spawning snapshot's children were never made (see ``children_results``)."""


def notify_parent(child: Any) -> bool:
    """After child run *child* finished (its status committed): continue its parent if
    that waits for its children and all have finished. True if it did."""
    parent = getattr(child, "parent_coordination_id", None)
    if not parent:
        return False
    return continue_if_ready(parent, child._state.db or RunRecords().db)


def continue_if_ready(parent: str, db: str) -> bool:
    """Continue *parent* through the provider if it waits for its children, no runner
    holds it, and all have finished (``wake_parent``); True if it did. A failure to
    continue it is logged: it is ``running`` then, and the recovery sweep goes on."""
    if not wake_parent(parent, db):
        return False
    from ..definition.registry import workflow_for

    logger.info("workflow run %s: its children have finished; continuing it", parent)
    try:
        workflow_for(parent, using=db).run()
    except Exception:
        logger.warning(
            "workflow run %s: continuing it after its children failed; the recovery "
            "sweep continues it",
            parent,
            exc_info=True,
        )
    return True


def _unfinished_children() -> Any:
    return models.WorkflowRun.objects.filter(parent_coordination_id=OuterRef("pk")).exclude(
        status__in=FINISHED
    )


def wake_parent(parent: str, using: str) -> bool:
    """Make *parent* ``running`` if it waits for its children, is unclaimed, and none
    of its children is unfinished: one conditional ``UPDATE``; True if it did."""
    rows = (
        models.WorkflowRun.objects.using(using)
        .filter(pk=parent, status=RunStatus.WAITING_CHILDREN, runner="")
        .filter(~Exists(_unfinished_children()))
    )
    return rows.update(status=RunStatus.RUNNING, updated_at=timezone.now()) == 1


def parents_ready(*, using: str | None = None, limit: int | None = 100) -> list[Any]:
    """Parents waiting for children that have all finished, oldest first (at most
    *limit*): the sweep continues them (a child's check lost in a crash)."""
    rows = (
        models.WorkflowRun.objects.using(RunRecords(using).db)
        .filter(status=RunStatus.WAITING_CHILDREN, runner="")
        .filter(~Exists(_unfinished_children()))
        .order_by("updated_at", "coordination_id")
    )
    return list(rows if limit is None else rows[:limit])


def unfinished_children_of(parent: str, using: str) -> Sequence[str]:
    """The coordination ids of *parent*'s children that have not finished."""
    rows = models.WorkflowRun.objects.using(using).filter(parent_coordination_id=parent)
    return list(rows.exclude(status__in=FINISHED).values_list("pk", flat=True))
