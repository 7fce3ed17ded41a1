"""Asking for an approval: ``await_approval(...)`` from a step, and the ``Approval``
row it makes once the pause is persisted.

The request is written into the paused snapshot's metadata too, so a run whose
approval row was never made (the process died between the snapshot and the row) gets
it back from the sweep (``sweep_approvals``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from django.db import IntegrityError, transaction
from django.utils import timezone

from ....common.app_models import models
from ...definition.decisions import ApprovalDecision
from ...definition.metadata import LAST_STEP, WORKFLOW_NAME
from ...definition.steps import Pause
from ...runs.records import RunStatus
from .forms import build_form, check_initial, form_path
from .notifications import notify

if TYPE_CHECKING:
    from ....models import Approval
    from ...storage.snapshot import WorkflowSnapshot

logger = logging.getLogger("flowwarden_django.workflows")

#: Snapshot metadata key holding the approval request (JSON).
REQUEST_METADATA = "approval.request"
#: What an expired approval does to its run.
ON_EXPIRY_CHOICES = ("resume", "fail")


#: The longest ``remind_every`` or ``escalate_after`` (100 years): anything longer is
#: a mistake, and would overflow a datetime.
MAX_SECONDS = 100 * 366 * 24 * 3600.0


def _seconds(value: timedelta | float | int | None, what: str = "expires_in") -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{what} must be a timedelta or a number of seconds, not a bool")
    if what != "expires_in" and not isinstance(value, timedelta | int | float):
        raise TypeError(f"{what} must be a timedelta or a number of seconds, not {value!r}")
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds <= 0:
        raise ValueError(f"{what} must be positive, not {value!r}")
    if what != "expires_in" and not seconds <= MAX_SECONDS:  # NaN fails this too
        raise ValueError(f"{what} must be at most 100 years, not {value!r}")
    return seconds


@dataclasses.dataclass(frozen=True)
class AwaitApproval(Pause):
    """Persist *state* and wait for a person's decision (the run's status is
    ``waiting``). Made by ``await_approval``; see there."""

    prompt: str = ""
    assignees: tuple[str, ...] = ()
    group: str = ""
    permission: str = ""
    expires_in: float | None = None
    on_expiry: str = "resume"
    form: str = ""
    form_initial: dict[str, Any] | None = None
    remind_every: float | None = None
    escalate_after: float | None = None
    escalate_to_group: str = ""
    escalate_to_users: tuple[str, ...] = ()
    status: ClassVar[str] = RunStatus.WAITING

    @classmethod
    def from_request(cls, state: Any, request: dict[str, Any]) -> AwaitApproval:
        """The pause that asks *request* (from ``request``) again, for *state*."""
        return cls(
            state,
            prompt=str(request.get("prompt") or ""),
            assignees=tuple(request.get("assignees") or ()),
            group=str(request.get("group") or ""),
            permission=str(request.get("permission") or ""),
            expires_in=request.get("expires_in"),
            on_expiry=request.get("on_expiry") or "resume",
            form=str(request.get("form") or ""),
            form_initial=request.get("form_initial"),
            remind_every=request.get("remind_every"),
            escalate_after=request.get("escalate_after"),
            escalate_to_group=str(request.get("escalate_to_group") or ""),
            escalate_to_users=tuple(request.get("escalate_to_users") or ()),
        )

    def request(self) -> dict[str, Any]:
        """The request as JSON-able data (kept in the paused snapshot's metadata)."""
        return {
            "prompt": self.prompt,
            "assignees": list(self.assignees),
            "group": self.group,
            "permission": self.permission,
            "expires_in": self.expires_in,
            "on_expiry": self.on_expiry,
            "form": self.form,
            "form_initial": self.form_initial,
            "remind_every": self.remind_every,
            "escalate_after": self.escalate_after,
            "escalate_to_group": self.escalate_to_group,
            "escalate_to_users": list(self.escalate_to_users),
        }

    def snapshot_metadata(self) -> dict[str, str]:
        return {REQUEST_METADATA: json.dumps(self.request(), sort_keys=True)}

    def persist_with(self, workflow: Any, snapshot: WorkflowSnapshot) -> None:
        request_approval(snapshot, self.request(), using=workflow.runs.db)


def await_approval(
    state: Any,
    prompt: str = "",
    *,
    assignees: Iterable[str] = (),
    group: str = "",
    permission: str = "",
    expires_in: timedelta | float | None = None,
    on_expiry: str = "resume",
    form: type[Any] | str | None = None,
    initial: Mapping[str, Any] | None = None,
    remind_every: timedelta | float | None = None,
    escalate_after: timedelta | float | None = None,
    escalate_to: str | Iterable[str] | None = None,
) -> AwaitApproval:
    """Persist *state* and wait for an approval; the next step gets the decision::

        @step
        def review(state):
            if state["amount"] < 1000:
                return advance(state)
            return await_approval(state, f"Refund {state['amount']}?", group="finance",
                                  expires_in=timedelta(hours=48))

        @step
        def refund(state, ctx):
            if ctx.decision is None or not ctx.decision.approved:  # no approval needed,
                ...                                              # or rejected/expired

    *assignees* (usernames), *group* (a group name) and *permission*
    ("app_label.codename") say who may decide, besides holders of
    ``flowwarden_django.decide_approval``. After *expires_in* (a timedelta or
    seconds; ``None``: never) the sweep expires it: ``on_expiry="resume"`` continues
    the run with an ``expired`` decision, ``"fail"`` fails the run.

    *form* (a Django ``Form`` class or its import path; its path is stored) validates
    an approval's payload, shown with *initial* (JSON-able data); the next step gets
    its ``cleaned_data``, JSON-safe, as ``ctx.decision.payload`` (see ``forms``).

    Every *remind_every* (a timedelta or seconds) while it is pending, its assignees
    and group are reminded (``approval_reminded``, an email with
    ``FLOWWARDEN["APPROVAL_EMAILS"]``). After *escalate_after* it escalates once to
    *escalate_to*: a group name (a ``str``; it becomes the approval's group) or an
    iterable of usernames (added to its assignees). See ``approvals.reminders``.
    """
    if on_expiry not in ON_EXPIRY_CHOICES:
        raise ValueError(f"on_expiry must be one of {ON_EXPIRY_CHOICES}, not {on_expiry!r}")
    if isinstance(assignees, str):
        assignees = [assignees]
    names = tuple(sorted({str(name).strip() for name in assignees} - {""}))
    if permission and "." not in permission:
        raise ValueError(f"permission must look like 'app_label.codename', not {permission!r}")
    to_group, to_users = _escalation_target(escalate_to)
    if (escalate_after is None) != (escalate_to is None):
        raise ValueError("escalate_after and escalate_to go together: give both or neither")
    if escalate_to is not None and not (to_group or to_users):
        raise ValueError("escalate_to names no group and no user")
    for what, value, most in [
        ("group", group or "", 150),
        ("permission", permission or "", 255),
        ("escalate_to", to_group, 150),
        *(("assignee", name, 150) for name in names),
        *(("escalate_to user", name, 150) for name in to_users),
    ]:
        if len(value) > most or "\x00" in value:
            raise ValueError(f"{what} {value[:40]!r} must be at most {most} characters, no NUL")
    path = "" if form is None else form_path(form)
    if initial is not None and not path:
        raise ValueError("initial is the initial data of a form: pass form= too")
    initial = check_initial(initial)
    if path:  # made once now, so a form that cannot be made fails the step, not the page
        build_form(path, initial=initial, error=ValueError)
    return AwaitApproval(
        state,
        prompt=str(prompt),
        assignees=names,
        group=str(group or ""),
        permission=str(permission or ""),
        expires_in=_seconds(expires_in),
        on_expiry=on_expiry,
        form=path,
        form_initial=initial,
        remind_every=_seconds(remind_every, "remind_every"),
        escalate_after=_seconds(escalate_after, "escalate_after"),
        escalate_to_group=to_group,
        escalate_to_users=to_users,
    )


def _escalation_target(escalate_to: str | Iterable[str] | None) -> tuple[str, tuple[str, ...]]:
    """``escalate_to`` as (a group name, usernames): a ``str`` is a group."""
    if escalate_to is None:
        return "", ()
    if isinstance(escalate_to, str):
        return escalate_to.strip(), ()
    if isinstance(escalate_to, bytes | dict) or not isinstance(escalate_to, Iterable):
        raise TypeError(f"escalate_to must be a group name or usernames, not {escalate_to!r}")
    names = []
    for name in escalate_to:
        if not isinstance(name, str):
            raise TypeError(f"escalate_to usernames must be strings, not {name!r}")
        names.append(name.strip())
    return "", tuple(sorted(set(names) - {""}))


def _duration(seconds: Any) -> timedelta | None:
    return None if seconds is None else timedelta(seconds=float(seconds))


def request_from_snapshot(snapshot: WorkflowSnapshot) -> dict[str, Any] | None:
    """The approval request stored in a paused snapshot's metadata, if any."""
    raw = (snapshot.metadata or {}).get(REQUEST_METADATA)
    if not raw:
        return None
    try:
        request = json.loads(raw)
    except ValueError:
        logger.warning("snapshot %s has an unreadable approval request %r", snapshot.id, raw)
        return None
    return request if isinstance(request, dict) else None


def decision_on(snapshot: WorkflowSnapshot, *, using: str) -> ApprovalDecision | None:
    """The decision on the approval paused *snapshot* asked for, read from its
    ``Approval`` row: approved, rejected, or expired with ``on_expiry="resume"``.
    ``None`` while it is pending, or when it was closed without a decision the run
    can use (cancelled, or expired with ``on_expiry="fail"``): then the run waits, or
    asks again. Whatever a resume input claims plays no part."""
    usable = (
        models.Approval.Status.APPROVED,
        models.Approval.Status.REJECTED,
        models.Approval.Status.EXPIRED,
    )
    approval = (
        models.Approval.objects.using(using)
        .filter(snapshot_id=snapshot.id, status__in=usable)
        .exclude(status=models.Approval.Status.EXPIRED, on_expiry=models.Approval.OnExpiry.FAIL)
        .first()
    )
    return None if approval is None else ApprovalDecision.from_row(approval)


def request_approval(
    snapshot: WorkflowSnapshot, request: dict[str, Any], *, using: str
) -> Approval:
    """Make the ``Approval`` of paused *snapshot* (once: an existing one is returned),
    with its assignees and its ``requested`` audit event, in one transaction."""
    existing = models.Approval.objects.using(using).filter(snapshot_id=snapshot.id).first()
    if existing is not None:
        return existing
    # From the pause, not from now: an approval restored by the sweep keeps its deadline.
    now = snapshot.created_at or timezone.now()
    seconds = request.get("expires_in")
    approval = models.Approval(
        id=uuid.uuid4(),
        coordination_id=snapshot.coordination_id,
        workflow_name=snapshot.metadata.get(WORKFLOW_NAME, snapshot.agent_name or ""),
        step_name=snapshot.metadata.get(LAST_STEP, ""),
        snapshot_id=snapshot.id,
        prompt=request.get("prompt") or "",
        group=request.get("group") or "",
        permission=request.get("permission") or "",
        requested_at=now,
        expires_at=None if seconds is None else now + timedelta(seconds=float(seconds)),
        on_expiry=request.get("on_expiry") or "resume",
        form=str(request.get("form") or "")[:255],
        form_initial=request.get("form_initial"),
        remind_every=_duration(request.get("remind_every")),
        escalate_to_group=request.get("escalate_to_group") or "",
        escalate_to_users=list(request.get("escalate_to_users") or ()) or None,
    )
    if approval.remind_every is not None:
        approval.next_reminder_at = now + approval.remind_every
    if (escalate_after := _duration(request.get("escalate_after"))) is not None:
        approval.escalate_at = now + escalate_after
    try:
        with transaction.atomic(using=using):
            approval.save(using=using, force_insert=True)
            models.ApprovalAssignee.objects.using(using).bulk_create(
                models.ApprovalAssignee(approval=approval, username=name)
                for name in request.get("assignees") or ()
            )
            models.ApprovalEvent.objects.using(using).create(
                approval=approval,
                action=models.ApprovalEvent.Action.REQUESTED,
                at=now,
                comment=approval.prompt,
                payload=request,
            )
            notify(approval, models.ApprovalNotification.Event.REQUESTED, using=using)
    except IntegrityError:  # made meanwhile (a sweep restoring it, say)
        return models.Approval.objects.using(using).get(snapshot_id=snapshot.id)
    return approval
