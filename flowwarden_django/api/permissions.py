"""Who may see and do what through the API.

* Runs: holders of ``flowwarden_django.view_workflowrun`` see every run; anyone else
  sees the runs of coordinations that have an approval visible to them
  (``visible_approvals``), so an approver can read what they decide. Cancelling a
  run needs ``flowwarden_django.cancel_workflowrun`` as well, sending it a message
  ``flowwarden_django.send_message_workflowrun``; its messages and events are read
  with the run.
* Snapshots: the same, with ``flowwarden_django.view_snapshotrecord``. Forking needs
  ``flowwarden_django.fork_workflowrun`` as well.
* Approvals: ``visible_approvals(user)``; deciding needs ``can_decide`` (checked, and
  a refusal audited, by ``check_may_decide``).

An object the user may not see is "not found" (404), never "forbidden": only an
action on a visible object is refused with 403.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db.models import QuerySet
from django.utils.translation import gettext_lazy as _
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from ..models import Approval, WorkflowRun
from ..workflows.runs.records import RunRecords
from ..workflows.waiting.approvals import visible_approvals

VIEW_RUNS = "flowwarden_django.view_workflowrun"
VIEW_SNAPSHOTS = "flowwarden_django.view_snapshotrecord"
FORK_RUNS = "flowwarden_django.fork_workflowrun"
CANCEL_RUNS = "flowwarden_django.cancel_workflowrun"
SEND_MESSAGES = "flowwarden_django.send_message_workflowrun"


def api_database() -> str:
    """The database of runs and approvals (the one ``approve``/``reject`` write to)."""
    return RunRecords().db


def readable_approvals(user: Any) -> QuerySet[Approval]:
    """The approvals *user* may see, on the API's database."""
    return visible_approvals(user, using=api_database())


def approval_coordinations(user: Any) -> QuerySet[Approval]:
    """The coordination ids of the approvals *user* may see (a subquery)."""
    return readable_approvals(user).values("coordination_id")


def readable_runs(user: Any) -> QuerySet[WorkflowRun]:
    """The runs *user* may see."""
    rows = WorkflowRun.objects.using(api_database())
    if user.has_perm(VIEW_RUNS):
        return rows.all()
    return rows.filter(coordination_id__in=approval_coordinations(user))


@dataclasses.dataclass(frozen=True)
class SnapshotAccess:
    """Which snapshots a user may read: all (``everything``), or those of
    ``coordinations``."""

    everything: bool
    coordinations: frozenset[str] = frozenset()

    @classmethod
    def of(cls, user: Any) -> SnapshotAccess:
        """The access of *user* (one query when they lack the view permission)."""
        if user.has_perm(VIEW_SNAPSHOTS):
            return cls(everything=True)
        rows = readable_approvals(user).order_by().values_list("coordination_id", flat=True)
        return cls(everything=False, coordinations=frozenset(rows.distinct()))

    @property
    def nothing(self) -> bool:
        return not self.everything and not self.coordinations

    def allows(self, coordination_id: str) -> bool:
        """Whether snapshots of *coordination_id* are readable."""
        return self.everything or coordination_id in self.coordinations


class CanCancelRuns(BasePermission):
    """Cancelling a (visible) run needs ``flowwarden_django.cancel_workflowrun``."""

    message = _("You may not cancel workflow runs.")
    code = "cancel_forbidden"

    def has_object_permission(self, request: Request, view: Any, obj: Any) -> bool:
        return bool(request.user.has_perm(CANCEL_RUNS))


class CanForkRuns(BasePermission):
    """Forking a (visible) snapshot needs ``flowwarden_django.fork_workflowrun``."""

    message = _("You may not fork workflow runs.")
    code = "fork_forbidden"

    def has_object_permission(self, request: Request, view: Any, obj: Any) -> bool:
        return bool(request.user.has_perm(FORK_RUNS))


class CanSendMessages(BasePermission):
    """Sending a message to a (visible) run needs
    ``flowwarden_django.send_message_workflowrun``."""

    message = _("You may not send messages to workflow runs.")
    code = "send_message_forbidden"

    def has_object_permission(self, request: Request, view: Any, obj: Any) -> bool:
        return bool(request.user.has_perm(SEND_MESSAGES))
