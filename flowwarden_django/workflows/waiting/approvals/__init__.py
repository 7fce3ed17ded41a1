"""Human-in-the-loop approvals for workflows.

A step returns ``await_approval(state, prompt, assignees=..., group=...,
permission=..., expires_in=..., on_expiry=...)``; the run waits (status ``waiting``)
with an ``Approval`` row. ``approve``/``reject`` decide it (idempotently, audited;
``aapprove``/``areject`` from async code);
the run resumes and the next step reads ``ctx.decision`` (an ``ApprovalDecision``).
``claim``/``release``/``reassign`` say who is on it (``claims``; ``aclaim``/
``arelease``/``areassign`` from async code).
``sweep_approvals`` expires due approvals; the sweeps send reminders and escalate
(``remind_and_escalate_due``); every event is notified once (``notify``: the
``approval_requested``... signals, and emails). ``await_approval(form=...)`` types an
approval's payload with a Django form (``forms``). Nothing here imports the admin or DRF.
"""

from ...definition.decisions import ApprovalDecision
from .access import assigned_approvals, can_decide, decidable_approvals, visible_approvals
from .claims import ClaimResult, aclaim, areassign, arelease, claim, reassign, release
from .deciding import (
    DecisionResult,
    aapprove,
    adecide,
    approve,
    areject,
    check_may_decide,
    decide,
    reject,
)
from .errors import (
    ApprovalConflictError,
    ApprovalError,
    ApprovalExpiredError,
    ApprovalPermissionError,
    UnknownApprovalError,
)
from .forms import ApprovalFormError, ApprovalFormUnavailableError, describe_form
from .notifications import notify
from .reminders import ReminderResult, remind_and_escalate_due
from .request import AwaitApproval, await_approval, request_approval
from .signals import (
    approval_assigned,
    approval_escalated,
    approval_reminded,
    approval_requested,
)
from .sweep import SweepResult, sweep_approvals

__all__ = [
    "ApprovalConflictError",
    "ApprovalDecision",
    "ApprovalError",
    "ApprovalExpiredError",
    "ApprovalFormError",
    "ApprovalFormUnavailableError",
    "ApprovalPermissionError",
    "AwaitApproval",
    "ClaimResult",
    "DecisionResult",
    "ReminderResult",
    "SweepResult",
    "UnknownApprovalError",
    "aapprove",
    "aclaim",
    "adecide",
    "approval_assigned",
    "approval_escalated",
    "approval_reminded",
    "approval_requested",
    "approve",
    "areassign",
    "areject",
    "arelease",
    "assigned_approvals",
    "await_approval",
    "can_decide",
    "check_may_decide",
    "claim",
    "decidable_approvals",
    "decide",
    "describe_form",
    "notify",
    "reassign",
    "reject",
    "release",
    "remind_and_escalate_due",
    "request_approval",
    "sweep_approvals",
    "visible_approvals",
]
