"""How far a stream's initial sync has got, for people: copied of estimated, rate, ETA.

Read from the progress record that the copy keeps with the stream's checkpoint
(``Checkpoint.initial_sync``, see ``initial_sync``). The status command, the health
view and the admin's Streams console all show it through :func:`copy_progress`.
The rate is the documents copied over the time since the copy started (restarts
included), measured up to the last committed batch; the ETA assumes that rate for
the documents the estimate says are left.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any

#: Progress phases (the record's ``phase``).
COPYING = "copying"
DONE = "done"

#: Why a copy runs (the record's ``reason``).
FIRST_START = "first start"
HISTORY_LOST = "history lost"
ON_DEMAND = "on demand"


@dataclasses.dataclass(frozen=True)
class CopyProgress:
    """One stream's initial sync as an operator reads it."""

    phase: str
    reason: str
    copied: int
    #: The collection's estimated document count when the copy started (``None``
    #: until it is read: an on-demand resync not yet picked up).
    estimated: int | None
    started_at: datetime | None
    #: The last committed batch's time.
    updated_at: datetime | None
    finished_at: datetime | None
    requested_by: str = ""

    @property
    def copying(self) -> bool:
        """Whether the copy is still going (or waits to be picked up)."""
        return self.phase == COPYING

    @property
    def percent(self) -> float | None:
        """Copied over estimated, in percent (at most 100; ``None`` without an estimate)."""
        if not self.estimated:
            return None
        return min(100.0, 100.0 * self.copied / self.estimated)

    @property
    def rate(self) -> float | None:
        """Documents a second since the copy started, or ``None`` before the first batch."""
        end = self.finished_at or self.updated_at
        if self.started_at is None or end is None or not self.copied:
            return None
        seconds = (end - self.started_at).total_seconds()
        return self.copied / seconds if seconds > 0 else None

    @property
    def eta_seconds(self) -> float | None:
        """Seconds left at :attr:`rate` (0 once copied reaches the estimate)."""
        if not self.copying or self.rate is None or self.estimated is None:
            return None
        return max(0, self.estimated - self.copied) / self.rate

    @property
    def duration_seconds(self) -> float | None:
        """How long a finished copy took, restarts included."""
        if self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()

    def summary(self) -> str:
        """One line: ``"copying (first start): 4,200 of ~10,000 (42%), 1,310/s, ETA 4s"``."""
        if self.copying:
            text = f"copying ({self.reason}): {self.copied:,}"
            if self.estimated is not None:
                text += f" of ~{self.estimated:,}"
            if self.percent is not None:
                text += f" ({self.percent:.0f}%)"
            if self.rate is not None:
                text += f", {self.rate:,.0f}/s"
            if self.eta_seconds is not None:
                text += f", ETA {duration_text(self.eta_seconds)}"
            if self.started_at is None:
                text += ", waiting for a process to start it"
            return text
        text = f"copied {self.copied:,} documents ({self.reason})"
        if self.duration_seconds is not None:
            text += f" in {duration_text(self.duration_seconds)}"
        return text

    def to_json(self) -> dict[str, Any]:
        """JSON-compatible values for the health report (no document ids: they may be data)."""
        return {
            "phase": self.phase,
            "reason": self.reason,
            "copied": self.copied,
            "estimated": self.estimated,
            "percent": None if self.percent is None else round(self.percent, 1),
            "rate_per_second": None if self.rate is None else round(self.rate, 1),
            "eta_seconds": None if self.eta_seconds is None else round(self.eta_seconds, 1),
            "started_at": _iso(self.started_at),
            "updated_at": _iso(self.updated_at),
            "finished_at": _iso(self.finished_at),
        }


def copy_progress(progress: Mapping[str, Any] | None) -> CopyProgress | None:
    """The :class:`CopyProgress` of a progress record, or ``None`` without one."""
    if not progress:
        return None
    estimated = progress.get("estimated")
    return CopyProgress(
        phase=str(progress.get("phase") or COPYING),
        reason=str(progress.get("reason") or "first start"),
        copied=int(progress.get("copied") or 0),
        estimated=None if estimated is None else int(estimated),
        started_at=_moment(progress.get("started_at")),
        updated_at=_moment(progress.get("updated_at")),
        finished_at=_moment(progress.get("finished_at")),
        requested_by=str(progress.get("requested_by") or ""),
    )


def duration_text(seconds: float) -> str:
    """``"45s"``, ``"3m 05s"``, ``"2h 10m"``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def _moment(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
