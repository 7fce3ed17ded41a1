"""The API's views: runs, snapshots, approvals, the root and the OpenAPI schema.

Authentication (``api.authentication``: a token, HTTP Basic and the session by
default) and the error rendering are set here on every view, so a project's
``REST_FRAMEWORK`` defaults do not change them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from django.db import connections, transaction
from django.http import Http404
from django.utils.decorators import method_decorator
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from drf_spectacular.views import SpectacularAPIView
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import AllowAny, BasePermission, IsAuthenticated
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from ..models import Approval, SnapshotRecord, WorkflowRun
from ..streams.operations.status import status_error
from ..views import may_see_details
from ..workflows.runs.records import UnknownRunError
from ..workflows.storage.encryption import SnapshotDecryptionError
from ..workflows.storage.serializers import StateDecodeError
from ..workflows.storage.snapshot import WorkflowSnapshot
from ..workflows.storage.store import SnapshotStore
from ..workflows.waiting.approvals import check_may_decide, decidable_approvals, decide
from ..workflows.waiting.cancellation import cancel_coordination
from .approval_claims import ClaimActions, ReassignSerializer
from .authentication import authentication_classes
from .enum_overrides import own_enum_overrides
from .exceptions import RunFinished, SnapshotUnreadable, exception_handler
from .filters import ApprovalFilter, RunFilter, SnapshotFilter, StoreParameter
from .pagination import PagePagination, SnapshotCursorPagination
from .parsers import StorableJSONParser
from .permissions import (
    CanCancelRuns,
    CanForkRuns,
    SnapshotAccess,
    api_database,
    readable_approvals,
    readable_runs,
)
from .serializers import (
    VALIDATION_ERROR_SCHEMA,
    ApprovalDecidedSerializer,
    ApprovalDetailSerializer,
    ApprovalSerializer,
    CancelSerializer,
    DecisionSerializer,
    ErrorSerializer,
    ForkSerializer,
    RunDetailSerializer,
    RunSerializer,
    SnapshotDetailSerializer,
    SnapshotSerializer,
    snapshot_data,
)
from .stores import fork_snapshot

#: Path segments: anything but "/" (coordination ids may hold ":" or ".").
SEGMENT = r"[^/]+"


def api_reverse(request: Request, name: str, **kwargs: Any) -> str:
    """The absolute URL of this API's view *name*, in the namespace it was reached by."""
    namespace = request.resolver_match.namespace if request.resolver_match else ""
    return reverse(f"{namespace}:{name}" if namespace else name, kwargs=kwargs, request=request)


def error_response(description: str) -> OpenApiResponse:
    """An error response of the schema: the ``Error`` body, and what it means."""
    return OpenApiResponse(ErrorSerializer, description=description)


BAD_REQUEST = OpenApiResponse(VALIDATION_ERROR_SCHEMA, description="Invalid parameters or body.")
UNAUTHENTICATED = error_response("Not authenticated (no or an invalid session or token).")
NOT_FOUND = error_response("No such object, or not visible to you.")
CONFLICT = error_response(
    "approval_already_decided, approval_cancelled, approval_claimed (claimed by someone "
    "else), run_busy or approval_form_unavailable (the approval's form cannot be loaded "
    "on this server)."
)
GONE = error_response("approval_expired: the approval expired before it was decided.")
THROTTLED = error_response(
    "throttled: too many failed HTTP Basic passwords from your client or for that "
    "username (or your project's DRF throttles); see Retry-After."
)
READ_ERRORS = {401: UNAUTHENTICATED, 429: THROTTLED}
LIST_ERRORS = {400: BAD_REQUEST, **READ_ERRORS, 404: error_response("No such page.")}
DETAIL_ERRORS = {**READ_ERRORS, 404: NOT_FOUND}


def list_schema(serializer: Any, errors: dict[int, Any] = LIST_ERRORS, **schema: Any) -> Any:
    """The schema of a list action: a page of *serializer*'s rows, or one of *errors*;
    *schema*: the other ``extend_schema`` arguments."""
    return extend_schema(responses={200: serializer(many=True), **errors}, **schema)


