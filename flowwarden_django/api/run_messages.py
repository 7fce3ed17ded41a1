"""A run's messages and events: ``v1/runs/{coordination_id}/messages/`` (``GET`` the
mailbox, ``POST`` a message) and ``v1/runs/{coordination_id}/events/`` (``GET`` the
values the run published).

The run is the one ``GET v1/runs/{coordination_id}/`` shows: a run the user may not
see is 404 (``run_not_found``) here too, before anything else is judged. Sending
needs ``send_message_workflowrun`` as well (403 ``send_message_forbidden``); the body
is checked by the messages core's own validator (400 with its words per field), then
the core sends (``waiting.messages.send_message``): 201 with the new message, 200 with
the first one for a repeated idempotency key, 409 ``run_finished`` for a completed run
and ``run_cancelled`` for a cancelled one. The run is woken once the message commits
(the request's transaction, if ``ATOMIC_REQUESTS``), by the core.

Payloads and event values are shown to whoever may see the run, as the admin shows a
run's resume input: they are the run's data, not health details.
"""

from __future__ import annotations

import logging
from typing import Any

from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import exceptions, mixins, status
from rest_framework.request import Request
from rest_framework.response import Response

from ..models import WorkflowEvent, WorkflowMessage, WorkflowRun
from ..workflows.waiting.messages import send_message
from .filters import MessageFilter
from .permissions import CanSendMessages, api_database, readable_runs
from .serializers import (
    MailboxMessageSerializer,
    MessageSerializer,
    RunEventSerializer,
    SendMessageSerializer,
)
from .views import (
    BAD_REQUEST,
    DETAIL_ERRORS,
    LIST_ERRORS,
    SEGMENT,
    ApiViewSet,
    error_response,
    list_schema,
)

logger = logging.getLogger("flowwarden_django.api")

RUN_ID = OpenApiParameter(
    "coordination_id",
    str,
    OpenApiParameter.PATH,
    description="The run's coordination id.",
)
#: The list errors of a run's sub-resource: its run may be missing too.
RUN_LIST_ERRORS = {**LIST_ERRORS, 404: error_response("No such run (or page), or not visible.")}


class RunScopedViewSet(ApiViewSet):
    """Base of a run's sub-resources: the run the URL names, if the user may see it."""

    lookup_value_regex = SEGMENT
    not_found_code = "run_not_found"
    #: The order of the run's rows (of ``queryset``'s model).
    row_order = "id"

    def get_queryset(self) -> Any:
        rows = self.queryset.model.objects.using(api_database())
        return rows.filter(coordination_id=self.kwargs.get("coordination_id")).order_by(
            self.row_order
        )

    def get_run(self) -> WorkflowRun:
        """The run of the URL: 404 unless it exists and is visible; then the object
        permissions (sending)."""
        cid = str(self.kwargs.get("coordination_id", ""))
        run = None
        if "\x00" not in cid:  # PostgreSQL refuses NUL in a query parameter
            run = readable_runs(self.request.user).filter(pk=cid).first()
        if run is None:
            raise exceptions.NotFound(code=self.not_found_code)
        self.check_object_permissions(self.request, run)
        return run

    def page_of(self, rows: Any, serializer: Any) -> Response:
        """One page of *rows* through *serializer* (a class)."""
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(serializer(page, many=True).data)


@extend_schema_view(
    list=list_schema(
        MailboxMessageSerializer,
        errors=RUN_LIST_ERRORS,
        operation_id="runs_messages_list",
        summary="The run's messages, oldest first",
        description="Its mailbox: every message sent to the run, in the order sent, with "
        "its delivery (`delivered_to`: the waiting snapshot that took it; null while "
        "pending). `?topic=`, `?delivered=true|false`. 404 when the run does not exist or "
        "is not visible to you.",
        parameters=[RUN_ID],
    ),
    create=extend_schema(
        operation_id="runs_messages_create",
        summary="Send the run a message",
        description="Needs `send_message_workflowrun` (403 without it). A run waiting "
        "for the topic (`wait_for`) is woken once the message commits; otherwise the "
        "message waits in its mailbox for such a wait. 201 with the new message; 200 "
        "with the first one when its `idempotency_key` was sent to the run before "
        "(nothing stored). 409 `run_finished` for a completed run, `run_cancelled` for a "
        "cancelled one.",
        parameters=[RUN_ID],
        request=SendMessageSerializer,
        responses={
            201: MessageSerializer,
            200: MessageSerializer,
            400: BAD_REQUEST,
            **DETAIL_ERRORS,
            403: error_response(
                "send_message_forbidden: you may not send messages (or no CSRF token)."
            ),
            409: error_response("run_finished (completed) or run_cancelled: nothing stored."),
        },
    ),
)
class RunMessageViewSet(mixins.ListModelMixin, RunScopedViewSet):
    """The messages of one visible run (``WorkflowMessage``), and sending one."""

    queryset = WorkflowMessage.objects.none()  # for the schema; see get_queryset
    serializer_class = MailboxMessageSerializer
    action_serializers = {"create": SendMessageSerializer}
    action_permissions = {"create": CanSendMessages}

    filter_backends = [DjangoFilterBackend]
    filterset_class = MessageFilter

    def list(self, request: Request, coordination_id: str) -> Response:
        self.get_run()
        return self.page_of(self.filter_queryset(self.get_queryset()), MailboxMessageSerializer)

    def create(self, request: Request, coordination_id: str) -> Response:
        run = self.get_run()
        body = SendMessageSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        data = body.validated_data
        db = api_database()
        sent = send_message(
            run.pk,
            data["topic"],
            data["payload"],
            idempotency_key=data["idempotency_key"],
            sender=data["sender"],
            using=db,
        )
        logger.info(
            "user %s sent message %s (%s) to run %s through the API%s",
            request.user.get_username(),
            sent.message.id,
            sent.message.topic,
            run.pk,
            "" if sent.created else " (a repeated idempotency key: nothing stored)",
        )
        row = WorkflowMessage.objects.using(db).get(pk=sent.message.id)
        code = status.HTTP_201_CREATED if sent.created else status.HTTP_200_OK
        return Response(MessageSerializer(row).data, status=code)


@extend_schema_view(
    list=list_schema(
        RunEventSerializer,
        errors=RUN_LIST_ERRORS,
        operation_id="runs_events_list",
        summary="The values the run published, by key",
        description="What its steps set with `ctx.set_event(key, value)`: the latest value "
        "of each key (as `Workflow.get_event` reads it). 404 when the run does not exist "
        "or is not visible to you.",
        parameters=[RUN_ID],
    ),
)
class RunEventViewSet(mixins.ListModelMixin, RunScopedViewSet):
    """The events of one visible run (``WorkflowEvent``)."""

    serializer_class = RunEventSerializer
    queryset = WorkflowEvent.objects.none()  # for the schema; see get_queryset
    row_order = "key"

    def list(self, request: Request, coordination_id: str) -> Response:
        self.get_run()
        return self.page_of(self.get_queryset(), RunEventSerializer)
