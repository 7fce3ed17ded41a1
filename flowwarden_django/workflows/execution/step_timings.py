"""What a step's snapshot records of how it ran: its duration, its attempts, and the
errors of the attempts that failed before it succeeded, and when, where (the worker
process) and by which execution provider each attempt ran (for the admin's timeline).

The engine writes them into the snapshot's metadata (``metadata.STEP_DURATION_MS``,
``STEP_ATTEMPTS``, ``STEP_ERRORS``); ``step_timing_of(snapshot)`` reads them back for
the admin's tree, its timeline and the API. Timings written before 0.2 lack the
start, worker and provider (``""``). An error keeps its exception class and message. A
message may quote the state (``KeyError: 'card'``), so readers show it only where
the state is shown too (a snapshot's detail), and only the class elsewhere (lists).

With a provider that schedules each attempt itself (Temporal), the failed attempts'
errors wait on the run record (``WorkflowRun.step_errors``) until the step's
snapshot takes them.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ..definition.metadata import (
    STEP_ATTEMPTS,
    STEP_DURATION_MS,
    STEP_ERRORS,
    STEP_PROVIDER,
    STEP_STARTED_AT,
    STEP_WORKER,
)

#: Characters of an error message kept (a traceback's last line is usually enough).
MESSAGE_LIMIT = 500
#: Failed attempts kept per step (the first ones, then the latest).
ERRORS_KEPT = 10


@dataclasses.dataclass(frozen=True)
class AttemptError:
    """One failed attempt of a step: its number, exception class and message, and
    when it started (ISO 8601), how long it took and the worker it ran in (``""`` /
    ``None`` when not recorded)."""

    attempt: int
    error: str
    message: str
    started_at: str = ""
    duration_ms: float | None = None
    worker: str = ""

    @classmethod
    def of(
        cls,
        attempt: int,
        exc: BaseException,
        *,
        started_at: str = "",
        duration_ms: float | None = None,
        worker: str = "",
    ) -> AttemptError:
        message = str(exc)[:MESSAGE_LIMIT]
        return cls(attempt, type(exc).__name__, message, started_at, duration_ms, worker)

    def as_dict(self, *, with_message: bool = True) -> dict[str, Any]:
        """JSON for the API: its number, class and (*with_message*) message."""
        found: dict[str, Any] = {"attempt": self.attempt, "error": self.error}
        if with_message:
            found["message"] = self.message
        return found

    def stored(self) -> dict[str, Any]:
        """JSON for the metadata and the run record: all it knows."""
        found = self.as_dict()
        if self.started_at:
            found["started_at"] = self.started_at
        if self.duration_ms is not None:
            found["duration_ms"] = round(self.duration_ms, 1)
        if self.worker:
            found["worker"] = self.worker
        return found


@dataclasses.dataclass(frozen=True)
class StepTiming:
    """How one step ran: ``duration_ms`` of its last attempt, ``attempts`` in all,
    the ``errors`` of those that failed (oldest first), and when its last attempt
    started (``started_at``, ISO 8601), in which ``worker`` and by which ``provider``
    (``""`` when not recorded)."""

    duration_ms: float | None = None
    attempts: int | None = None
    errors: tuple[AttemptError, ...] = ()
    started_at: str = ""
    worker: str = ""
    provider: str = ""

    def metadata(self) -> dict[str, str]:
        """The snapshot metadata that records it."""
        found: dict[str, str] = {}
        if self.duration_ms is not None:
            found[STEP_DURATION_MS] = f"{self.duration_ms:.1f}"
        if self.attempts is not None:
            found[STEP_ATTEMPTS] = str(self.attempts)
        if self.errors:
            found[STEP_ERRORS] = errors_json(self.errors)
        for key, value in (
            (STEP_STARTED_AT, self.started_at),
            (STEP_WORKER, self.worker),
            (STEP_PROVIDER, self.provider),
        ):
            if value:
                found[key] = value
        return found

    def as_dict(self, *, with_messages: bool = True) -> dict[str, Any]:
        """JSON for the API: messages only *with_messages* (where the state shows)."""
        return {
            "duration_ms": self.duration_ms,
            "attempts": self.attempts,
            "errors": [e.as_dict(with_message=with_messages) for e in self.errors],
        }


def errors_json(errors: tuple[AttemptError, ...] | list[AttemptError]) -> str:
    """*errors* as the JSON the metadata and the run record keep (at most
    ``ERRORS_KEPT``: the first half and the latest)."""
    kept = list(errors)
    if len(kept) > ERRORS_KEPT:
        kept = kept[: ERRORS_KEPT // 2] + kept[-(ERRORS_KEPT - ERRORS_KEPT // 2) :]
    return json.dumps([e.stored() for e in kept], separators=(",", ":"))


def parse_errors(value: Any) -> tuple[AttemptError, ...]:
    """The errors kept as JSON text (metadata) or a list (the run record); ``()`` for
    anything else."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return ()
    if not isinstance(value, list):
        return ()
    found = []
    for item in value:
        if isinstance(item, dict) and isinstance(item.get("attempt"), int):
            duration = item.get("duration_ms")
            found.append(
                AttemptError(
                    item["attempt"],
                    str(item.get("error", "")),
                    str(item.get("message", "")),
                    str(item.get("started_at", "")),
                    float(duration) if isinstance(duration, int | float) else None,
                    str(item.get("worker", "")),
                )
            )
    return tuple(found)


def step_timing_of(metadata: dict[str, str]) -> StepTiming | None:
    """The timing a snapshot's *metadata* records; ``None`` for a snapshot no step
    wrote (a seed, a fork, a cancellation) or one written before timings."""
    duration = metadata.get(STEP_DURATION_MS)
    attempts = metadata.get(STEP_ATTEMPTS)
    if duration is None and attempts is None:
        return None
    try:
        duration_ms = None if duration is None else float(duration)
        count = None if attempts is None else int(attempts)
    except ValueError:
        return None
    return StepTiming(
        duration_ms,
        count,
        parse_errors(metadata.get(STEP_ERRORS)),
        metadata.get(STEP_STARTED_AT, ""),
        metadata.get(STEP_WORKER, ""),
        metadata.get(STEP_PROVIDER, ""),
    )