class ApiAuthentication:
    """Mixin: the API's authentication (``api.authentication``: the schemes
    ``FLOWWARDEN["API_AUTHENTICATION"]`` names, read per request), permission and
    error rendering."""

    permission_classes: list[type[BasePermission]] = [IsAuthenticated]
    versioning_class = None  # the version is the URL prefix (v1/)

    def get_authenticators(self) -> list[Any]:
        return [scheme() for scheme in authentication_classes()]

    def get_exception_handler(self) -> Callable[..., Response | None]:
        return exception_handler


#: JSON for programs; DRF's browsable API for a person's browser (``Accept: text/html``).
RENDERERS = [JSONRenderer, BrowsableAPIRenderer]


class ApiViewSet(ApiAuthentication, viewsets.GenericViewSet):
    """Base of the API's viewsets: JSON in, JSON out (and the browsable API)."""

    renderer_classes = RENDERERS
    parser_classes = [StorableJSONParser]
    filter_backends: list[Any] = []
    pagination_class = PagePagination
    #: The ``code`` of this viewset's 404.
    not_found_code = "not_found"
    #: The serializer class of each action that does not use ``serializer_class``.
    action_serializers: dict[str, Any] = {}
    #: The permission each such action needs besides being authenticated.
    action_permissions: dict[str, type[BasePermission]] = {}

    def get_serializer_class(self) -> Any:
        return self.action_serializers.get(self.action) or super().get_serializer_class()

    def get_permissions(self) -> list[BasePermission]:
        needed = self.action_permissions.get(self.action)
        if needed is not None:
            return [IsAuthenticated(), needed()]
        return super().get_permissions()

    def get_object(self) -> Any:
        # PostgreSQL refuses NUL in a query parameter (an error, not "no rows").
        if "\x00" in str(self.kwargs.get(self.lookup_url_kwarg or self.lookup_field, "")):
            raise exceptions.NotFound(code=self.not_found_code)
        try:
            return super().get_object()
        except Http404:
            raise exceptions.NotFound(code=self.not_found_code) from None


# -- runs ------------------------------------------------------------------------------


@extend_schema_view(
    list=list_schema(
        RunSerializer,
        operation_id="runs_list",
        summary="Workflow runs, most recently updated first",
        description="The runs you may see: all with `view_workflowrun`, else those of "
        "coordinations with an approval visible to you.",
    ),
    retrieve=extend_schema(
        operation_id="runs_retrieve",
        summary="One workflow run",
        description="404 when the run does not exist or is not visible to you.",
        responses={200: RunDetailSerializer, **DETAIL_ERRORS},
    ),
    cancel=extend_schema(
        operation_id="runs_cancel",
        summary="Cancel the run: it never runs another step",
        description="Needs `cancel_workflowrun` (403 without it). A step running now "
        "finishes and its result is discarded; the run's pending approvals are "
        "cancelled and audited. 409 `run_finished` when it is completed or already "
        "cancelled.",
        request=CancelSerializer,
        responses={
            200: RunDetailSerializer,
            400: BAD_REQUEST,
            **DETAIL_ERRORS,
            403: error_response("cancel_forbidden: you may not cancel runs (or no CSRF token)."),
            409: error_response("run_finished: the run is completed or already cancelled."),
        },
    ),
)
class RunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ApiViewSet):
    """Workflow runs (``WorkflowRun``) visible to the user."""

    queryset = WorkflowRun.objects.none()  # for the schema; see get_queryset
    serializer_class = RunSerializer
    action_serializers = {"cancel": CancelSerializer, "retrieve": RunDetailSerializer}
    action_permissions = {"cancel": CanCancelRuns}

    lookup_field = "coordination_id"
    lookup_value_regex = SEGMENT
    filter_backends = [DjangoFilterBackend]
    filterset_class = RunFilter
    not_found_code = "run_not_found"

    def get_queryset(self) -> Any:
        return readable_runs(self.request.user).order_by("-updated_at", "coordination_id")

    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, coordination_id: str) -> Response:
        run = self.get_object()
        body = CancelSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        by = request.user.get_username()
        reason = body.validated_data["reason"]
        try:
            outcome = cancel_coordination(run.pk, reason, by=by, using=api_database())
        except UnknownRunError:  # deleted meanwhile
            raise exceptions.NotFound(code=self.not_found_code) from None
        if not outcome.cancelled:
            raise RunFinished(f"The run is already {outcome.status}.")
        run.refresh_from_db()
        return Response(RunDetailSerializer(run, context={"request": request}).data)


# -- snapshots -------------------------------------------------------------------------

