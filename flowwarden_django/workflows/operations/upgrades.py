"""Upgrades: moving unfinished runs from one version of a workflow to another.

A run continues on the definition of the version it records (``Workflow.define(...,
version=N)``). When that version is retired, its runs are moved with an upgrade
declared beside the definitions::

    Workflow.define_upgrade(
        "orders", from_version=1, to_version=2,
        steps={"reserve": "reserve_stock", "charge_card": None},
        state=lambda state: {**state, "currency": "EUR"},
    )

*steps* maps the step a run of version 1 stands after (its last completed step) to
the step of version 2 it stands after from then on: a renamed step to its new name, a
removed step to the step before it in version 2, or ``None`` for "before the first
step of version 2". A step of the same name in both versions needs no entry. *state*
turns the run's state into the state version 2 expects (default: unchanged). A run
whose last step jumped (``advance(state, to="poll")``: ``definition.graph``) continues
at the jump target's counterpart: the same name in version 2, or the step its entry
maps it to (``None``: the first step); a target version 2 lacks and *steps* does not
map refuses the upgrade, as an unmapped last step does.

``upgrade_runs`` (``manage.py flowwarden_workflows upgrade``, the admin's "Upgrade"
action) applies it to every unfinished run of version 1 that no runner holds, each in
one transaction: the run row is locked and checked to be still on version 1, a
snapshot is saved (the child of the run's head, with the new position and state and
``workflow.upgrade`` metadata saying from which version, by whom, from which step),
the run moves to version 2 at that snapshot, and an approval the run waits for
follows it (so do a wait for a message and a message delivered to it). A run is
upgraded at most once per version (the second attempt finds it on version 2), so
running the command again is harmless; upgrades chain (1 to 2, then 2 to 3). A run
that was stopped as ``needs_upgrade`` is then continued; a paused or failed run keeps
its status (``resume()`` continues it as before).

With a snapshot store on another database than the run rows (Redis, MongoDB), the
snapshot is saved before the run row's transaction commits: a crash in between
leaves the upgrade snapshot as the run's latest while the run is still on the old
version. The engine never runs the old version from it (the run stops as
``needs_upgrade``), and the next attempt adopts it as it is. The run row never
moves without its snapshot.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from ...common.app_models import models
from ...common.json_metadata import json_object
from ..definition.metadata import (
    FURTHEST_STEP,
    LAST_STEP,
    NEXT_STEP,
    WORKFLOW_DONE,
    WORKFLOW_NAME,
)
from ..definition.patches import PATCHES_METADATA
from ..definition.registry import RegisteredWorkflow, workflow_registry
from ..runs.records import HANDOFF_PREFIX, RunRecords, RunStatus, between_steps, unclaimed
from ..storage.snapshot import WorkflowSnapshot
from ..waiting.approvals.request import REQUEST_METADATA
from ..waiting.messages.waiting import WAIT_METADATA

logger = logging.getLogger("flowwarden_django.workflows")

#: The snapshot metadata key of an upgrade: JSON ``{"from": 1, "to": 2, "by": ...,
#: "step": the step the run stood after before}``.
UPGRADE_METADATA = "workflow.upgrade"


class UpgradeError(ValueError):
    """An upgrade that cannot be declared (bad versions, a bad mapping)."""


@dataclasses.dataclass(frozen=True)
class WorkflowUpgrade:
    """How runs of version *from_version* of workflow *name* move to *to_version*:
    the step each stands after (*steps*: old name to new name, or ``None`` for
    "before the first step"; names in both versions map to themselves) and its state
    (*state*, a function of the old state; default: unchanged)."""

    name: str
    from_version: int
    to_version: int
    steps: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    state: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        for version in (self.from_version, self.to_version):
            if isinstance(version, bool) or not isinstance(version, int) or version < 1:
                raise UpgradeError(f"a workflow version is an integer >= 1, not {version!r}")
        if self.from_version == self.to_version:
            raise UpgradeError(f"an upgrade goes to another version, not {self.to_version}")
        for old, new in self.steps.items():
            if not isinstance(old, str) or not (new is None or isinstance(new, str)):
                raise UpgradeError(
                    f"steps maps step names to step names or None, not {old!r}: {new!r}"
                )
        if self.state is not None and not callable(self.state):
            raise UpgradeError(f"state is a function of the old state, not {self.state!r}")
        object.__setattr__(self, "steps", dict(self.steps))

    def position(self, last_step: str, target: RegisteredWorkflow) -> str:
        """The step of *target* a run standing after *last_step* stands after
        (``""``: before its first step); ``UpgradeError`` when there is none."""
        names = {s.name for s in target.steps}
        if last_step in self.steps:
            new = self.steps[last_step] or ""
            if new and new not in names:
                raise UpgradeError(
                    f"the upgrade maps step {last_step!r} to {new!r}, which is not a step of "
                    f"version {self.to_version} ({', '.join(s.name for s in target.steps)})"
                )
            return new
        if not last_step or last_step in names:
            return last_step
        raise UpgradeError(
            f"step {last_step!r} of version {self.from_version} is not a step of version "
            f"{self.to_version}; map it in the upgrade's steps (to the step of version "
            f"{self.to_version} the run stands after, or None for before the first)"
        )

    def continues_at(self, next_step: str, target: RegisteredWorkflow) -> str:
        """The step of *target* a run whose last step jumped to *next_step* continues
        at: the step *steps* maps it to (``None``: the first), else the same name;
        ``UpgradeError`` when there is none."""
        names = [s.name for s in target.steps]
        if next_step in self.steps:
            new = self.steps[next_step]
            if new is None:
                return names[0]
            if new not in names:
                raise UpgradeError(
                    f"the upgrade maps step {next_step!r} to {new!r}, which is not a step of "
                    f"version {self.to_version} ({', '.join(names)})"
                )
            return new
        if next_step in names:
            return next_step
        raise UpgradeError(
            f"the run continues at step {next_step!r} (its last step jumped there), which "
            f"version {self.to_version} lacks; map it in the upgrade's steps (to the step "
            f"of version {self.to_version} the run continues at)"
        )

    def moved_position(self, head: WorkflowSnapshot, target: RegisteredWorkflow) -> dict[str, str]:
        """The position entries of the upgrade snapshot of a run at *head* that has
        jumped (``graph.position_metadata``): its jump target and the furthest step
        it completed, in *target*'s names. ``UpgradeError`` for a jump target it
        cannot map; a furthest step it cannot map is left out."""
        moved = {}
        if head.metadata.get(NEXT_STEP):
            moved[NEXT_STEP] = self.continues_at(head.metadata[NEXT_STEP], target)
        if head.metadata.get(FURTHEST_STEP):
            try:
                furthest = self.position(head.metadata[FURTHEST_STEP], target)
            except UpgradeError:
                furthest = ""
            if furthest:
                moved[FURTHEST_STEP] = furthest
        return moved


class UpgradeRegistry:
    """The declared upgrades, by workflow name and the version they move runs from.
    Thread-safe."""

    def __init__(self) -> None:
        self._upgrades: dict[tuple[str, int], WorkflowUpgrade] = {}
        self._lock = threading.Lock()

    def register(self, upgrade: WorkflowUpgrade) -> None:
        with self._lock:
            self._upgrades[(upgrade.name, upgrade.from_version)] = upgrade

    def unregister(self, name: str, from_version: int | None = None) -> None:
        with self._lock:
            for key in [k for k in self._upgrades if k[0] == name]:
                if from_version is None or key[1] == from_version:
                    del self._upgrades[key]

    def get(self, name: str, from_version: int) -> WorkflowUpgrade | None:
        with self._lock:
            return self._upgrades.get((name, from_version))

    def all(self) -> list[WorkflowUpgrade]:
        """Every declared upgrade, by workflow name then version."""
        with self._lock:
            return [self._upgrades[key] for key in sorted(self._upgrades)]


#: The process's declared upgrades (``Workflow.define_upgrade``).
upgrade_registry = UpgradeRegistry()


@dataclasses.dataclass(frozen=True)
class UpgradeOutcome:
    """What upgrading one run did (or, in a dry run, would do): *upgraded* is True
    when it moved (or would move) to *to_version*; *reason* says why not."""

    coordination_id: str
    workflow: str
    from_version: int
    to_version: int
    from_step: str = ""
    to_step: str = ""
    status: str = ""
    upgraded: bool = False
    continued: bool = False
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def upgradable_runs(
    name: str | None = None,
    *,
    using: str | None = None,
    coordination_ids: list[str] | None = None,
) -> Any:
    """The unfinished runs on a version some declared upgrade moves runs from."""
    rows = models.WorkflowRun.objects.using(RunRecords(using).db).exclude(
        status__in=RunStatus.FINAL
    )
    declared = Q(pk__in=[])
    for upgrade in upgrade_registry.all():
        if name is None or upgrade.name == name:
            declared |= Q(workflow_name=upgrade.name, workflow_version=upgrade.from_version)
    rows = rows.filter(declared)
    if coordination_ids is not None:
        rows = rows.filter(pk__in=coordination_ids)
    return rows.order_by("updated_at", "pk")


def upgrade_runs(
    name: str | None = None,
    *,
    using: str | None = None,
    coordination_ids: list[str] | None = None,
    dry_run: bool = False,
    by: str = "",
    limit: int | None = None,
    progress: Callable[[UpgradeOutcome], None] | None = None,
) -> list[UpgradeOutcome]:
    """Apply the declared upgrades to the unfinished runs they apply to (of workflow
    *name*, of *coordination_ids*; at most *limit*); one outcome per run, in order.
    *dry_run*: work out each run's new position and state, write nothing. *by*: who
    upgrades (recorded with each upgrade snapshot)."""
    outcomes = []
    rows = upgradable_runs(name, using=using, coordination_ids=coordination_ids)
    keys = rows.values_list("pk", flat=True)
    cids = list(keys[:limit] if limit else keys)
    for cid in cids:
        outcome = upgrade_run(cid, using=using, dry_run=dry_run, by=by)
        outcomes.append(outcome)
        if progress is not None:
            progress(outcome)
    return outcomes


def upgrade_run(
    coordination_id: str, *, using: str | None = None, dry_run: bool = False, by: str = ""
) -> UpgradeOutcome:
    """Move one run through every declared upgrade from its version (1 to 2, then
    2 to 3...), each hop in its own transaction, then continue it when it had been
    stopped as ``needs_upgrade`` or was running; its outcome (the first and last
    versions)."""
    records = RunRecords(using)
    first: UpgradeOutcome | None = None
    outcome: UpgradeOutcome | None = None
    resumed = False
    while True:
        hop = _upgrade_once(coordination_id, records, dry_run=dry_run, by=by)
        if hop is None:
            break
        if outcome is not None and outcome.upgraded and not hop.upgraded:
            # Moved part of the way: say so, and where it stopped.
            stopped = f"stopped at version {hop.from_version}: {hop.reason}"
            outcome = dataclasses.replace(outcome, reason=stopped)
            break
        outcome = (
            hop
            if first is None
            else dataclasses.replace(
                hop, from_version=first.from_version, from_step=first.from_step
            )
        )
        first = first or hop
        if not hop.upgraded or dry_run:
            break
        resumed = resumed or hop.continued
    if outcome is None:
        record = records.get(coordination_id)
        return UpgradeOutcome(
            coordination_id,
            record.workflow_name if record else "",
            record.workflow_version if record else 0,
            record.workflow_version if record else 0,
            reason="no declared upgrade applies to it" if record else "no such run",
        )
    if resumed and outcome.upgraded and not dry_run:
        _continue(coordination_id, records)
    return dataclasses.replace(outcome, continued=resumed and outcome.upgraded and not dry_run)


def _upgrade_once(
    cid: str, records: RunRecords, *, dry_run: bool, by: str
) -> UpgradeOutcome | None:
    """One hop; ``None`` when no declared upgrade starts at the run's version."""
    record = records.get(cid)
    if record is None or record.status in RunStatus.FINAL:
        return None
    upgrade = upgrade_registry.get(record.workflow_name, record.workflow_version)
    if upgrade is None:
        return None
    refused = _outcome_of(record, upgrade)
    if not workflow_registry.defines(upgrade.name, upgrade.to_version):
        return refused(reason=f"version {upgrade.to_version} is not defined in this process")
    target = workflow_registry.get(upgrade.name, upgrade.to_version)
    store = target.workflow(cid).store
    db = records.db
    with transaction.atomic(using=db):
        rows = models.WorkflowRun.objects.using(db).select_for_update()
        run = (
            rows.filter(pk=cid, workflow_version=upgrade.from_version)
            .exclude(status__in=RunStatus.FINAL)
            .first()
        )
        if run is None:
            return None  # upgraded (or finished) meanwhile
        refused = _outcome_of(run, upgrade)
        # The claim's lease on the database's clock, as the runners compare it. A run
        # handed between steps is taken: the step it was handed to, if it runs, has
        # its save refused and runs again on the new version.
        free = unclaimed() | between_steps()
        if not rows.filter(free, pk=cid).exists():
            return refused(reason=f"runner {run.runner} holds it; upgrade it once it let go")
        head = store.latest(cid)
        if head is None:
            return refused(reason="it has no snapshot")
        interrupted = _interrupted_upgrade(head, run, upgrade)
        if interrupted is not None:
            # An earlier attempt saved its snapshot (a store outside this database)
            # and stopped before the run moved: take that snapshot as it is.
            last_step, new_step = interrupted, head.metadata.get(LAST_STEP, "")
        else:
            last_step = head.metadata.get(LAST_STEP, "")
            try:
                new_step = upgrade.position(last_step, target)
                moved = upgrade.moved_position(head, target)
                new_state = head.state if upgrade.state is None else upgrade.state(head.state)
            except Exception as exc:
                return refused(from_step=last_step, reason=f"{type(exc).__name__}: {exc}")
        resumes = run.status in (RunStatus.NEEDS_UPGRADE, RunStatus.RUNNING)
        status = RunStatus.RUNNING if resumes else run.status
        done = _outcome_of(
            run, upgrade, from_step=last_step, to_step=new_step, status=status, upgraded=True
        )
        if dry_run:
            return done(continued=resumes)
        if interrupted is not None:
            saved = head
        else:
            snapshot = head.successor(
                new_state,
                agent_name=upgrade.name,
                metadata={**_upgraded_metadata(head, upgrade, new_step, by), **moved},
            )
            saved = store.save(snapshot)
        models.Approval.objects.using(db).filter(snapshot_id=run.head_snapshot_id).update(
            snapshot_id=saved.id, step_name=new_step
        )
        if run.head_snapshot_id:  # a message delivered to the wait follows it
            models.WorkflowMessage.objects.using(db).filter(
                delivered_to=run.head_snapshot_id
            ).update(delivered_to=saved.id)
        fields: dict[str, Any] = {
            "workflow_version": upgrade.to_version,
            "head_snapshot_id": saved.id,
            "last_step": new_step,
            "status": status,
            "updated_at": Now(),
        }
        if run.status == RunStatus.NEEDS_UPGRADE:
            fields["failure_reason"] = ""
        if run.runner.startswith(HANDOFF_PREFIX):
            fields.update(runner="", claimed_until=None)
        moved = rows.filter(free, pk=cid, workflow_version=upgrade.from_version)
        if moved.update(**fields) != 1:  # cannot happen under the row lock; never half
            raise RuntimeError(f"run {cid} changed while it was being upgraded")
    logger.info(
        "workflow %s (%s) upgraded from version %d (after step %r) to %d (after step %r)%s",
        upgrade.name,
        cid,
        upgrade.from_version,
        last_step,
        upgrade.to_version,
        new_step,
        f" by {by}" if by else "",
    )
    return done(continued=resumes)


