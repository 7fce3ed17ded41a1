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

if TYPE_CHECKING:
    from ....models import Approval
    from ...storage.snapshot import WorkflowSnapshot

logger = logging.getLogger("flowwarden_django.workflows")

#: Snapshot metadata key holding the approval request (JSON).
REQUEST_METADATA = "approval.request"
#: What an expired approval does to its run.
ON_EXPIRY_CHOICES = ("resume", "fail")


def _seconds(expires_in: timedelta | float | int | None) -> float | None:
    if expires_in is None:
        return None
    if isinstance(expires_in, bool):
        raise TypeError("expires_in must be a timedelta or a number of seconds, not a bool")
    seconds = expires_in.total_seconds() if isinstance(expires_in, timedelta) else float(expires_in)
    if seconds <= 0:
        raise ValueError(f"expires_in must be positive, not {expires_in!r}")
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
    """
    if on_expiry not in ON_EXPIRY_CHOICES:
        raise ValueError(f"on_expiry must be one of {ON_EXPIRY_CHOICES}, not {on_expiry!r}")
    if isinstance(assignees, str):
        assignees = [assignees]
    names = tuple(sorted({str(name).strip() for name in assignees} - {""}))
    if permission and "." not in permission:
        raise ValueError(f"permission must look like 'app_label.codename', not {permission!r}")
    for what, value, most in [
        ("group", group or "", 150),
        ("permission", permission or "", 255),
        *(("assignee", name, 150) for name in names),
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
    )


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
    )
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
    except IntegrityError:  # made meanwhile (a sweep restoring it, say)
        return models.Approval.objects.using(using).get(snapshot_id=snapshot.id)
    return approval