SNAPSHOT_ID = OpenApiParameter("id", str, OpenApiParameter.PATH, description="A snapshot id.")


def _snapshot_schema(status: int, errors: dict[int, Any], **schema: Any) -> Any:
    """The schema of an action on one snapshot (``?store=``) that answers *status* with
    its detail, or one of *errors* besides a bad request and the detail errors."""
    return extend_schema(
        parameters=[SNAPSHOT_ID, StoreParameter],
        responses={status: SnapshotDetailSerializer, 400: BAD_REQUEST, **DETAIL_ERRORS, **errors},
        **schema,
    )


@extend_schema_view(
    list=list_schema(
        SnapshotSerializer,
        operation_id="snapshots_list",
        summary="Snapshots, newest first (keyset paging)",
        description="Rows without their state, of the runs visible to you. Follow `next` "
        "to page. A row the store cannot read (a wrong key, tampered data) is listed with "
        "an `error`.",
        parameters=[SnapshotFilter],
    ),
    retrieve=_snapshot_schema(
        200,
        {409: error_response("snapshot_unreadable: a wrong key or tampered data.")},
        operation_id="snapshots_retrieve",
        summary="One snapshot, with its state and metadata",
        description="404 when the snapshot does not exist or is not visible to you; "
        "409 `snapshot_unreadable` when the store cannot read it.",
    ),
    fork=_snapshot_schema(
        201,
        {403: error_response("fork_forbidden: you may not fork (or no CSRF token).")},
        operation_id="snapshots_fork",
        summary="Branch the run off this snapshot with a new state",
        description="Needs `fork_workflowrun` (403 without it). The new snapshot becomes "
        "the run's latest: the next run continues from it.",
        request=ForkSerializer,
    ),
)
class SnapshotViewSet(ApiViewSet):
    """Workflow snapshots of a ``SnapshotStore`` (``?store=<alias>``, default
    ``default``), read through the store's SPI."""

    serializer_class = SnapshotDetailSerializer
    action_serializers = {"list": SnapshotSerializer, "fork": ForkSerializer}
    action_permissions = {"fork": CanForkRuns}

    lookup_field = "id"
    lookup_value_regex = SEGMENT
    pagination_class = SnapshotCursorPagination
    not_found_code = "snapshot_not_found"

    def get_queryset(self) -> Any:
        # Snapshots are read from the store (`list`, `get_snapshot`), never from a
        # queryset; DRF's browsable API asks for one all the same (its filter form).
        return SnapshotRecord.objects.none()

    def list(self, request: Request) -> Response:
        params = SnapshotFilter(data=request.query_params)
        params.is_valid(raise_exception=True)
        query = params.query()
        access = SnapshotAccess.of(request.user)
        paginator: SnapshotCursorPagination = self.paginator  # type: ignore[assignment]
        if query.coordination_id is not None and not access.allows(query.coordination_id):
            return paginator.get_paginated_response([])
        if access.nothing:
            return paginator.get_paginated_response([])
        query = dataclasses.replace(query, with_state=False)
        if not access.everything and query.coordination_id is None:
            query = dataclasses.replace(query, coordination_ids=access.coordinations)
        page = paginator.paginate_store(params.snapshot_store.list, query, request)
        return paginator.get_paginated_response([snapshot_data(s) for s in page])

    def retrieve(self, request: Request, id: str) -> Response:
        _store, snapshot = self.get_snapshot(id)
        return Response(snapshot_data(snapshot, detail=True))

    @action(detail=True, methods=["post"])
    def fork(self, request: Request, id: str) -> Response:
        store, source = self.get_snapshot(id)
        body = ForkSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        child = fork_snapshot(store, source, body.validated_data["state"])
        location = api_reverse(request, "snapshot-detail", id=child.id)
        if "store" in request.query_params:
            location = replace_query_param(location, "store", request.query_params["store"])
        data = snapshot_data(child, detail=True)
        return Response(data, status=status.HTTP_201_CREATED, headers={"Location": location})

    def get_snapshot(self, snapshot_id: str) -> tuple[SnapshotStore, WorkflowSnapshot]:
        """The store and the snapshot the URL names: 404 unless it exists and is
        visible; then the object permissions (fork)."""
        params = StoreParameter(data=self.request.query_params)
        params.is_valid(raise_exception=True)
        store = params.snapshot_store
        snapshot = None
        access = SnapshotAccess.of(self.request.user)
        if len(snapshot_id) <= 64 and "\x00" not in snapshot_id:
            try:
                snapshot = store.load(snapshot_id)
            except (SnapshotDecryptionError, StateDecodeError) as exc:
                # Where it belongs cannot be read either: only a reader of every
                # run learns that it exists.
                if not access.everything:
                    raise exceptions.NotFound(code=self.not_found_code) from None
                # The store's words only for whom HEALTH_DETAILS names, as in the admin.
                if not may_see_details(self.request):
                    raise SnapshotUnreadable() from None
                raise SnapshotUnreadable(status_error(exc)) from None
        if snapshot is None or not access.allows(snapshot.coordination_id):
            raise exceptions.NotFound(code=self.not_found_code)
        self.check_object_permissions(self.request, snapshot)
        return store, snapshot


