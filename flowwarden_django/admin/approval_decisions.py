"""Deciding approvals from the admin: the two decisions (approve, reject) in the
admin's words, what deciding some approvals did to each (``Outcome``), and
``decide_all``, which makes a decision on each approval through the workflow core."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from django.utils.translation import gettext, ngettext_lazy
from django.utils.translation import gettext_lazy as _

from ..models import Approval, WorkflowRun
from ..streams.operations.status import status_error
from ..workflows.waiting.approvals import (
    ApprovalError,
    ApprovalPermissionError,
    approve,
    can_decide,
    reject,
)

logger = logging.getLogger("flowwarden_django.admin")

PENDING = Approval.Status.PENDING


def refusal_text(error: ApprovalError) -> str:
    """Why the core refused a decision, in the words of the admin."""
    texts = {
        "approval_already_decided": gettext("it was already %(status)s"),
        "approval_cancelled": gettext("it was cancelled: its run moved on"),
        "approval_claimed": gettext("someone else claimed it: only they decide it"),
        "approval_expired": gettext("it expired before it was decided"),
        "approval_forbidden": gettext("you may not decide it"),
        "approval_not_found": gettext("it does not exist any more"),
        "run_busy": gettext("its run is busy right now; try again"),
        "approval_payload_invalid": gettext(
            "it has a decision form: approve it on its own page, with the form filled in"
        ),
        "approval_form_unavailable": gettext("its decision form cannot be loaded"),
    }
    text = texts.get(error.code)
    if text is None:
        return str(error)
    return text % {"status": error.status or gettext("decided")}


# -- the two decisions ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Decision:
    """Approve or reject, with the words the admin uses for it."""

    name: str
    status: str
    label: Any
    title: Any
    question: Any
    #: The question on one approval's page (its prompt is shown below it).
    question_one: Any
    button: Any
    done: Any  # ngettext_lazy(..., "count")
    past: Any
    call: Callable[..., Any]


APPROVE = Decision(
    name="approve",
    status=Approval.Status.APPROVED,
    label=_("Approve"),
    title=_("Approve"),
    question=_(
        "Approve the approvals below? Each run resumes with the decision at the step "
        "after the one that asked."
    ),
    question_one=_(
        "Approve the request below? The run resumes with the decision at the step "
        "after the one that asked."
    ),
    button=_("Yes, approve"),
    done=ngettext_lazy("Approved %(count)d approval.", "Approved %(count)d approvals.", "count"),
    past=_("Approved from the admin."),
    call=approve,
)
REJECT = Decision(
    name="reject",
    status=Approval.Status.REJECTED,
    label=_("Reject"),
    title=_("Reject"),
    question=_(
        "Reject the approvals below? Each run resumes with the decision at the step after "
        "the one that asked, which decides what a rejection means."
    ),
    question_one=_(
        "Reject the request below? The run resumes with the decision at the step after "
        "the one that asked, which decides what a rejection means."
    ),
    button=_("Yes, reject"),
    done=ngettext_lazy("Rejected %(count)d approval.", "Rejected %(count)d approvals.", "count"),
    past=_("Rejected from the admin."),
    call=reject,
)
DECISIONS = (APPROVE, REJECT)


@dataclasses.dataclass
class Outcome:
    """What deciding some approvals did to each."""

    #: ``(approval, run status afterwards)`` for each decision made now.
    done: list[tuple[Approval, str]] = dataclasses.field(default_factory=list)
    #: Approvals that already had this decision (nothing changed).
    repeated: list[Approval] = dataclasses.field(default_factory=list)
    #: ``(approval, why)`` for each refused or failed decision.
    failed: list[tuple[Approval, str]] = dataclasses.field(default_factory=list)
    #: What the decider should know (``DecisionResult.warning``), each once.
    warnings: list[str] = dataclasses.field(default_factory=list)


def current_run_status(approval: Approval) -> str:
    """The status of *approval*'s run now ("" when it has no run row)."""
    status = (
        WorkflowRun.objects.using(approval._state.db or "default")
        .filter(pk=approval.coordination_id)
        .values_list("status", flat=True)
        .first()
    )
    return status or ""


def decide_all(
    decision: Decision,
    approvals: Sequence[Approval],
    user: Any,
    *,
    comment: str = "",
    payload: Any = None,
    describe: Callable[[Exception], str] = status_error,
) -> Outcome:
    """Make *decision* on each approval as *user*, oldest first, through the core.

    A refusal (no permission, already decided the other way, expired, cancelled) or
    an unexpected error is reported for that approval only, the error as *describe*
    tells it (a page passes :func:`~.details.error_text` for its user).
    """
    outcome = Outcome()
    for approval in sorted(approvals, key=lambda a: (a.requested_at, str(a.pk))):
        if not can_decide(user, approval):
            error = ApprovalPermissionError("forbidden", approval_id=str(approval.pk))
            outcome.failed.append((approval, refusal_text(error)))
            continue
        try:
            result = decision.call(approval.pk, user, comment=comment, payload=payload)
        except ApprovalError as exc:
            outcome.failed.append((approval, refusal_text(exc)))
            continue
        except Exception as exc:
            logger.exception("%s of approval %s failed", decision.name, approval.pk)
            outcome.failed.append((approval, describe(exc)))
            continue
        if result.repeated:
            outcome.repeated.append(result.approval)
        else:
            outcome.done.append((result.approval, current_run_status(result.approval)))
        if result.warning and result.warning not in outcome.warnings:
            outcome.warnings.append(result.warning)
    return outcome
