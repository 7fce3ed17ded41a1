"""``POST v1/token/``: a username and password for the user's API token (DRF's
``ObtainAuthToken``, with the API's error rendering), for scripts and tools that
cannot keep a session. Installed only with ``rest_framework.authtoken``.

Failed attempts count towards ``FLOWWARDEN["API_PASSWORD_THROTTLE"]`` (per client IP
and per username: ``api.throttling``); the project's ``DEFAULT_THROTTLE_CLASSES``
apply too (``ObtainAuthToken`` itself turns them off)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import exceptions, serializers
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle

from .exceptions import exception_handler
from .serializers import ErrorSerializer
from .throttling import PasswordAttempts


class TokenView(ObtainAuthToken):
    """Trade a username and password for the user's token (made on first use)."""

    renderer_classes = [JSONRenderer]
    authentication_classes: list[Any] = []  # it is how one authenticates

    def get_exception_handler(self) -> Any:
        return exception_handler

    def get_throttles(self) -> list[BaseThrottle]:
        # Read per request, so the project's setting (or a test's override) applies.
        return [throttle() for throttle in api_settings.DEFAULT_THROTTLE_CLASSES]

    @extend_schema(
        operation_id="token_create",
        summary="Get your API token",
        description="Send `username` and `password`; use the token as "
        "`Authorization: Token <key>`. Too many failed attempts from your client or "
        "for that username are refused with 429 (`throttled`, with `Retry-After`) "
        "before the password is checked.",
        responses={
            200: inline_serializer("Token", {"token": serializers.CharField()}),
            400: OpenApiResponse(description="Wrong or missing credentials."),
            429: OpenApiResponse(ErrorSerializer, description="throttled: too many attempts."),
        },
    )
    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = request.data
        username = data.get("username") if isinstance(data, Mapping) else None
        with PasswordAttempts(request, username).checking(exceptions.ValidationError):
            return super().post(request, *args, **kwargs)
