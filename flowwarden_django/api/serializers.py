"""What the API sends and accepts: runs, snapshots, approvals, decisions, errors."""

from __future__ import annotations

import base64
import dataclasses
import enum
import logging
import math
import uuid
from collections.abc import Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.utils.translation import gettext_lazy as _
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..common.user_input import (
    MAX_COMMENT_CHARS,
    MAX_PAYLOAD_BYTES,
    UserJSONError,
    check_comment,
    check_message_payload,
    check_user_json,
)
from ..models import Approval, ApprovalEvent, WorkflowEvent, WorkflowMessage, WorkflowRun
from ..workflows.definition.registry import store_for_workflow
from ..workflows.execution.step_timings import step_timing_of
from ..workflows.storage.snapshot import UnreadableSnapshot, WorkflowSnapshot
from ..workflows.waiting.approvals import can_decide, describe_form
from ..workflows.waiting.approvals.due import due_times
from ..workflows.waiting.cancellation import REASON_LIMIT
from ..workflows.waiting.messages.mailbox import MAX_NAME_CHARS, check_name
from .approval_forms import form_field_schema
from .permissions import readable_approvals

logger = logging.getLogger("flowwarden_django.api")

# -- workflow state as JSON ------------------------------------------------------------


def json_safe(value: Any) -> Any:
    """*value* (a workflow state, decoded by its store) as plain JSON.

    Values plain JSON lacks are shown in their usual text form: date and time types
    in ISO 8601, ``Decimal`` and ``UUID`` as strings, ``timedelta`` in seconds,
    ``bytes`` in base64, sets and tuples as arrays, dataclasses as objects, enums as
    their value, non-string keys as strings, NaN and infinities as strings. Anything
    else is shown as ``str(value)``.
    """
    if isinstance(value, enum.Enum):
        return json_safe(value.value)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {_json_key(key): json_safe(item) for key, item in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_safe(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple | set | frozenset):
        return [json_safe(item) for item in value]
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Decimal | uuid.UUID):
        return str(value)
    return str(value)


def _json_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    safe = json_safe(key)
    return safe if isinstance(safe, str) else str(safe)