# -- approvals -------------------------------------------------------------------------

APPROVAL_ID = OpenApiParameter(
    "id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="An approval id."
)
APPROVAL_LIST = {200: ApprovalSerializer(many=True), **LIST_ERRORS}
DECISION_RESPONSES = {
    200: ApprovalDecidedSerializer,
    400: BAD_REQUEST,
    401: UNAUTHENTICATED,
    403: error_response("approval_forbidden: you may not decide it (or no CSRF token)."),
    404: NOT_FOUND,
    409: CONFLICT,
    410: GONE,
    429: THROTTLED,
}


def _decision_schema(decision: str) -> Any:
    return extend_schema(
        operation_id=f"approvals_{decision}",
        summary=f"{decision.capitalize()} the approval (idempotent)",
        description=(
            "The same decision again returns 200 with the first decision's "
            "representation; the other decision is refused with 409. An approval with a "
            "form (`form` in its detail) is approved only with a payload the form "
            "accepts: otherwise 400, with the form's field errors under `payload`."
        ),
        parameters=[APPROVAL_ID],
        request=DecisionSerializer,
        responses=DECISION_RESPONSES,
    )


def non_atomic_everywhere(view: Callable[..., Any]) -> Callable[..., Any]:
    """``transaction.non_atomic_requests`` for every database (approvals may be
    routed to any of them)."""
    for alias in connections:
        view = transaction.non_atomic_requests(using=alias)(view)
    return view


@extend_schema_view(
    list=extend_schema(
        operation_id="approvals_list",
        summary="Approvals visible to you",
        description="Newest request first.",
        responses=APPROVAL_LIST,
    ),
    mine=extend_schema(
        operation_id="approvals_mine",
        summary="Pending approvals you may decide",
        description="Assigned to you by username, group or permission; every pending "
        "approval for holders of `decide_approval`.",
        responses=APPROVAL_LIST,
    ),
    retrieve=extend_schema(
        operation_id="approvals_retrieve",
        summary="One approval, with the paused state and its audit trail",
        description="404 when the approval does not exist or is not visible to you.",
        parameters=[APPROVAL_ID],
        responses={200: ApprovalDetailSerializer, **DETAIL_ERRORS},
    ),
    approve=_decision_schema("approve"),
    reject=_decision_schema("reject"),
)
# Never inside ATOMIC_REQUESTS: a decision commits on its own (and resumes the run
# after its commit), and a refused one keeps its audit event.
@method_decorator(non_atomic_everywhere, name="dispatch")
class ApprovalViewSet(ClaimActions, mixins.ListModelMixin, mixins.RetrieveModelMixin, ApiViewSet):
    """Approvals visible to the user, their decisions, claims and reassignments."""

    queryset = Approval.objects.none()  # for the schema; see get_queryset
    serializer_class = ApprovalSerializer
    action_serializers = {
        "retrieve": ApprovalDetailSerializer,
        "approve": DecisionSerializer,
        "reject": DecisionSerializer,
        "reassign": ReassignSerializer,
    }

    lookup_value_regex = SEGMENT
    filter_backends = [DjangoFilterBackend]
    filterset_class = ApprovalFilter
    not_found_code = "approval_not_found"

    def get_queryset(self) -> Any:
        user = self.request.user
        if self.action == "mine":
            rows = decidable_approvals(user, using=api_database())
        else:
            rows = readable_approvals(user)
        rows = rows.prefetch_related("assignments")
        if self.action == "retrieve":
            rows = rows.prefetch_related("events")
        return rows.order_by("-requested_at", "id")

    @action(detail=False)
    def mine(self, request: Request) -> Response:
        return self.list(request)

    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str) -> Response:
        return self.make_decision(request, "approved")

    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str) -> Response:
        return self.make_decision(request, "rejected")

    def make_decision(self, request: Request, decision: str) -> Response:
        """Decide the approval: 404 unless visible, 403 unless the user may decide,
        400 for a bad body, then the core's verdict (409, 410)."""
        approval = self.get_object()
        body = DecisionSerializer(data=request.data)
        valid = body.is_valid()
        db = api_database()
        # A user who may not decide is refused (403) before the body is judged, and
        # the attempt is audited like every refused decision.
        attempt = body.validated_data if valid else {}
        check_may_decide(
            approval,
            decision,
            request.user,
            comment=attempt.get("comment", ""),
            payload=attempt.get("payload"),
            using=db,
        )
        if not valid:
            raise exceptions.ValidationError(body.errors)
        result = decide(
            approval.pk,
            decision,
            request.user,
            comment=body.validated_data["comment"],
            payload=body.validated_data["payload"],
            using=db,
        )
        # Read back as stored, so a repeated decision returns the very same body.
        rows = Approval.objects.using(db)
        decided = rows.prefetch_related("assignments").filter(pk=approval.pk).first()
        warnings = [result.warning] if result.warning else []
        serializer = ApprovalDecidedSerializer(
            decided or result.approval, context={"request": request, "warnings": warnings}
        )
        return Response(serializer.data)