def _interrupted_upgrade(head: WorkflowSnapshot, run: Any, upgrade: WorkflowUpgrade) -> str | None:
    """The step the run stood after when an earlier attempt of *upgrade* saved
    *head* (its upgrade snapshot, the child of the run's head) and was interrupted
    before the run moved; ``None`` when *head* is no such snapshot."""
    found = upgrade_of(head)
    if found is None or head.parent_id != run.head_snapshot_id:
        return None
    if (found.get("from"), found.get("to")) != (upgrade.from_version, upgrade.to_version):
        return None
    return str(found.get("step", ""))


def upgrade_of(snapshot: WorkflowSnapshot) -> dict[str, Any] | None:
    """The ``workflow.upgrade`` record of an upgrade snapshot (``None`` for others)."""
    return json_object(snapshot.metadata, UPGRADE_METADATA)


def _outcome_of(run: Any, upgrade: WorkflowUpgrade, **fields: Any) -> Callable[..., UpgradeOutcome]:
    """An outcome of *run* under *upgrade*, completed by the keyword arguments given."""

    def make(**more: Any) -> UpgradeOutcome:
        return UpgradeOutcome(
            **{
                "coordination_id": run.coordination_id,
                "workflow": upgrade.name,
                "from_version": upgrade.from_version,
                "to_version": upgrade.to_version,
                "status": run.status,
                **fields,
                **more,
            }
        )

    return make


def _upgraded_metadata(
    head: WorkflowSnapshot, upgrade: WorkflowUpgrade, new_step: str, by: str
) -> dict[str, str]:
    # What it waits for (an approval, a message), its patch answers.
    kept = (REQUEST_METADATA, WAIT_METADATA, PATCHES_METADATA)
    metadata = {key: value for key, value in head.metadata.items() if key in kept}
    record = {
        "from": upgrade.from_version,
        "to": upgrade.to_version,
        "step": head.metadata.get(LAST_STEP, ""),
        "by": by,
    }
    metadata.update(
        {
            LAST_STEP: new_step,
            WORKFLOW_NAME: upgrade.name,
            WORKFLOW_DONE: head.metadata.get(WORKFLOW_DONE, "false"),
            UPGRADE_METADATA: json.dumps(record, separators=(",", ":")),
        }
    )
    return metadata


def _continue(cid: str, records: RunRecords) -> None:
    """Continue an upgraded run that had been stopped (or was running) with the
    configured provider; an error is logged (the recovery sweep, or a resume,
    continues it)."""
    from ..definition.registry import workflow_for

    try:
        workflow_for(cid, using=records.db).run()
    except Exception:
        logger.exception("run %s was upgraded, but continuing it failed", cid)
