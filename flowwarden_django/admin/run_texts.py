"""How the run pages word and draw a run: its status badge, how a snapshot's step ran,
durations, when a sleeping run wakes, and JSON values."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext, ngettext

from ..common.formatting import state_json
from ..models import WorkflowRun
from ..workflows.execution.step_timings import step_timing_of
from ..workflows.storage.snapshot import WorkflowSnapshot
from ..workflows.waiting.cancellation import cancellation_of
from ..workflows.waiting.children import spawned
from .base import age, status_badge

#: The admin icon shown next to each run status.
RUN_STATUS_ICONS = {
    WorkflowRun.Status.RUNNING: "admin/img/icon-clock.svg",
    WorkflowRun.Status.HIBERNATED: "admin/img/icon-clock.svg",
    WorkflowRun.Status.WAITING: "admin/img/icon-alert.svg",
    WorkflowRun.Status.COMPLETED: "admin/img/icon-yes.svg",
    WorkflowRun.Status.FAILED: "admin/img/icon-no.svg",
    WorkflowRun.Status.NEEDS_UPGRADE: "admin/img/icon-alert.svg",
    WorkflowRun.Status.SLEEPING: "admin/img/icon-clock.svg",
    WorkflowRun.Status.WAITING_CHILDREN: "admin/img/icon-clock.svg",
    WorkflowRun.Status.CANCELLED: "admin/img/icon-no.svg",
    WorkflowRun.Status.WAITING_MESSAGE: "admin/img/icon-clock.svg",
    WorkflowRun.Status.WAITING_SLOT: "admin/img/icon-clock.svg",
}


def run_status_badge(status: str) -> SafeString:
    """The run status as the admin shows booleans: an icon, then the label."""
    labels = dict(WorkflowRun.Status.choices)
    return status_badge(
        status, labels=labels, icons=RUN_STATUS_ICONS, css_class="flowwarden-run-status"
    )


def tree_step_text(snapshot: WorkflowSnapshot) -> dict[str, str]:
    """What the tree says of how the snapshot's step ran (``duration``, ``attempts``,
    ``errors``: the classes of the failed attempts, never their messages, which may
    quote the state), of its cancellation (``cancelled``), or of the child runs it
    started (``children``: listed on the run's page)."""
    found: dict[str, str] = {}
    cancelled = cancellation_of(snapshot)
    if cancelled:
        found["cancelled"] = cancelled.get("reason") or gettext("cancelled")
    children = spawned(snapshot)
    if children is not None:
        count = len(children.get("workflows") or [])
        found["children"] = ngettext(
            "started %(count)d child run", "started %(count)d child runs", count
        ) % {"count": count}
    timing = step_timing_of(snapshot.metadata)
    if timing is None:
        return found
    if timing.duration_ms is not None:
        found["duration"] = duration_text(timing.duration_ms)
    if timing.attempts and timing.attempts > 1:
        found["attempts"] = ngettext("%(count)d attempt", "%(count)d attempts", timing.attempts) % {
            "count": timing.attempts
        }
    if timing.errors:
        found["errors"] = ", ".join(f"#{e.attempt} {e.error}" for e in timing.errors)
    return found


def duration_text(milliseconds: float) -> str:
    """``850 ms``, ``12.4 s``, ``3 min 5 s``."""
    if milliseconds < 1000:
        return f"{milliseconds:.0f} ms" if milliseconds >= 10 else f"{milliseconds:.1f} ms"
    seconds = milliseconds / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s"


def wakes_text(wake_at: Any) -> SafeString:
    """``wakes in 2 hours`` (``due 3 minutes ago`` once past), the exact time as a title."""
    return format_html(
        "{} {}",
        gettext("wakes") if wake_at > timezone.now() else gettext("due"),
        age(wake_at),
    )


def pretty_json(value: Any) -> SafeString:
    """*value* as indented JSON with sorted keys in a ``<pre>`` block (escaped)."""
    return format_html('<pre class="flowwarden-json">{}</pre>', state_json(value))
