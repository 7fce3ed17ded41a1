"""A run's timeline: each step attempt, each wait and each child run as a bar on one
time axis, for the run's admin page (``templates/.../workflowrun/timeline.html``) and
``manage.py flowwarden_workflows show`` (one line per bar).

``build_timeline`` is pure: it takes the run record, the snapshots of its head's
chain, its approvals and its child runs, and returns plain dataclasses whose bars
carry their position on the axis in percent. ``load_timeline`` reads those from the
run's store and database. What a bar knows comes from what the engine records:

* an attempt: the snapshot metadata of its step (``execution.step_timings``: the
  last attempt's start, duration, worker and provider; each failed attempt's error
  class, and since 0.2 its start, duration and worker); snapshots written before
  0.2 lack the start, which is then worked out from the snapshot's time and the
  attempt's duration;
* a wait: the status a pausing step's snapshot records (``workflow.pause.status``,
  or for older snapshots its ``workflow.wakeAt`` and its approval row), from that
  snapshot until the next step's first attempt started (or until now: the wait the
  run is in is the current position); an approval wait spans its row's request and
  decision; a wait for a queue slot is known only while the run is in it;
* a child run: from its creation until its last update once it finished.

Only the newest ``MAX_SNAPSHOTS`` snapshots are read (a loop may have thousands).
The module imports the models: import it once the apps are loaded (as the admin and
the commands do), never from the ``workflows`` package itself.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ...models import Approval, WorkflowRun
from ..definition.metadata import (
    LAST_STEP,
    PAUSE_STATUS,
    WAKE_AT,
    WORKFLOW_DONE,
)
from ..execution.step_timings import AttemptError, parse_errors, step_timing_of
from ..storage.snapshot import CheckpointQuery, WorkflowSnapshot
from ..storage.store import SnapshotStore

#: Snapshots read for one timeline (the newest ones).
MAX_SNAPSHOTS = 200
#: Child runs drawn as lanes (the oldest ones).
MAX_CHILDREN = 50
#: The narrowest bar drawn, in percent of the axis, so an instant stays visible.
MIN_WIDTH = 0.6

Status = WorkflowRun.Status

#: The wait each pause status is, and its words.
WAIT_KINDS: dict[str, tuple[str, Any]] = {
    Status.WAITING: ("approval", _("approval")),
    Status.SLEEPING: ("sleep", _("sleep")),
    Status.WAITING_CHILDREN: ("children", _("child runs")),
    Status.WAITING_MESSAGE: ("message", _("message")),
    Status.WAITING_SLOT: ("slot", _("queue slot")),
    Status.HIBERNATED: ("hibernate", _("hibernated")),
}
#: The words and symbol of each outcome (shown beside the colour, never instead).
OUTCOMES: dict[str, tuple[Any, str]] = {
    "succeeded": (_("succeeded"), "✓"),
    "failed": (_("failed"), "✗"),
    "paused": (_("paused"), "‖"),
    "completed": (_("completed the run"), "■"),
    "waiting": (_("waiting"), "◇"),
    "waited": (_("waited"), "◆"),
    "running": (_("running"), "▶"),
    "cancelled": (_("cancelled"), "⊘"),
    "other": (_("ended"), "•"),
}
_FINISHED = {Status.COMPLETED, Status.FAILED, Status.CANCELLED}
_ERROR_CLASS = re.compile(r"unhandled exception: ([\w.]+):")


@dataclasses.dataclass(frozen=True)
class Bar:
    """One bar of the timeline: an attempt of a step, a wait, or a child run.

    ``end`` is ``None`` while it lasts (drawn until the axis' end). ``left`` and
    ``width`` place it on the axis, in percent (``None``: its time is not recorded).
    ``current``: the run stands here now. A wait names the ``step`` that paused
    (``""``: not known) and, for an approval, its row's status (``decision``).
    """

    kind: str  # "attempt", "wait" or "child"
    label: str
    outcome: str
    start: datetime | None
    end: datetime | None
    wait: str = ""
    attempt: int | None = None
    provider: str = ""
    worker: str = ""
    error: str = ""
    url: str = ""
    current: bool = False
    left: float | None = None
    width: float | None = None
    step: str = ""
    decision: str = ""

    @property
    def outcome_text(self) -> str:
        return str(OUTCOMES.get(self.outcome, OUTCOMES["other"])[0])

    @property
    def symbol(self) -> str:
        return OUTCOMES.get(self.outcome, OUTCOMES["other"])[1]

    @property
    def duration(self) -> timedelta | None:
        if self.start is None or self.end is None:
            return None
        return self.end - self.start

    @property
    def took(self) -> str:
        """Its duration in words; "…" while it lasts, "—" when not recorded."""
        duration = self.duration
        if duration is not None:
            return duration_text(duration)
        return "…" if self.start is not None else "—"

    @property
    def where(self) -> str:
        """The provider and worker that ran it (``""``: not recorded)."""
        return " @ ".join(part for part in (self.provider, self.worker) if part)

    @property
    def description(self) -> str:
        """The bar in words: its accessible label and tooltip."""
        parts = [self.label, self.outcome_text]
        if self.attempt is not None:
            parts.append(gettext("attempt %(n)s") % {"n": self.attempt})
        if self.error:
            parts.append(self.error)
        if self.start is not None:
            parts.append(gettext("started %(at)s") % {"at": self.start.isoformat()})
        duration = self.duration
        if duration is not None:
            parts.append(duration_text(duration))
        elif self.start is not None:
            parts.append(gettext("still going"))
        if self.provider:
            parts.append(self.provider)
        if self.worker:
            parts.append(self.worker)
        if self.current:
            parts.append(gettext("current position"))
        return ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class Tick:
    """A mark of the time axis: its offset from the start, in words and percent."""

    label: str
    left: float


@dataclasses.dataclass(frozen=True)
class Timeline:
    """A run's bars on one axis from ``start`` to ``end``; ``skipped``: the older
    snapshots not read."""

    start: datetime
    end: datetime
    bars: tuple[Bar, ...]
    ticks: tuple[Tick, ...]
    skipped: bool = False

    @property
    def current(self) -> Bar | None:
        return next((bar for bar in self.bars if bar.current), None)

    @property
    def span_text(self) -> str:
        """How long the axis lasts, in words."""
        return duration_text(self.end - self.start)


class ChildRun(Protocol):
    """What a child lane needs of a child's ``WorkflowRun``."""

    coordination_id: str
    workflow_name: str
    status: str
    created_at: datetime
    updated_at: datetime


def duration_text(value: timedelta) -> str:
    """*value* in the unit that reads best: ``850 ms``, ``4.2 s``, ``3 min``, ``2.5 h``."""
    seconds = value.total_seconds()
    if seconds < 1:
        return gettext("%(n)d ms") % {"n": round(seconds * 1000)}
    if seconds < 60:
        return gettext("%(n).1f s") % {"n": seconds}
    if seconds < 3600:
        return gettext("%(n).1f min") % {"n": seconds / 60}
    if seconds < 86400 * 2:
        return gettext("%(n).1f h") % {"n": seconds / 3600}
    return gettext("%(n).1f d") % {"n": seconds / 86400}


def head_chain(
    snapshots: Iterable[WorkflowSnapshot], head_id: str | None
) -> list[WorkflowSnapshot]:
    """The snapshots from the oldest one read to *head_id*, following parents (forks
    and abandoned branches left out); all of them by ``seq`` when the head is not
    among them."""
    by_id = {s.id: s for s in snapshots}
    if not head_id or head_id not in by_id:
        return sorted(by_id.values(), key=lambda s: s.seq or 0)
    chain = []
    current: WorkflowSnapshot | None = by_id[head_id]
    while current is not None:
        chain.append(current)
        current = by_id.get(current.parent_id or "")
    return chain[::-1]


def build_timeline(
    run: WorkflowRun,
    chain: Sequence[WorkflowSnapshot],
    approvals: Sequence[Approval] = (),
    children: Sequence[ChildRun] = (),
    *,
    now: datetime | None = None,
    child_url: Callable[[str], str] | None = None,
    worker_name: Callable[[str], str] | None = None,
    skipped: bool = False,
) -> Timeline:
    """The timeline of *run* from the snapshots of its head's *chain* (oldest
    first), its *approvals* and its *children* (``child_url`` links each lane;
    ``worker_name`` shows a worker, an opaque key for users without the details,
    say)."""
    now = now or timezone.now()
    by_snapshot = {a.snapshot_id: a for a in approvals}
    bars: list[Bar] = []
    steps = [s for s in chain if s.metadata.get(LAST_STEP)]
    for index, snapshot in enumerate(steps):
        bars.extend(_attempts(snapshot))
        following = steps[index + 1] if index + 1 < len(steps) else None
        wait = _wait(run, snapshot, following, by_snapshot.get(snapshot.id), now)
        if wait is not None:
            bars.append(wait)
    bars.extend(_unsaved_end(run, chain[-1] if chain else None))
    if run.status == Status.WAITING_SLOT:
        since = run.queued_at or run.updated_at
        bars.append(Bar("wait", _wait_label("slot"), "waiting", since, None, wait="slot"))
    bars = _mark_current(run, bars)
    if worker_name is not None:
        bars = [
            dataclasses.replace(b, worker=worker_name(b.worker)) if b.worker else b for b in bars
        ]
    for child in children[:MAX_CHILDREN]:
        finished = child.status in _FINISHED
        bars.append(
            Bar(
                "child",
                f"{child.workflow_name} · {child.coordination_id}",
                _child_outcome(child.status),
                child.created_at,
                child.updated_at if finished else None,
                url=child_url(child.coordination_id) if child_url else "",
            )
        )
    return _place(run, bars, now, skipped)


def _parse(value: str) -> datetime | None:
    found = parse_datetime(value) if value else None
    return found if found is None or timezone.is_aware(found) else None


def _attempts(snapshot: WorkflowSnapshot) -> list[Bar]:
    """The bars of the attempts of the step *snapshot* saved: its failed ones, then
    the one that succeeded."""
    step = snapshot.metadata.get(LAST_STEP, "")
    timing = step_timing_of(snapshot.metadata)
    if timing is None:  # a step saved before timings: one bar at its snapshot's time
        return [Bar("attempt", step, _step_outcome(snapshot), snapshot.created_at, None)]
    # A step's attempts run under one provider.
    bars = [_failed_attempt(error, step, timing.provider) for error in timing.errors]
    duration = timedelta(milliseconds=timing.duration_ms or 0)
    start = _parse(timing.started_at) or snapshot.created_at - duration
    bars.append(
        Bar(
            "attempt",
            step,
            _step_outcome(snapshot),
            start,
            start + duration,
            attempt=timing.attempts,
            provider=timing.provider,
            worker=timing.worker,
        )
    )
    return bars


def _failed_attempt(error: AttemptError, step: str, provider: str = "") -> Bar:
    """The bar of failed attempt *error* of *step*."""
    start = _parse(error.started_at)
    end = None
    if start is not None and error.duration_ms is not None:
        end = start + timedelta(milliseconds=error.duration_ms)
    return Bar(
        "attempt",
        step,
        "failed",
        start,
        end,
        attempt=error.attempt,
        provider=provider,
        worker=error.worker,
        error=error.error,
    )


def _step_outcome(snapshot: WorkflowSnapshot) -> str:
    if snapshot.metadata.get(WORKFLOW_DONE) == "true":
        return "completed"
    return "paused" if _pause_status(snapshot, None) else "succeeded"


def _pause_status(snapshot: WorkflowSnapshot, approval: Approval | None) -> str:
    """The status the run paused in at *snapshot* (``""``: it did not pause)."""
    recorded = snapshot.metadata.get(PAUSE_STATUS, "")
    if recorded:
        return recorded
    if approval is not None:
        return Status.WAITING
    return Status.SLEEPING if snapshot.metadata.get(WAKE_AT) else ""


def _wait_label(kind: str) -> str:
    for name, label in WAIT_KINDS.values():
        if name == kind:
            return str(label)
    return kind


def _first_start(snapshot: WorkflowSnapshot) -> datetime | None:
    starts = [bar.start for bar in _attempts(snapshot) if bar.start is not None]
    return min(starts) if starts else None


def _wait(
    run: WorkflowRun,
    snapshot: WorkflowSnapshot,
    following: WorkflowSnapshot | None,
    approval: Approval | None,
    now: datetime,
) -> Bar | None:
    """The wait that began with *snapshot*, if its step paused."""
    status = _pause_status(snapshot, approval)
    if not status:
        return None
    kind = WAIT_KINDS.get(status, (status, status))[0]
    start: datetime | None = snapshot.created_at
    end: datetime | None
    if following is not None:
        end = _first_start(following) or following.created_at
    elif run.status == status and run.head_snapshot_id == snapshot.id:
        end = None  # still waiting
    else:
        end = run.updated_at
    outcome = "waiting" if end is None else "waited"
    label = _wait_label(kind)
    decision = ""
    if approval is not None:
        start = approval.requested_at
        if approval.decided_at is not None:
            end = approval.decided_at
        label = f"{label}: {approval.get_status_display()}"
        decision = approval.status
        if approval.status == Approval.Status.PENDING:
            end, outcome = None, "waiting"
    step = snapshot.metadata.get(LAST_STEP, "")
    return Bar("wait", label, outcome, start, end, wait=kind, step=step, decision=decision)


def _unsaved_end(run: WorkflowRun, head: WorkflowSnapshot | None) -> list[Bar]:
    """The attempts no snapshot records: those of the step the run failed at (its
    failure reason names the error class), and the failed attempts a provider that
    retries itself keeps on the run record (``step_errors``)."""
    bars = [_failed_attempt(error, gettext("next step")) for error in parse_errors(run.step_errors)]
    if run.status == Status.FAILED:
        found = _ERROR_CLASS.search(run.failure_reason or "")
        at = run.updated_at
        label = (
            gettext("step after %(step)s") % {"step": run.last_step}
            if run.last_step
            else gettext("first step")
        )
        bars.append(Bar("attempt", label, "failed", at, at, error=found.group(1) if found else ""))
    return bars


def _mark_current(run: WorkflowRun, bars: list[Bar]) -> list[Bar]:
    """Mark where the run stands: the wait it is in, else its last bar."""
    if not bars:
        return bars
    index = next((i for i, bar in enumerate(bars) if bar.kind == "wait" and bar.end is None), None)
    if index is None:
        index = len(bars) - 1
    bars[index] = dataclasses.replace(bars[index], current=True)
    return bars


def _child_outcome(status: str) -> str:
    if status == Status.COMPLETED:
        return "completed"
    if status in (Status.FAILED, Status.CANCELLED):
        return "failed" if status == Status.FAILED else "cancelled"
    return "running" if status == Status.RUNNING else "waiting"


def _place(run: WorkflowRun, bars: list[Bar], now: datetime, skipped: bool) -> Timeline:
    """Put *bars* on one axis: from the run's start (or its first bar's) to the last
    end, or to *now* while something lasts."""
    starts = [bar.start for bar in bars if bar.start is not None]
    ends = [bar.end or now for bar in bars if bar.start is not None]
    start = min([*starts, run.created_at]) if not skipped else min(starts or [run.created_at])
    end = max([*ends, start])
    if run.status not in _FINISHED and any(bar.end is None for bar in bars):
        end = max(end, now)
    span = max((end - start).total_seconds(), 0.001)
    placed = []
    for bar in bars:
        if bar.start is None:
            placed.append(bar)
            continue
        left = (bar.start - start).total_seconds() / span * 100
        right = ((bar.end or end) - start).total_seconds() / span * 100
        left = min(max(left, 0.0), 100 - MIN_WIDTH)
        width = min(max(right - left, MIN_WIDTH), 100 - left)
        placed.append(dataclasses.replace(bar, left=round(left, 3), width=round(width, 3)))
    # Three labels fit the narrowest track; the track's grid marks the quarters.
    ticks = tuple(
        Tick("+" + duration_text(timedelta(seconds=span * share / 2)) if share else "0", share * 50)
        for share in range(3)
    )
    return Timeline(start, end, tuple(placed), ticks, skipped)


def load_timeline(
    run: WorkflowRun,
    store: SnapshotStore,
    *,
    child_url: Callable[[str], str] | None = None,
    worker_name: Callable[[str], str] | None = None,
    now: datetime | None = None,
) -> Timeline:
    """The timeline of *run*: its newest ``MAX_SNAPSHOTS`` snapshots from *store*
    (positions only), its approvals and child runs from its database."""
    query = CheckpointQuery.for_coordination(
        run.coordination_id, limit=MAX_SNAPSHOTS + 1, newest_first=True, with_state=False
    )
    found = store.list(query)
    skipped = len(found) > MAX_SNAPSHOTS
    chain = head_chain(found[:MAX_SNAPSHOTS], run.head_snapshot_id)
    db = run._state.db
    approvals = list(Approval.objects.using(db).filter(coordination_id=run.pk))
    children = list(
        WorkflowRun.objects.using(db)
        .filter(parent_coordination_id=run.pk)
        .order_by("created_at", "coordination_id")[:MAX_CHILDREN]
    )
    return build_timeline(
        run,
        chain,
        approvals,
        children,
        now=now,
        child_url=child_url,
        worker_name=worker_name,
        skipped=skipped,
    )
