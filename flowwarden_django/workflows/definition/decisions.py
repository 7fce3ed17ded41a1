"""``ApprovalDecision``: what the step after ``await_approval`` receives as
``ctx.decision``, read from the decided ``Approval`` row (the decision also rides on
the run as JSON input, but only to wake it: the row is what counts).

It lives below ``steps`` (whose ``StepContext.decision`` reads it) and ``approvals``
(which makes it); ``approvals`` re-exports it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: Marks a run's resume input as an approval decision.
KIND = "flowwarden.approval"


@dataclasses.dataclass(frozen=True)
class ApprovalDecision:
    """The decision on an approval: ``approved``, ``rejected`` or ``expired``, with the
    decider's payload and comment (``decided_by`` is ``None`` for an expiry)."""

    approval_id: str
    decision: str
    payload: Any = None
    comment: str = ""
    decided_by: str | None = None
    decided_at: str | None = None

    @property
    def approved(self) -> bool:
        return self.decision == "approved"

    @property
    def rejected(self) -> bool:
        return self.decision == "rejected"

    @property
    def expired(self) -> bool:
        return self.decision == "expired"

    def as_input(self) -> dict[str, Any]:
        """The JSON input ``Workflow.resume`` carries to the next step."""
        return {"kind": KIND, **dataclasses.asdict(self)}

    @classmethod
    def from_row(cls, approval: Any) -> ApprovalDecision:
        """The decision a decided ``Approval`` row holds: the only source of
        ``ctx.decision`` (a resume input, a signal or a task argument only wakes the
        run)."""
        decided_at = approval.decided_at
        return cls(
            approval_id=str(approval.pk),
            decision=approval.status,
            payload=approval.payload,
            comment=approval.comment or "",
            decided_by=approval.decided_by or None,
            decided_at=None if decided_at is None else decided_at.isoformat(),
        )

    def agrees_with(self, other: ApprovalDecision) -> bool:
        """Whether *other* claims the same decision (its time aside: a database may
        round it)."""
        return (self.approval_id, self.decision, self.payload, self.comment, self.decided_by) == (
            other.approval_id,
            other.decision,
            other.payload,
            other.comment,
            other.decided_by,
        )

    @classmethod
    def from_input(cls, value: Any) -> ApprovalDecision | None:
        """The decision in a resume input, or ``None`` when it is not one."""
        if not isinstance(value, dict) or value.get("kind") != KIND:
            return None
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in value.items() if k in fields})