# -- the root and the schema -----------------------------------------------------------


class ApiRootView(ApiAuthentication, APIView):
    """``GET v1/``: links to the collections, the schema and its pages."""

    renderer_classes = RENDERERS
    links = {
        "runs": "run-list",
        "snapshots": "snapshot-list",
        "approvals": "approval-list",
        "my_approvals": "approval-mine",
        "schema": "schema",
        "docs": "docs",
        "redoc": "redoc",
    }

    @extend_schema(
        operation_id="api_root",
        summary="Links to the API's collections",
        description="Absolute URLs by name.",
        responses={200: OpenApiTypes.OBJECT, **READ_ERRORS},
    )
    def get(self, request: Request) -> Response:
        return Response({key: api_reverse(request, name) for key, name in self.links.items()})


def only_this_api(endpoints: list[tuple[Any, ...]], **kwargs: Any) -> list[tuple[Any, ...]]:
    """drf-spectacular preprocessing hook: keep the endpoints of this package only
    (a project may serve other DRF APIs)."""
    package = __name__.rpartition(".")[0]
    return [
        e
        for e in endpoints
        if getattr(getattr(e[3], "cls", None), "__module__", "").startswith(f"{package}.")
    ]


class SchemaView(ApiAuthentication, SpectacularAPIView):
    """``GET v1/schema/``: the OpenAPI 3 schema of this API (YAML, or JSON with
    ``?format=json`` or ``Accept: application/vnd.oai.openapi+json``). Open to anyone,
    as its pages are (``api.docs``): it describes the API, and holds no data."""

    permission_classes = [AllowAny]

    custom_settings = {
        "TITLE": "flowwarden-django API",
        "DESCRIPTION": "Workflow runs, snapshots and approvals of flowwarden-django.",
        "VERSION": "1",
        "PREPROCESSING_HOOKS": [f"{__name__}.only_this_api"],
        # For generated clients (openapi-python-client and the like): request bodies in
        # JSON only, the content type clients should send (the token view also reads
        # forms, undocumented), and request components apart from response ones (a
        # request model without the response's read-only fields, such as `token`).
        "PARSER_WHITELIST": ["rest_framework.parsers.JSONParser"],
        "COMPONENT_SPLIT_REQUEST": True,
        "ENUM_NAME_OVERRIDES": {
            "RunStatusEnum": "flowwarden_django.models.WorkflowRun.Status",
            "ApprovalStatusEnum": "flowwarden_django.models.Approval.Status",
        },
    }

    @extend_schema(
        operation_id="schema_retrieve",
        summary="This OpenAPI schema",
        description="YAML by default; JSON with `?format=json`. Open to anyone.",
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        with own_enum_overrides():
            return super().get(request, *args, **kwargs)
