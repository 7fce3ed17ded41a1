"""Deciding approvals: ``approve``, ``reject`` (and ``decide``), and for async code
``aapprove``, ``areject`` (and ``adecide``).

A decision locks the approval's row, so of two racing decisions exactly one is
made. The same decision again returns the first one (``repeated``); the other
decision raises ``ApprovalConflictError`` (``approval_already_decided``); a late
one ``ApprovalExpiredError``; while the approval is claimed (``claims``), anyone
but its claimant ``ApprovalConflictError`` (``approval_claimed``). In the decision's
transaction the run moves from ``waiting`` to ``running`` with the decision as its
input, so a crash after the commit loses nothing: the recovery sweep (or the next
``run()``) continues it. Every attempt, refused ones included (a user who may not
decide, too), is audited.

The async variants run the sync call through ``sync_to_async(thread_sensitive=True)``:
a decision locks the approval's row (``select_for_update``) in a transaction and
resumes the run once that commits (``transaction.on_commit``), neither of which
Django's async ORM offers, and both need the one connection of the thread-sensitive
executor. With the in-process provider the resumed steps run in that thread too.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from ....common import tracing
from ....common.app_models import models
from ....common.async_twins import thread_sensitive_twin
from ....common.formatting import truncate
from ....common.user_input import check_comment, check_resume_input
from ...definition.decisions import ApprovalDecision
from ...runs.records import RunRecords
from ...runs.transactions import write_transaction
from .access import can_decide
from .claims import claimed_elsewhere
from .continuation import continuation_warning
from .errors import (
    ApprovalConflictError,
    ApprovalError,
    ApprovalExpiredError,
    ApprovalPermissionError,
)
from .forms import clean_payload
from .transitions import (
    ResumeOutcome,
    cancel_locked,
    expire_locked,
    load_locked,
    record_event,
    resume_on_commit,
    run_waits_for,
)

if TYPE_CHECKING:
    from ....models import Approval
    from ...definition.results import WorkflowResult

logger = logging.getLogger("flowwarden_django.workflows")

DECISIONS = ("approved", "rejected")
#: The most characters of a refused attempt's comment its audit event keeps.
REFUSED_COMMENT_CHARS = 200
#: The most refused attempts audited per user and approval; later ones are only logged.
MAX_AUDITED_REFUSALS = 10


@dataclasses.dataclass
class DecisionResult:
    """A decision that stands: the approval as decided, whether this call only
    repeated an earlier identical decision, (when the run was resumed in this
    process, after the commit) the run's result, and ``warning``: when this process
    does not define the run's workflow (so it did not continue the run), that, and
    who continues it, in words for the person who decided (``""`` otherwise)."""

    approval: Approval
    repeated: bool = False
    resumed: ResumeOutcome | None = None
    warning: str = ""

    @property
    def run_result(self) -> WorkflowResult | None:
        return None if self.resumed is None else self.resumed.result


def approve(
    approval_id: Any, user: Any, *, comment: str = "", payload: Any = None, **options: Any
) -> DecisionResult:
    """Approve; see ``decide``."""
    return decide(approval_id, "approved", user, comment=comment, payload=payload, **options)


def reject(
    approval_id: Any, user: Any, *, comment: str = "", payload: Any = None, **options: Any
) -> DecisionResult:
    """Reject; see ``decide``."""
    return decide(approval_id, "rejected", user, comment=comment, payload=payload, **options)


def decide(
    approval_id: Any,
    decision: str,
    user: Any,
    *,
    comment: str = "",
    payload: Any = None,
    using: str | None = None,
    check_permission: bool = True,
) -> DecisionResult:
    """Make *decision* (``"approved"`` or ``"rejected"``) on an approval as *user*
    (``None``: the system; then *check_permission* must be False), with a
    *comment* and a JSON *payload* handed to the next step.

    Raises ``UnknownApprovalError``, ``ApprovalPermissionError``,
    ``ApprovalConflictError`` or ``ApprovalExpiredError`` (see the module), and
    ``UserJSONError`` (a ``ValueError``, before anything is read or written) for a
    comment or payload outside the limits of ``common.user_input``. An approval with
    a form (``await_approval(form=...)``) is approved only with a payload its form
    accepts (else ``ApprovalFormError``, with the form's errors, nothing written;
    ``ApprovalFormUnavailableError`` when the form no longer imports), and the form's
    cleaned data, JSON-safe, is what is stored and handed on.
    """
    attributes = {"flowwarden.approval": str(approval_id), "flowwarden.decision": decision}
    with tracing.span("flowwarden.approval.decide", attributes) as current:
        result = _decide(approval_id, decision, user, comment, payload, using, check_permission)
        if current is not None:
            current.set_attribute("flowwarden.coordination_id", result.approval.coordination_id)
            current.set_attribute("flowwarden.workflow", result.approval.workflow_name)
        return result


adecide = thread_sensitive_twin(
    decide, """``decide`` from async code (``thread_sensitive=True``, see the module)."""
)
aapprove = thread_sensitive_twin(
    approve,
    """``approve`` from async code: the same result, errors and audit events
    (``thread_sensitive=True``, see the module). In an async view pass
    ``await request.auser()``.""",
)
areject = thread_sensitive_twin(reject, """``reject`` from async code; see ``aapprove``.""")


def _decide(
    approval_id: Any,
    decision: str,
    user: Any,
    comment: str,
    payload: Any,
    using: str | None,
    check_permission: bool,
) -> DecisionResult:
    if decision not in DECISIONS:
        raise ValueError(f"decision must be one of {DECISIONS}, not {decision!r}")
    comment = check_comment(comment)
    payload = check_resume_input(payload, what="the payload")
    db = RunRecords(using).db
    actor = "" if user is None else user.get_username()
    refusal: ApprovalError | None = None
    with write_transaction(db):
        approval = load_locked(approval_id, db)
        key = str(approval.pk)
        now = timezone.now()
        result = DecisionResult(approval)
        status = approval.status
        # While it is claimed only the claimant decides (the system, unchecked, too).
        held = claimed_elsewhere(approval, actor) if check_permission else None
        if check_permission and not can_decide(user, approval):
            refusal = ApprovalPermissionError(
                f"{actor or 'anonymous'} may not decide approval {key}", approval_id=key
            )
        elif status == models.Approval.Status.PENDING and held is not None:
            refusal = held
        elif status == models.Approval.Status.PENDING and _due(approval, now):
            if expire_locked(approval, now, db):
                refusal = ApprovalExpiredError(f"approval {key} expired at {approval.expires_at}")
            else:
                refusal = _busy(approval)
        elif status == models.Approval.Status.PENDING:
            payload = clean_payload(approval, decision, payload)  # a typed form's data
            refusal = _decide_pending(approval, decision, actor, comment, payload, now, db, result)
        elif status == decision:
            result.repeated = True
            record_event(approval, "repeated", using=db, actor=actor, at=now, comment=comment)
        elif status == models.Approval.Status.EXPIRED:
            refusal = ApprovalExpiredError(f"approval {key} expired at {approval.decided_at}")
        elif status == models.Approval.Status.CANCELLED:
            refusal = ApprovalConflictError(
                f"approval {key} was cancelled: its run moved on", code="approval_cancelled"
            )
        else:
            refusal = ApprovalConflictError(f"approval {key} was already {status}")
        if refusal is not None:
            _audit_refusal(approval, refusal, decision, actor, comment, now, db)
    if refusal is not None:
        raise refusal
    result.warning = continuation_warning(approval, db)
    return result


def check_may_decide(
    approval: Approval,
    decision: str,
    user: Any,
    *,
    comment: str = "",
    payload: Any = None,
    using: str | None = None,
) -> None:
    """Raise ``ApprovalPermissionError`` unless *user* may decide *approval*, after
    recording the refused attempt in its audit trail (as ``decide`` does: bounded,
    without *payload*). For front ends (the API, the admin, the inbox) that refuse
    before they would call ``decide``, once they have shown that *user* may see
    *approval* (a user who may not see it gets a "not found" and leaves no trace)."""
    if can_decide(user, approval):
        return
    db = RunRecords(using).db
    actor = "" if user is None else user.get_username()
    key = str(approval.pk)
    refusal = ApprovalPermissionError(
        f"{actor or 'anonymous'} may not decide approval {key}", approval_id=key
    )
    with write_transaction(db):
        # The row locked, as decide() locks it: racing refusals count one at a time,
        # so they cannot all see fewer than the cap and all insert.
        locked = models.Approval.objects.using(db).select_for_update().filter(pk=approval.pk)
        row = locked.first()
        if row is not None:  # gone since the caller read it: nothing to audit
            _audit_refusal(row, refusal, decision, actor, comment, timezone.now(), db)
    raise refusal


def _audit_refusal(
    approval: Approval,
    refusal: ApprovalError,
    decision: str,
    actor: str,
    comment: str,
    now: Any,
    db: str,
) -> None:
    """Record refused attempt *refusal* in *approval*'s audit trail, bounded: who,
    when, why, the decision tried and the start of its comment (never its payload),
    for at most ``MAX_AUDITED_REFUSALS`` attempts per user (the last one says so;
    later ones are logged, not stored), so that repeated refusals cannot grow the
    table."""
    refusal.approval_id, refusal.status = str(approval.pk), approval.status
    # Called with the approval's row locked (select_for_update), so the count holds
    # until the insert.
    audited = (
        models.ApprovalEvent.objects.using(db)
        .filter(approval=approval, action="refused", actor=actor)
        .count()
    )
    if audited >= MAX_AUDITED_REFUSALS:
        logger.info(
            "approval %s: refused attempt by %s not audited (%d recorded already): %s",
            approval.pk,
            actor or "anonymous",
            audited,
            refusal.code,
        )
        return
    detail = f"{refusal.code}: {refusal}"
    if audited == MAX_AUDITED_REFUSALS - 1:
        detail += (
            f" (the last of {MAX_AUDITED_REFUSALS} refused attempts audited for this user; "
            "later ones are not recorded)"
        )
    record_event(
        approval,
        "refused",
        using=db,
        actor=actor,
        at=now,
        comment=truncate(comment, REFUSED_COMMENT_CHARS),
        payload={"decision": decision},
        detail=detail,
    )


def _decide_pending(
    approval: Approval,
    decision: str,
    actor: str,
    comment: str,
    payload: Any,
    now: Any,
    db: str,
    result: DecisionResult,
) -> ApprovalError | None:
    """Decide pending *approval* (row locked); the refusal when it cannot be."""
    key = str(approval.pk)
    decided = ApprovalDecision(key, decision, payload, comment, actor or None, now.isoformat())
    if not RunRecords(db).accept_decision(
        approval.coordination_id, approval.snapshot_id, decided.as_input()
    ):
        if run_waits_for(approval, db) is not False:
            return _busy(approval)  # claimed at this instant (or released meanwhile)
        cancel_locked(approval, now, db, "the run was not waiting for it any more")
        return ApprovalConflictError(
            f"approval {key} was cancelled: its run moved on", code="approval_cancelled"
        )
    approval.status = decision
    approval.decided_by = actor
    approval.decided_at = now
    approval.comment = comment
    approval.payload = payload
    approval.save(
        using=db, update_fields=["status", "decided_by", "decided_at", "comment", "payload"]
    )
    record_event(
        approval, decision, using=db, actor=actor, at=now, comment=comment, payload=payload
    )
    result.resumed = resume_on_commit(approval, db)
    return None


def _busy(approval: Approval) -> ApprovalConflictError:
    return ApprovalConflictError(
        f"run {approval.coordination_id} is being run at this instant; try again",
        code="run_busy",
    )


def _due(approval: Approval, now: Any) -> bool:
    return approval.expires_at is not None and approval.expires_at <= now