@extend_schema_field(OpenApiTypes.ANY)
class StateField(serializers.Field):
    """A workflow state, read-only, as plain JSON (see ``json_safe``)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs["read_only"] = True
        super().__init__(**kwargs)

    def to_representation(self, value: Any) -> Any:
        return json_safe(value)


class ErrorSerializer(serializers.Serializer):
    """An error body: a stable code and a message (validation errors add field messages)."""

    code = serializers.CharField(help_text=_("A stable machine-readable code."))
    detail = serializers.CharField(help_text=_("A human-readable message."))


# -- runs ------------------------------------------------------------------------------


class ReadOnlyModelSerializer(serializers.ModelSerializer):
    """A model serializer whose every field (``Meta.fields``) is read-only: a row as
    the API shows it."""

    def get_extra_kwargs(self) -> dict[str, Any]:
        extra = super().get_extra_kwargs()
        for name in self.Meta.fields:
            extra[name] = {**extra.get(name, {}), "read_only": True}
        return extra


def _nullable_text(help_text: Any, source: str | None = None) -> serializers.CharField:
    """A read-only text field that may be null, read from *source* (default: the
    field's own name)."""
    return serializers.CharField(
        source=source, read_only=True, allow_null=True, help_text=help_text
    )


#: The statuses whose ``wake_at`` means something: a sleep's end, a wait's timeout.
WAKING_STATUSES = (WorkflowRun.Status.SLEEPING, WorkflowRun.Status.WAITING_MESSAGE)


class RunSerializer(ReadOnlyModelSerializer):
    """A workflow run in a list."""

    workflow = serializers.CharField(source="workflow_name", read_only=True)
    version = serializers.IntegerField(
        source="workflow_version",
        read_only=True,
        help_text=_("The version of the workflow's definition the run is on."),
    )
    parent = _nullable_text(
        _("The run that started this one (spawn), or null."), source="parent_coordination_id"
    )
    wake_at = serializers.SerializerMethodField(
        help_text=_(
            "When a sleeping run wakes, or when a run waiting for a message stops waiting "
            "(its timeout); null otherwise."
        )
    )
    waiting_topic = serializers.SerializerMethodField(
        help_text=_(
            "The topic a run waiting for a message (status waiting_message) waits for; "
            "null otherwise."
        )
    )

    class Meta:
        model = WorkflowRun
        fields = [
            "coordination_id",
            "workflow",
            "version",
            "status",
            "last_step",
            "head_snapshot_id",
            "failure_reason",
            "wake_at",
            "waiting_topic",
            "parent",
            "created_at",
            "updated_at",
        ]

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_wake_at(self, run: WorkflowRun) -> str | None:
        if run.status not in WAKING_STATUSES or run.wake_at is None:
            return None
        return serializers.DateTimeField().to_representation(run.wake_at)

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_waiting_topic(self, run: WorkflowRun) -> str | None:
        if run.status != WorkflowRun.Status.WAITING_MESSAGE:
            return None
        return run.waiting_topic


class CancelSerializer(serializers.Serializer):
    """``POST .../cancel/``: why the run is cancelled (kept on the run and in the
    audit of its approvals)."""

    reason = serializers.CharField(
        max_length=REASON_LIMIT,
        required=False,
        allow_blank=True,
        default="",
        help_text=_("Why the run is cancelled."),
    )


class RunDetailSerializer(RunSerializer):
    """A workflow run, with the ids of its pending approvals the user may see."""

    pending_approvals = serializers.SerializerMethodField(
        help_text=_("Ids of the run's pending approvals visible to you.")
    )

    class Meta(RunSerializer.Meta):
        fields = [*RunSerializer.Meta.fields, "pending_approvals"]

    @extend_schema_field(serializers.ListField(child=serializers.UUIDField()))
    def get_pending_approvals(self, run: WorkflowRun) -> list[str]:
        user = self.context["request"].user
        rows = readable_approvals(user).filter(
            coordination_id=run.coordination_id, status=Approval.Status.PENDING
        )
        return [str(pk) for pk in rows.values_list("pk", flat=True)]


# -- snapshots -------------------------------------------------------------------------


class AttemptErrorSerializer(serializers.Serializer):
    """A failed attempt of a step (``message`` only in a snapshot's detail)."""

    attempt = serializers.IntegerField()
    error = serializers.CharField(help_text=_("The exception's class."))
    message = serializers.CharField(required=False)


class StepTimingSerializer(serializers.Serializer):
    """How the step that wrote a snapshot ran."""

    duration_ms = serializers.FloatField(allow_null=True)
    attempts = serializers.IntegerField(allow_null=True)
    errors = AttemptErrorSerializer(many=True)


class SnapshotSerializer(serializers.Serializer):
    """A snapshot in a list: where it sits, not what it holds."""

    id = serializers.CharField(read_only=True)
    coordination_id = serializers.CharField(read_only=True)
    parent_id = serializers.CharField(read_only=True, allow_null=True)
    agent_name = serializers.CharField(read_only=True, allow_null=True)
    seq = serializers.IntegerField(read_only=True, allow_null=True)
    is_root = serializers.BooleanField(read_only=True)
    created_at = serializers.DateTimeField(read_only=True)
    error = serializers.SerializerMethodField(
        help_text=_(
            "null, or {code: snapshot_unreadable, detail} when the store cannot read the "
            "row (a wrong key, tampered data)."
        )
    )

    step = serializers.SerializerMethodField(
        help_text=_(
            "null, or how the step that wrote the snapshot ran: duration_ms (its last "
            "attempt), attempts, and errors [{attempt, error}] of the attempts that "
            "failed (their messages in the snapshot's detail)."
        )
    )

    #: Whether error messages show (they may quote the state: only with it).
    with_messages = False

    @extend_schema_field(ErrorSerializer(allow_null=True))
    def get_error(self, snapshot: WorkflowSnapshot) -> dict[str, str] | None:
        if not isinstance(snapshot, UnreadableSnapshot):
            return None
        return {"code": "snapshot_unreadable", "detail": snapshot.error}

    @extend_schema_field(StepTimingSerializer(allow_null=True))
    def get_step(self, snapshot: WorkflowSnapshot) -> dict[str, Any] | None:
        timing = step_timing_of(snapshot.metadata or {})
        return None if timing is None else timing.as_dict(with_messages=self.with_messages)


class SnapshotDetailSerializer(SnapshotSerializer):
    """A snapshot with its metadata and state (as JSON), and its step's errors with
    their messages."""

    metadata = serializers.DictField(child=serializers.CharField(), read_only=True)
    state = StateField()
    with_messages = True


def _checked(value: Any, **limits: Any) -> Any:
    """*value* through ``check_user_json`` (a field error when refused)."""
    try:
        return check_user_json(value, **limits)
    except UserJSONError as exc:
        raise serializers.ValidationError(str(exc), code=exc.code) from None


class ForkSerializer(serializers.Serializer):
    """``POST .../fork/``: the new branch's state (any JSON, null included, within
    the limits of ``common.user_input``)."""

    state = serializers.JSONField(allow_null=True, help_text=_("The forked snapshot's state."))

    def validate_state(self, value: Any) -> Any:
        return _checked(value, what="state")


def snapshot_data(snapshot: WorkflowSnapshot, detail: bool = False) -> dict[str, Any]:
    """The representation of one snapshot (with state and metadata when *detail*)."""
    kind = SnapshotDetailSerializer if detail else SnapshotSerializer
    return kind(snapshot).data


# -- approvals -------------------------------------------------------------------------


class ApprovalEventSerializer(ReadOnlyModelSerializer):
    """One entry of an approval's audit trail."""

    class Meta:
        model = ApprovalEvent
        fields = ["action", "actor", "at", "comment", "payload", "detail"]


class ApprovalSerializer(ReadOnlyModelSerializer):
    """An approval in a list."""

    workflow = serializers.CharField(source="workflow_name", read_only=True)
    step = serializers.CharField(source="step_name", read_only=True)
    assignees = serializers.ListField(child=serializers.CharField(), read_only=True)
    decided_by = _nullable_text(
        _("Username of the decider (null until decided, and for an expiry)."), source="decider"
    )
    claimed_by = serializers.SerializerMethodField(
        help_text=_(
            "Username of who claimed it (null: unclaimed). While it is claimed only they decide it."
        )
    )
    overdue = serializers.SerializerMethodField(
        help_text=_(
            "Whether it is pending past its escalation time or its expiry (the inbox's "
            '"overdue" filter).'
        )
    )

    class Meta:
        model = Approval
        fields = [
            "id",
            "coordination_id",
            "workflow",
            "step",
            "snapshot_id",
            "prompt",
            "status",
            "assignees",
            "group",
            "permission",
            "requested_at",
            "expires_at",
            "on_expiry",
            "decided_at",
            "decided_by",
            "comment",
            "payload",
            "claimed_by",
            "claimed_at",
            "escalate_at",
            "escalated_at",
            "next_reminder_at",
            "reminders_sent",
            "overdue",
        ]

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_claimed_by(self, approval: Approval) -> str | None:
        return approval.claimed_by or None

    def get_overdue(self, approval: Approval) -> bool:
        return due_times(approval).overdue


class ApprovalDecidedSerializer(ApprovalSerializer):
    """An approval with the paused run's state and whether the user may decide it:
    what a decision returns (the same body for a repeated decision)."""

    state = serializers.SerializerMethodField(
        help_text=_("The state of the paused snapshot (null when it is gone).")
    )
    can_decide = serializers.SerializerMethodField(
        help_text=_(
            "Whether you may decide it now (it is pending, you are a decider, and nobody "
            "else claimed it)."
        )
    )

    warnings = serializers.SerializerMethodField(
        help_text=_(
            "What the decider should know, in words; empty as a rule. For example: this "
            "server does not define the run's workflow, so the decision is recorded but "
            "the run continues only where the workflow is defined."
        )
    )

    class Meta(ApprovalSerializer.Meta):
        fields = [*ApprovalSerializer.Meta.fields, "state", "can_decide", "warnings"]

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_warnings(self, approval: Approval) -> list[str]:
        """The decision's warnings (``context["warnings"]``)."""
        return list(self.context.get("warnings", ()))

    @extend_schema_field(OpenApiTypes.ANY)
    def get_state(self, approval: Approval) -> Any:
        try:
            snapshot = store_for_workflow(approval.workflow_name).load(approval.snapshot_id)
        except Exception:  # an unreadable store must not hide the approval (or a decision)
            logger.exception("the snapshot of approval %s could not be read", approval.pk)
            return None
        return None if snapshot is None else json_safe(snapshot.state)

    def get_can_decide(self, approval: Approval) -> bool:
        """Whether the user may decide it now: it is pending, they are a decider, and
        nobody else claimed it."""
        user = self.context["request"].user
        pending = approval.status == Approval.Status.PENDING
        mine = not approval.claimed_by or approval.claimed_by == user.get_username()
        return pending and mine and can_decide(user, approval)


class ApprovalDetailSerializer(ApprovalDecidedSerializer):
    """An approval with its audit trail."""

    events = ApprovalEventSerializer(many=True, read_only=True)
    form = serializers.SerializerMethodField(
        help_text=_(
            "The form that validates an approving decision's payload (null: any JSON "
            "object), with its fields, so a client can build it."
        )
    )

    class Meta(ApprovalDecidedSerializer.Meta):
        fields = [*ApprovalSerializer.Meta.fields, "state", "can_decide", "form", "events"]

    @form_field_schema
    def get_form(self, approval: Approval) -> dict[str, Any] | None:
        return describe_form(approval)


class DecisionSerializer(serializers.Serializer):
    """``POST .../approve/`` or ``.../reject/``: an optional comment and payload (a JSON
    object handed to the next step, at most ``MAX_PAYLOAD_BYTES`` serialised)."""

    comment = serializers.CharField(max_length=MAX_COMMENT_CHARS, allow_blank=True, default="")
    payload = serializers.DictField(
        allow_null=True,
        default=None,
        help_text=_(
            "A JSON object handed to the next step. When the approval has a form (its "
            "`form` in GET /approvals/<id>/), approving validates the payload with that "
            "form: a 400 carries the form's field errors under `payload`, and the next "
            "step gets the form's cleaned data. Rejecting takes any object."
        ),
    )

    def validate_comment(self, value: str) -> str:
        try:
            return check_comment(value)
        except UserJSONError as exc:
            raise serializers.ValidationError(str(exc), code=exc.code) from None

    def validate_payload(self, value: Any) -> Any:
        return _checked(value, what="payload", max_bytes=MAX_PAYLOAD_BYTES, require_object=True)


# -- messages and events ---------------------------------------------------------------


def _refused(check: Any, value: Any, *args: Any) -> Any:
    """*value* through the core's *check* (a field error, with its code, when refused)."""
    try:
        return check(value, *args)
    except UserJSONError as exc:
        raise serializers.ValidationError(str(exc), code=exc.code) from None


@extend_schema_field(OpenApiTypes.OBJECT)
class PayloadField(serializers.JSONField):
    """A message's payload: a JSON object, judged by ``check_message_payload`` (so a
    list or ``null`` is a field error with the core's words, not DRF's)."""


class SendMessageSerializer(serializers.Serializer):
    """``POST .../runs/{coordination_id}/messages/``: a message to the run."""

    topic = serializers.CharField(
        max_length=MAX_NAME_CHARS,
        trim_whitespace=False,
        help_text=_("What the message is about: a wait_for(state, topic) of the run takes it."),
    )
    payload = PayloadField(
        error_messages={"null": _("the message payload must be a JSON object, not null")},
        help_text=_(
            "A JSON object (at most 64 KiB serialised, 64 levels deep), handed to the next "
            "step as ctx.message.payload."
        ),
    )
    idempotency_key = serializers.CharField(
        max_length=MAX_NAME_CHARS,
        trim_whitespace=False,
        required=False,
        allow_null=True,
        default=None,
        help_text=_(
            "Once per key and run: a second message with the same key stores nothing and "
            "returns the first (200)."
        ),
    )
    sender = serializers.CharField(
        max_length=MAX_NAME_CHARS,
        trim_whitespace=False,
        required=False,
        allow_blank=True,
        default="",
        help_text=_(
            'Who sends it, as a label ("psp", "warehouse"): not authenticated. Left out '
            '(or blank): "user:<your username>". "user:" names an authenticated user: '
            "only your own name may follow it."
        ),
    )

    def validate_topic(self, value: str) -> str:
        return _refused(check_name, value, "the topic")

    def validate_payload(self, value: Any) -> Any:
        return _refused(check_message_payload, value)

    def validate_idempotency_key(self, value: str | None) -> str | None:
        return None if value is None else _refused(check_name, value, "the idempotency key")

    def validate_sender(self, value: str) -> str:
        mine = sender_of(self.context["request"].user)
        if not value:
            return mine
        value = _refused(check_name, value, "the sender")
        if value.startswith(USER_SENDER) and value != mine:
            raise serializers.ValidationError(
                _('"user:" names the authenticated user: send "%(mine)s", or none.')
                % {"mine": mine},
                code="sender_reserved",
            )
        return value


#: The prefix of a sender that names the authenticated user who sent a message.
USER_SENDER = "user:"


def sender_of(user: Any) -> str:
    """The sender of a message *user* sends without naming one: ``user:<username>``."""
    return f"{USER_SENDER}{user.get_username()}"[:MAX_NAME_CHARS]


class MessageSerializer(ReadOnlyModelSerializer):
    """A message sent to a run, as stored (a repeated idempotency key returns the first
    one's: the same body)."""

    payload = PayloadField(read_only=True)

    class Meta:
        model = WorkflowMessage
        fields = [
            "id",
            "coordination_id",
            "topic",
            "payload",
            "sender",
            "sent_at",
            "idempotency_key",
        ]


class MailboxMessageSerializer(MessageSerializer):
    """A message in a run's mailbox, with its delivery: the waiting snapshot it was
    handed to and when (null while it waits for a ``wait_for`` of its topic)."""

    delivered_to = _nullable_text(
        _("The id of the waiting snapshot it was delivered to; null: pending.")
    )
    delivered_at = serializers.DateTimeField(read_only=True, allow_null=True)

    class Meta(MessageSerializer.Meta):
        fields = [*MessageSerializer.Meta.fields, "delivered_to", "delivered_at"]


class RunEventSerializer(ReadOnlyModelSerializer):
    """A value the run published (``ctx.set_event``): the latest one per key."""

    value = serializers.JSONField(read_only=True, allow_null=True)

    class Meta:
        model = WorkflowEvent
        fields = ["key", "value", "updated_at"]


# -- errors ----------------------------------------------------------------------------


#: The body of a 400: the messages of each invalid field (``non_field_errors`` for the
#: body as a whole), or ``{"code", "detail"}`` when the body is not JSON.
VALIDATION_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": 'Field errors ({"field": ["message"]}) or {"code", "detail"}.',
    "additionalProperties": {
        "oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "string"}]
    },
}
