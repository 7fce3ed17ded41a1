"""``POST v1/token/``: a username and password for the user's API token (DRF's
``ObtainAuthToken``, with the API's error rendering), for scripts and tools that
cannot keep a session. Installed only with ``rest_framework.authtoken``."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from .exceptions import exception_handler


class TokenView(ObtainAuthToken):
    """Trade a username and password for the user's token (made on first use)."""

    renderer_classes = [JSONRenderer]
    authentication_classes: list[Any] = []  # it is how one authenticates

    def get_exception_handler(self) -> Any:
        return exception_handler

    @extend_schema(
        operation_id="token_create",
        summary="Get your API token",
        description="Send `username` and `password` (JSON or a form); use the token as "
        "`Authorization: Token <key>`.",
        responses={
            200: inline_serializer("Token", {"token": serializers.CharField()}),
            400: OpenApiResponse(description="Wrong or missing credentials."),
        },
    )
    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().post(request, *args, **kwargs)
