"""The description of an approval's decision form (``await_approval(form=...)``) in
``GET /api/v1/approvals/<id>/``: what a client needs to build the form whose
validation approving goes through (``describe_form`` in the approvals core)."""

from __future__ import annotations

from django.utils.translation import gettext_lazy as _
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers


class FormChoiceSerializer(serializers.Serializer):
    """One choice of a choice field: the value to send, and its label."""

    value = serializers.JSONField(help_text=_("The value to send in the payload."))
    label = serializers.CharField()


class FormFieldSerializer(serializers.Serializer):
    """One field of an approval's decision form."""

    name = serializers.CharField(help_text=_("The payload key."))
    type = serializers.CharField(
        help_text=_(
            "The Django form field class: CharField, DecimalField (send a string or a "
            "number), IntegerField, BooleanField, DateField (ISO 8601), ChoiceField, "
            "MultipleChoiceField (send a list)..."
        )
    )
    required = serializers.BooleanField()
    label = serializers.CharField()
    help_text = serializers.CharField(allow_blank=True)
    choices = FormChoiceSerializer(
        many=True,
        allow_null=True,
        help_text=_("The allowed values of a choice field (null for other fields)."),
    )
    multiple = serializers.BooleanField(help_text=_("Whether the value is a list of choices."))
    initial = serializers.JSONField(
        allow_null=True, help_text=_("The value to show first (JSON-safe), or null.")
    )


class ApprovalFormSerializer(serializers.Serializer):
    """An approval's decision form: approving sends a ``payload`` it accepts (a 400
    with the form's errors under ``payload`` otherwise); the next step gets its cleaned
    data. Rejecting takes any JSON object."""

    path = serializers.CharField(help_text=_("The import path of the Django form class."))
    fields = FormFieldSerializer(many=True)
    error = serializers.CharField(
        allow_blank=True,
        help_text=_(
            "Empty, unless the form cannot be loaded on this server (then fields is empty "
            "and approving is refused with 409 approval_form_unavailable)."
        ),
    )


#: The schema of the ``form`` field of an approval (null for an untyped one).
form_field_schema = extend_schema_field(ApprovalFormSerializer(allow_null=True))
