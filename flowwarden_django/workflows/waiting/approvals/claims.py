"""Claiming approvals: ``claim`` ("I am on this"), ``release`` (give it back) and
``reassign`` (hand it to other users or another group).

While an approval is claimed only its claimant decides it (``decide`` refuses
everyone else with ``ApprovalConflictError``, code ``approval_claimed``). Each call
locks the approval's row, as a decision does, so of two racing claims exactly one
wins and the other gets ``ApprovalConflictError``; each change is audited as an
``ApprovalEvent`` (``claimed``, ``released``, ``reassigned``). Repeating a claim or
releasing an unclaimed approval changes nothing and records nothing.

Who may do what:

* ``claim``: whoever may decide it (``can_decide``), while it is pending and not
  claimed by someone else;
* ``release``: its claimant, or a holder of ``flowwarden_django.reassign_approval``;
* ``reassign``: holders of ``flowwarden_django.reassign_approval``. The approval's
  deciders by name and by group become exactly *to_users* and *to_group* (the
  permission rule stays, and holders of ``decide_approval`` still decide), and its
  claim is cleared. The new deciders are notified (``assigned``: the
  ``approval_assigned`` signal and, with ``FLOWWARDEN["APPROVAL_EMAILS"]`` on, an
  email each), once per reassign: its outbox row is numbered by the reassign.

From async code, ``aclaim``, ``arelease`` and ``areassign`` run the same calls through
``sync_to_async(thread_sensitive=True)``, as ``adecide`` does (the row lock needs a
transaction on the one connection of the thread-sensitive executor).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from ....common.app_models import models
from ....common.async_twins import thread_sensitive_twin
from ....common.user_input import check_comment
from ...runs.records import RunRecords
from ...runs.transactions import write_transaction
from .access import can_decide
from .errors import ApprovalConflictError, ApprovalExpiredError, ApprovalPermissionError
from .notifications import notify
from .transitions import load_locked, record_event

if TYPE_CHECKING:
    from ....models import Approval

REASSIGN = "flowwarden_django.reassign_approval"
#: The most users one reassign names.
MAX_REASSIGN_USERS = 100
#: The longest username or group name (the model's columns).
NAME_CHARS = 150


@dataclasses.dataclass
class ClaimResult:
    """What a claim, release or reassign did: the approval as it is now, and whether
    this call changed it (False: it was already so, nothing recorded)."""

    approval: Approval
    changed: bool = True


def _actor(user: Any) -> str:
    return "" if user is None else user.get_username()


def _check_pending(approval: Approval, now: Any) -> None:
    """Raise unless *approval* is pending and not past its expiry."""
    key, status = str(approval.pk), approval.status
    if status == models.Approval.Status.PENDING:
        if approval.expires_at is not None and approval.expires_at <= now:
            raise ApprovalExpiredError(
                f"approval {key} expired at {approval.expires_at}", approval_id=key, status=status
            )
        return
    if status == models.Approval.Status.EXPIRED:
        raise ApprovalExpiredError(f"approval {key} expired", approval_id=key, status=status)
    code = "approval_cancelled" if status == models.Approval.Status.CANCELLED else None
    raise ApprovalConflictError(
        f"approval {key} is {status}, not pending", code=code, approval_id=key, status=status
    )


def claimed_elsewhere(approval: Approval, actor: str) -> ApprovalConflictError | None:
    """The conflict when *approval* is claimed by someone other than *actor*."""
    if not approval.claimed_by or approval.claimed_by == actor:
        return None
    key = str(approval.pk)
    return ApprovalConflictError(
        f"approval {key} is claimed by {approval.claimed_by}",
        code="approval_claimed",
        approval_id=key,
        status=approval.status,
    )


@dataclasses.dataclass
class _Change:
    """A change of a pending approval, its row locked: who makes it, when, and where."""

    approval: Approval
    actor: str
    comment: str
    now: Any
    db: str

    def record(self, action: str, **fields: Any) -> None:
        """Audit the change as *action* (with the change's actor, time and comment)."""
        record_event(
            self.approval,
            action,
            using=self.db,
            actor=self.actor,
            at=self.now,
            comment=self.comment,
            **fields,
        )


@contextlib.contextmanager
def _pending_change(
    approval_id: Any,
    user: Any,
    comment: str,
    using: str | None,
    verb: str,
    may: Callable[[Approval], bool],
) -> Iterator[_Change]:
    """Lock pending approval *approval_id* in a transaction for a change by *user*:
    ``ApprovalPermissionError`` unless *may* (the approval) says they may *verb* it,
    then ``_check_pending``'s errors (``UserJSONError`` first, for a bad comment)."""
    comment = check_comment(comment)
    db = RunRecords(using).db
    actor = _actor(user)
    with write_transaction(db):
        approval = load_locked(approval_id, db)
        key = str(approval.pk)
        if not may(approval):
            raise ApprovalPermissionError(
                f"{actor or 'anonymous'} may not {verb} approval {key}", approval_id=key
            )
        now = timezone.now()
        _check_pending(approval, now)
        yield _Change(approval, actor, comment, now, db)


def claim(
    approval_id: Any, user: Any, *, comment: str = "", using: str | None = None
) -> ClaimResult:
    """Claim pending approval *approval_id* for *user*: from now on only they decide
    it (*comment*, if any, goes to the audit). Raises ``UnknownApprovalError``,
    ``ApprovalPermissionError`` (they may not decide it), ``ApprovalConflictError``
    (claimed by someone else, ``approval_claimed``; decided or cancelled) or
    ``ApprovalExpiredError`` (and ``UserJSONError`` for a bad comment). Claiming it
    again is a no-op."""
    may = functools.partial(can_decide, user)
    with _pending_change(approval_id, user, comment, using, "claim", may) as change:
        approval, actor = change.approval, change.actor
        conflict = claimed_elsewhere(approval, actor)
        if conflict is not None:
            raise conflict
        if approval.claimed_by == actor:
            return ClaimResult(approval, changed=False)
        approval.claimed_by, approval.claimed_at = actor, change.now
        approval.save(using=change.db, update_fields=["claimed_by", "claimed_at"])
        change.record(models.ApprovalEvent.Action.CLAIMED)
    return ClaimResult(approval)


def release(
    approval_id: Any, user: Any, *, comment: str = "", using: str | None = None
) -> ClaimResult:
    """Give back the claim on pending approval *approval_id*: its claimant may, and so
    may a holder of ``reassign_approval`` (for anyone's claim). Raises
    ``UnknownApprovalError``, ``ApprovalPermissionError`` (a user who may neither
    decide nor reassign it), ``ApprovalConflictError`` (claimed by someone else and no
    reassign right, ``approval_claimed``; decided or cancelled) or
    ``ApprovalExpiredError``. Releasing an unclaimed approval is a no-op. *comment*
    as for ``claim``."""
    actor = _actor(user)
    reassigner = user is not None and user.is_active and user.has_perm(REASSIGN)

    def may(approval: Approval) -> bool:
        own = bool(approval.claimed_by) and approval.claimed_by == actor
        return own or reassigner or can_decide(user, approval)

    with _pending_change(approval_id, user, comment, using, "release", may) as change:
        approval = change.approval
        if not approval.claimed_by:
            return ClaimResult(approval, changed=False)
        conflict = None if reassigner else claimed_elsewhere(approval, actor)
        if conflict is not None:
            raise conflict
        holder = approval.claimed_by
        approval.claimed_by, approval.claimed_at = "", None
        approval.save(using=change.db, update_fields=["claimed_by", "claimed_at"])
        change.record(
            models.ApprovalEvent.Action.RELEASED,
            payload={"claimed_by": holder},
            detail="" if holder == actor else f"the claim of {holder} released",
        )
    return ClaimResult(approval)


def check_reassign_target(to_users: Iterable[str], to_group: str | None) -> tuple[list[str], str]:
    """The sorted, stripped, distinct usernames and the group of a reassign; a
    ``ValueError`` when there is neither, or a name is too long or holds NUL."""
    if isinstance(to_users, str):
        to_users = [to_users]
    names = sorted({str(name).strip() for name in to_users} - {""})
    group = str(to_group or "").strip()
    if len(names) > MAX_REASSIGN_USERS:
        raise ValueError(f"reassign to at most {MAX_REASSIGN_USERS} users, not {len(names)}")
    for what, value in [("group", group), *(("user", name) for name in names)]:
        if len(value) > NAME_CHARS or "\x00" in value:
            raise ValueError(
                f"{what} {value[:40]!r} must be at most {NAME_CHARS} characters, no NUL"
            )
    if not names and not group:
        raise ValueError("reassign to at least one user or a group")
    return names, group


def reassign(
    approval_id: Any,
    *,
    by: Any,
    to_users: Iterable[str] = (),
    to_group: str | None = None,
    comment: str = "",
    using: str | None = None,
) -> ClaimResult:
    """Hand pending approval *approval_id* to *to_users* (usernames) and/or
    *to_group* (a group name), as *by*, who needs ``reassign_approval``. Its assignees
    become exactly *to_users* and its group *to_group* (``None``: no group); its
    permission rule stays; its claim is cleared. *comment* (why) goes to the audit.
    *to_users* and *to_group* are notified (``assigned``) once the reassign commits.

    Raises ``ValueError`` (before anything is read) for no target, too many users or
    a bad name (and ``UserJSONError``, a ``ValueError``, for a bad comment), then
    ``UnknownApprovalError``, ``ApprovalPermissionError``, ``ApprovalConflictError``
    (decided or cancelled) or ``ApprovalExpiredError``."""
    names, group = check_reassign_target(to_users, to_group)
    reassigner = by is not None and by.is_active and by.has_perm(REASSIGN)
    with _pending_change(
        approval_id, by, comment, using, "reassign", lambda _: reassigner
    ) as change:
        approval, db = change.approval, change.db
        before = {
            "assignees": approval.assignees,
            "group": approval.group,
            "claimed_by": approval.claimed_by,
        }
        assignments = models.ApprovalAssignee.objects.using(db)
        assignments.filter(approval=approval).delete()
        assignments.bulk_create(
            models.ApprovalAssignee(approval=approval, username=name) for name in names
        )
        approval.group = group
        approval.claimed_by, approval.claimed_at = "", None
        approval.save(using=db, update_fields=["group", "claimed_by", "claimed_at"])
        # The prefetched assignees (if any) are stale now.
        getattr(approval, "_prefetched_objects_cache", {}).pop("assignments", None)
        change.record(
            models.ApprovalEvent.Action.REASSIGNED,
            payload={"from": before, "to": {"assignees": names, "group": group}},
        )
        # The n-th reassign is notification n (the row is locked: the count holds).
        number = (
            models.ApprovalEvent.objects.using(db)
            .filter(approval=approval, action=models.ApprovalEvent.Action.REASSIGNED)
            .count()
        )
        notify(
            approval,
            models.ApprovalNotification.Event.ASSIGNED,
            number,
            users=names,
            group=group,
            using=db,
        )
    return ClaimResult(approval)


aclaim = thread_sensitive_twin(
    claim,
    """``claim`` from async code: the same result, errors and audit events
    (``thread_sensitive=True``, see the module). In an async view pass
    ``await request.auser()``.""",
)
arelease = thread_sensitive_twin(release, """``release`` from async code; see ``aclaim``.""")
areassign = thread_sensitive_twin(reassign, """``reassign`` from async code; see ``aclaim``.""")
