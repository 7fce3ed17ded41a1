"""The list endpoints' filters (query parameters).

Runs and approvals are querysets, filtered with django-filter. Snapshots come from a
``SnapshotStore``, so their parameters are validated by a serializer and turned into
a ``CheckpointQuery``; a malformed value is a 400 naming the parameter.
"""

from __future__ import annotations

from typing import Any

import django_filters
from django.utils.translation import gettext_lazy as _
from rest_framework import serializers

from ..models import Approval, WorkflowMessage, WorkflowRun
from ..workflows.storage.snapshot import CheckpointQuery
from ..workflows.storage.store import SnapshotStore, snapshot_stores
from ..workflows.waiting.approvals.due import overdue_q
from .stores import DEFAULT_ALIAS, store_aliases


class RunFilter(django_filters.FilterSet):
    """``?status=waiting&workflow=orders``."""

    status = django_filters.ChoiceFilter(choices=WorkflowRun.Status.choices)
    workflow = django_filters.CharFilter(field_name="workflow_name")

    class Meta:
        model = WorkflowRun
        fields = ["status", "workflow"]


class ApprovalFilter(django_filters.FilterSet):
    """``?status=pending&workflow=refund&coordination=<id>&claimed_by=me&unclaimed=true
    &overdue=true``."""

    status = django_filters.ChoiceFilter(choices=Approval.Status.choices)
    workflow = django_filters.CharFilter(field_name="workflow_name")
    coordination = django_filters.CharFilter(field_name="coordination_id")
    claimed_by = django_filters.CharFilter(
        method="filter_claimed_by",
        max_length=150,
        label=_("Claimed by this username; me: by you."),
    )
    unclaimed = django_filters.ChoiceFilter(
        choices=[("true", "true"), ("false", "false")],
        method="filter_unclaimed",
        label=_("Unclaimed (true) or claimed (false)."),
    )
    overdue = django_filters.ChoiceFilter(
        choices=[("true", "true"), ("false", "false")],
        method="filter_overdue",
        label=_(
            "Overdue (true: pending and past its escalation time or its expiry) or not (false)."
        ),
    )

    class Meta:
        model = Approval
        fields = ["status", "workflow", "coordination", "claimed_by", "unclaimed", "overdue"]

    def filter_claimed_by(self, queryset: Any, name: str, value: str) -> Any:
        if value == "me":
            user = getattr(self.request, "user", None)
            value = user.get_username() if user is not None else ""
            if not value:
                return queryset.none()
        return queryset.filter(claimed_by=value)

    def filter_unclaimed(self, queryset: Any, name: str, value: str) -> Any:
        if value == "true":
            return queryset.filter(claimed_by="")
        return queryset.exclude(claimed_by="")

    def filter_overdue(self, queryset: Any, name: str, value: str) -> Any:
        if value == "true":
            return queryset.filter(overdue_q())
        return queryset.exclude(overdue_q())


class MessageFilter(django_filters.FilterSet):
    """``?topic=payment&delivered=false``: a run's messages of one topic, pending or
    delivered."""

    topic = django_filters.CharFilter()
    delivered = django_filters.BooleanFilter(
        field_name="delivered_to",
        lookup_expr="isnull",
        exclude=True,
        label=_("Delivered (true) or pending (false)."),
    )

    class Meta:
        model = WorkflowMessage
        fields = ["topic", "delivered"]


class StoreParameter(serializers.Serializer):
    """``?store=<alias>``: which snapshot store (default ``default``); the schema
    lists the aliases configured when it is served."""

    store = serializers.ChoiceField(
        choices=[],
        default=DEFAULT_ALIAS,
        help_text=_('An alias of FLOWWARDEN["SNAPSHOT_STORES"] (default: "default").'),
        error_messages={"invalid_choice": _("Unknown snapshot store {input!r}.")},
    )

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["store"].choices = store_aliases()  # type: ignore[attr-defined]
        return fields

    @property
    def snapshot_store(self) -> SnapshotStore:
        """The store the validated parameters name."""
        return snapshot_stores[self.validated_data["store"]]


def _optional_text(help_text: Any) -> serializers.CharField:
    """An optional text parameter, taken as given (blank allowed, not trimmed)."""
    return serializers.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        max_length=255,
        help_text=help_text,
    )


class SnapshotFilter(StoreParameter):
    """``?coordination=&agent=&since=&until=&order=newest|oldest&store=``."""

    coordination = _optional_text(_("Only this coordination (run)."))
    agent = _optional_text(_("Only snapshots of this agent (workflow)."))
    since = serializers.DateTimeField(
        required=False, help_text=_("Created at or after this moment (ISO 8601).")
    )
    until = serializers.DateTimeField(
        required=False, help_text=_("Created at or before this moment (ISO 8601).")
    )
    order = serializers.ChoiceField(
        choices=["newest", "oldest"],
        default="newest",
        help_text=_("newest (default) or oldest first."),
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        since, until = attrs.get("since"), attrs.get("until")
        if since is not None and until is not None and since > until:
            raise serializers.ValidationError({"until": [_("Must not be before since.")]})
        return attrs

    def query(self) -> CheckpointQuery:
        """The ``CheckpointQuery`` of the validated parameters (without paging)."""
        data = self.validated_data
        return CheckpointQuery(
            coordination_id=data.get("coordination") or None,
            agent_name=data.get("agent") or None,
            since=data.get("since"),
            until=data.get("until"),
            newest_first=data["order"] == "newest",
        )
