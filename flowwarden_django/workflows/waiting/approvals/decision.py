"""``ApprovalDecision``, kept importable from here; it lives in ``workflows.decisions``
(below ``steps``, whose ``StepContext.decision`` reads it)."""

from ...definition.decisions import KIND, ApprovalDecision

__all__ = ["KIND", "ApprovalDecision"]
