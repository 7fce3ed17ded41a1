"""``manage.py flowwarden_approvals``: list, show, approve, reject and expire approvals.

A thin layer over ``flowwarden_django.workflows.waiting.approvals``. Decisions made here are
audited under the ``--by`` user's name, like decisions made in the admin or the API.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from ...common.formatting import NONE_TEXT, dump_json, format_table, timestamp_text, truncate
from ...common.user_input import UserJSONError, check_comment, parse_decision_payload
from ...models import Approval
from ...workflows.waiting.approvals import (
    ApprovalError,
    DecisionResult,
    decide,
    sweep_approvals,
)
from ..base import ActionCommand, positive_int

STATUSES = tuple(Approval.Status.values)
LIST_HEADERS = ("ID", "WORKFLOW", "COORDINATION", "STEP", "STATUS", "REQUESTED", "EXPIRES")


class Command(ActionCommand):
    """Operators' view of approvals, and the expiry sweep."""

    database_subject = "The approval tables"

    help = (
        "Work with workflow approvals: list them, show one with its audit trail, approve or "
        "reject one as a user, and expire due ones (the sweep; run it from cron or beat the "
        "flowwarden_django.expire_approvals task)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(
            dest="action", required=True, title="actions", metavar="ACTION"
        )
        listing = actions.add_parser("list", help="Show approvals, newest first.")
        listing.add_argument(
            "--status",
            choices=STATUSES,
            metavar="STATUS",
            help=f"One of: {', '.join(STATUSES)} (default: all).",
        )
        listing.add_argument("--limit", type=int, default=50, help="At most N (default 50).")
        listing.add_argument("--json", action="store_true", help="Print a JSON list.")

        show = actions.add_parser("show", help="Show one approval and its audit trail.")
        show.add_argument("approval", metavar="ID")
        show.add_argument("--json", action="store_true", help="Print a JSON object.")

        for verb in ("approve", "reject"):
            deciding = actions.add_parser(verb, help=f"{verb.capitalize()} an approval.")
            deciding.add_argument("approval", metavar="ID")
            deciding.add_argument(
                "--by", required=True, metavar="USERNAME", help="Who decides (audited)."
            )
            deciding.add_argument("--comment", default="", help="A comment for the audit.")
            deciding.add_argument(
                "--payload", metavar="JSON", help="A JSON value handed to the next step."
            )
            deciding.add_argument(
                "--force",
                action="store_true",
                help="Decide even when the user is not one of the approval's deciders.",
            )

        expire = actions.add_parser(
            "expire",
            help="Expire due approvals, cancel those whose run moved on, restore missing ones.",
        )
        expire.add_argument(
            "--limit", type=positive_int, default=500, help="At most N of each kind."
        )

    def handle_list(self, *, status: str | None, limit: int, json: bool, **_: Any) -> None:
        rows = Approval.objects.all()
        if status:
            rows = rows.filter(status=status)
        approvals = list(rows.order_by("-requested_at")[: max(limit, 0) or None])
        if json:
            self.stdout.write(dump_json([_approval_json(a) for a in approvals]))
            return
        if not approvals:
            self.stdout.write("No approvals." if not status else f"No {status} approvals.")
            return
        now = timezone.now()
        table = [
            (
                str(a.pk),
                a.workflow_name,
                truncate(a.coordination_id, 36),
                a.step_name,
                a.status,
                timestamp_text(a.requested_at, now),
                timestamp_text(a.expires_at, now) if a.expires_at else NONE_TEXT,
            )
            for a in approvals
        ]
        for line in format_table(LIST_HEADERS, table):
            self.stdout.write(line)

    def handle_show(self, *, approval: str, json: bool, **_: Any) -> None:
        found = _get(approval)
        if json:
            self.stdout.write(dump_json(_approval_json(found, events=True)))
            return
        now = timezone.now()
        fields = [
            ("Approval", str(found.pk)),
            ("Status", found.status),
            ("Prompt", found.prompt or NONE_TEXT),
            ("Workflow", found.workflow_name),
            ("Coordination", found.coordination_id),
            ("Step", found.step_name),
            ("Snapshot", found.snapshot_id),
            ("Assignees", ", ".join(found.assignees) or NONE_TEXT),
            ("Group", found.group or NONE_TEXT),
            ("Permission", found.permission or NONE_TEXT),
            ("Requested", timestamp_text(found.requested_at, now)),
            ("Expires", timestamp_text(found.expires_at, now) if found.expires_at else "never"),
            ("On expiry", found.on_expiry),
            ("Decided by", found.decided_by or NONE_TEXT),
            ("Decided", timestamp_text(found.decided_at, now) if found.decided_at else NONE_TEXT),
            ("Comment", found.comment or NONE_TEXT),
            ("Payload", dump_json(found.payload) if found.payload is not None else NONE_TEXT),
        ]
        width = max(len(name) for name, _ in fields)
        for name, value in fields:
            self.stdout.write(f"{name:<{width}}  {value}")
        self.stdout.write("\nAudit trail:")
        for event in found.events.all():
            actor = event.actor or "system"
            detail = f" ({event.detail})" if event.detail else ""
            self.stdout.write(f"  {event.at:%Y-%m-%d %H:%M:%S}  {event.action:<9} {actor}{detail}")

    def handle_approve(self, **options: Any) -> None:
        self._decide("approved", **options)

    def handle_reject(self, **options: Any) -> None:
        self._decide("rejected", **options)

    def _decide(
        self,
        decision: str,
        *,
        approval: str,
        by: str,
        comment: str,
        payload: str | None,
        force: bool,
        **_: Any,
    ) -> None:
        user = _user(by)
        value = _parse_payload(payload)
        comment = _check_comment(comment)
        try:
            result: DecisionResult = decide(
                approval, decision, user, comment=comment, payload=value, check_permission=not force
            )
        except ApprovalError as exc:
            raise CommandError(f"{exc} [{exc.code}]{_next_step(exc.code)}") from exc
        verb = "was already" if result.repeated else "is now"
        self.stdout.write(f"Approval {result.approval.pk} {verb} {result.approval.status}.")
        if result.run_result is not None:
            self.stdout.write(
                f"Run {result.approval.coordination_id} resumed: {result.run_result.status}."
            )
        if result.warning:  # this process does not define the run's workflow
            self.stdout.write(self.style.WARNING(result.warning))

    def handle_expire(self, *, limit: int, **_: Any) -> None:
        result = sweep_approvals(limit=limit)
        self.stdout.write(
            f"Expired {len(result.expired)}, cancelled {len(result.cancelled)}, "
            f"restored {len(result.restored)} approval(s)."
        )
        for kind, ids in result.as_dict().items():
            for value in ids:
                self.stdout.write(f"  {kind}: {value}")


