"""The API's claim, release and reassign of an approval (``ApprovalViewSet`` mixes
``ClaimActions`` in): ``POST v1/approvals/<id>/claim/``, ``.../release/`` and
``.../reassign/``, each through ``workflows.waiting.approvals.claims``.

An approval the user may not see is 404; then the core's verdict: 403
(``approval_forbidden``: may not decide it, or not release or reassign it), 409
(``approval_claimed``: claimed by someone else; ``approval_already_decided``,
``approval_cancelled``) or 410 (``approval_expired``). A reassign's body is judged
(400) after its right (403), as a decision's is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth.models import Group
from django.utils.translation import gettext_lazy as _
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from ..common.user_input import (
    MAX_COMMENT_CHARS,
    UserJSONError,
    check_comment,
    unknown_usernames,
)
from ..models import Approval
from ..workflows.waiting.approvals import ApprovalPermissionError, claim, reassign, release
from ..workflows.waiting.approvals.claims import (
    MAX_REASSIGN_USERS,
    NAME_CHARS,
    REASSIGN,
    ClaimResult,
)
from .permissions import api_database
from .serializers import VALIDATION_ERROR_SCHEMA, ApprovalSerializer, ErrorSerializer


class CommentField(serializers.CharField):
    """An optional comment, kept in the audit trail (the core's limits)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("help_text", _("Why; kept in the audit trail."))
        super().__init__(max_length=MAX_COMMENT_CHARS, allow_blank=True, default="", **kwargs)

    def to_internal_value(self, data: Any) -> str:
        try:
            return check_comment(super().to_internal_value(data))
        except UserJSONError as exc:
            raise serializers.ValidationError(str(exc), code=exc.code) from None


class ClaimSerializer(serializers.Serializer):
    """``POST .../claim/`` or ``.../release/``: an optional comment (no body is fine)."""

    comment = CommentField()


class ReassignSerializer(serializers.Serializer):
    """``POST .../reassign/``: the users and/or the group the approval goes to (at
    least one); its assignees become exactly ``to_users`` and its group ``to_group``
    (null or "": none), and its claim is cleared."""

    to_users = serializers.ListField(
        child=serializers.CharField(max_length=NAME_CHARS),
        max_length=MAX_REASSIGN_USERS,
        default=list,
        help_text=_("Usernames (existing users); they replace the assignees."),
    )
    to_group = serializers.CharField(
        max_length=NAME_CHARS,
        allow_blank=True,
        allow_null=True,
        default=None,
        help_text=_("A group name (an existing group); it replaces the group."),
    )
    comment = CommentField()

    def validate_to_users(self, value: list[str]) -> list[str]:
        names = sorted(set(value) - {""})
        unknown = unknown_usernames(names)
        if unknown:
            raise serializers.ValidationError(
                _("No such user: %(names)s.") % {"names": ", ".join(unknown[:5])},
                code="unknown_user",
            )
        return names

    def validate_to_group(self, value: str | None) -> str:
        if value and not Group.objects.filter(name=value).exists():
            raise serializers.ValidationError(_("No such group."), code="unknown_group")
        return value or ""

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs["to_users"] and not attrs["to_group"]:
            raise serializers.ValidationError(
                _("Name at least one user (to_users) or a group (to_group)."),
                code="no_target",
            )
        return attrs


def _error(description: str) -> OpenApiResponse:
    return OpenApiResponse(ErrorSerializer, description=description)


def _responses(forbidden: str) -> dict[int, Any]:
    return {
        200: ApprovalSerializer,
        400: OpenApiResponse(VALIDATION_ERROR_SCHEMA, description="Invalid body."),
        401: _error("Not authenticated (no or an invalid session or token)."),
        403: _error(forbidden),
        404: _error("No such approval, or not visible to you."),
        409: _error(
            "approval_claimed (claimed by someone else), approval_already_decided or "
            "approval_cancelled."
        ),
        410: _error("approval_expired: the approval expired."),
    }


def _claim_action(
    change: Callable[..., ClaimResult], *, summary: str, description: str, forbidden: str
) -> Any:
    """The ``POST .../<name>/`` action that applies *change* (``claim``, ``release``)
    to the approval as the request's user (``ClaimActions._as_user``)."""

    def change_approval(self: ClaimActions, request: Request, pk: str) -> Response:
        return self._as_user(request, change)

    change_approval.__name__ = change_approval.__qualname__ = change.__name__
    schema = extend_schema(
        operation_id=f"approvals_{change.__name__}",
        summary=summary,
        description=description,
        request=ClaimSerializer,
        responses=_responses(forbidden),
    )
    return schema(action(detail=True, methods=["post"])(change_approval))


class ClaimActions:
    """``claim``, ``release`` and ``reassign`` of ``ApprovalViewSet``."""

    claim = _claim_action(
        claim,
        summary="Claim the approval: only you decide it until it is released",
        description="For a user who may decide it. Claiming it again is a no-op (200). "
        "Audited (`claimed`).",
        forbidden="approval_forbidden: you may not decide it (or no CSRF token).",
    )
    release = _claim_action(
        release,
        summary="Release the claim on the approval",
        description="By its claimant, or a holder of `reassign_approval` (anyone's "
        "claim; 409 `approval_claimed` for anyone else). Releasing an unclaimed "
        "approval is a no-op (200). Audited (`released`).",
        forbidden="approval_forbidden: you may neither decide nor reassign it (or no CSRF token).",
    )

    @extend_schema(
        operation_id="approvals_reassign",
        summary="Hand the approval to other users and/or a group",
        description="Needs `reassign_approval` (403 without it, before the body is "
        "judged). The assignees become exactly `to_users` and the group `to_group`; the "
        "permission rule stays; the claim is cleared. Audited (`reassigned`, with the "
        "assignees before and after).",
        request=ReassignSerializer,
        responses=_responses("approval_forbidden: you may not reassign (or no CSRF token)."),
    )
    @action(detail=True, methods=["post"])
    def reassign(self, request: Request, pk: str) -> Response:
        approval = self.get_object()  # type: ignore[attr-defined]
        user = request.user
        if not user.has_perm(REASSIGN):
            raise ApprovalPermissionError(
                f"{user.get_username()} may not reassign approval {approval.pk}",
                approval_id=str(approval.pk),
            )
        body = ReassignSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        result = reassign(
            approval.pk,
            by=user,
            to_users=data["to_users"],
            to_group=data["to_group"],
            comment=data["comment"],
            using=api_database(),
        )
        return self._answer(request, result)

    def _as_user(self, request: Request, change: Callable[..., ClaimResult]) -> Response:
        """*change* (``claim``, ``release``) the approval as the request's user, with
        the body's comment (no body, or an empty one: none)."""
        approval = self.get_object()  # type: ignore[attr-defined]
        body = ClaimSerializer(data=request.data if request.data else {})
        body.is_valid(raise_exception=True)
        comment = str(body.validated_data["comment"])
        result = change(approval.pk, request.user, comment=comment, using=api_database())
        return self._answer(request, result)

    def _answer(self, request: Request, result: ClaimResult) -> Response:
        rows = Approval.objects.using(api_database()).prefetch_related("assignments")
        approval = rows.filter(pk=result.approval.pk).first() or result.approval
        return Response(ApprovalSerializer(approval, context={"request": request}).data)