def _next_step(code: str) -> str:
    """What to do after a refused decision with error *code*, or ``""``."""
    if code == "approval_forbidden":
        return " (add --force to decide as an operator)"
    if code == "approval_not_found":
        return (
            ". `manage.py flowwarden_approvals list --status pending` shows the pending "
            "approvals and their ids"
        )
    return ""


def _get(approval_id: str) -> Approval:
    try:
        return Approval.objects.get(pk=approval_id)
    except (Approval.DoesNotExist, ValidationError, ValueError):
        raise CommandError(
            f"No approval {approval_id!r}. `manage.py flowwarden_approvals list` shows them."
        ) from None


def _user(username: str) -> Any:
    model = get_user_model()
    try:
        return model._default_manager.get_by_natural_key(username)
    except model.DoesNotExist:
        raise CommandError(
            f"No user {username!r}. Pass --by with an existing username "
            "(`manage.py createsuperuser` makes one)."
        ) from None


def _parse_payload(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return parse_decision_payload(text, what="--payload")
    except UserJSONError as exc:
        raise CommandError(
            f'{exc}. Give a JSON object, for example --payload \'{{"note": "ok"}}\'.'
        ) from exc


def _check_comment(text: str) -> str:
    try:
        return check_comment(text, what="--comment")
    except UserJSONError as exc:
        raise CommandError(f"{exc}.") from exc


def _approval_json(approval: Approval, *, events: bool = False) -> dict[str, Any]:
    data = {
        "id": str(approval.pk),
        "status": approval.status,
        "prompt": approval.prompt,
        "workflow": approval.workflow_name,
        "coordination_id": approval.coordination_id,
        "step": approval.step_name,
        "snapshot_id": approval.snapshot_id,
        "assignees": approval.assignees,
        "group": approval.group,
        "permission": approval.permission,
        "requested_at": approval.requested_at.isoformat(),
        "expires_at": approval.expires_at.isoformat() if approval.expires_at else None,
        "on_expiry": approval.on_expiry,
        "decided_by": approval.decider,
        "decided_at": approval.decided_at.isoformat() if approval.decided_at else None,
        "comment": approval.comment,
        "payload": approval.payload,
    }
    if events:
        data["events"] = [
            {
                "action": e.action,
                "actor": e.actor,
                "at": e.at.isoformat(),
                "comment": e.comment,
                "detail": e.detail,
            }
            for e in approval.events.all()
        ]
    return data
