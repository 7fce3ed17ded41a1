"""Who may call the API: its authentication schemes, and what a 401 says about them.

``FLOWWARDEN["API_AUTHENTICATION"]`` lists DRF authentication classes by dotted path.
By default (``None``): a token (``Authorization: Token <key>``, when
``rest_framework.authtoken`` is installed; ``POST v1/token/`` with a username and
password, or ``manage.py drf_create_token USER``, gives one), HTTP Basic
(``Authorization: Basic ...``, over HTTPS only, please; its failed passwords count
towards ``FLOWWARDEN["API_PASSWORD_THROTTLE"]``, as the token view's do, see
``api.throttling``) and the Django session (log in through the admin or the
approver's inbox). The first scheme names the
``WWW-Authenticate`` challenge of a 401, so an anonymous request gets 401 rather
than 403; the 401's body lists every accepted scheme.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.utils.module_loading import import_string
from django.utils.translation import gettext_lazy as _
from drf_spectacular.authentication import BasicScheme
from rest_framework import exceptions
from rest_framework.authentication import (
    BaseAuthentication,
    BasicAuthentication,
    SessionAuthentication,
    TokenAuthentication,
)

from ..conf import fw_settings
from .throttling import PasswordAttempts


class StrictTokenAuthentication(TokenAuthentication):
    """DRF's token authentication, refusing a key no token can have (a NUL, which
    PostgreSQL would refuse in the query) as an invalid token (401)."""

    def authenticate_credentials(self, key: str) -> Any:
        if "\x00" in key or len(key) > 128:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        return super().authenticate_credentials(key)


class ThrottledBasicAuthentication(BasicAuthentication):
    """DRF's HTTP Basic authentication under the password throttle
    (``api.throttling``): a client or username past its failed attempts gets 429
    before the password is checked, and a wrong password counts as a failure."""

    def authenticate_credentials(
        self, userid: str, password: str, request: Any = None
    ) -> tuple[Any, None]:
        with PasswordAttempts(request, userid).checking(exceptions.AuthenticationFailed):
            return super().authenticate_credentials(userid, password, request)


class ThrottledBasicScheme(BasicScheme):
    """The schema's ``basicAuth`` for :class:`ThrottledBasicAuthentication`
    (drf-spectacular matches DRF's class only, not its subclasses)."""

    target_class = f"{__name__}.ThrottledBasicAuthentication"


def tokens_installed() -> bool:
    """Whether ``rest_framework.authtoken`` (the token table) is installed."""
    return apps.is_installed("rest_framework.authtoken")


def authentication_classes() -> list[type[BaseAuthentication]]:
    """The API's authentication classes (``FLOWWARDEN["API_AUTHENTICATION"]``)."""
    configured = fw_settings.API_AUTHENTICATION
    if configured is not None:
        return [import_string(path) for path in configured]
    schemes: list[type[BaseAuthentication]] = [
        ThrottledBasicAuthentication,
        SessionAuthentication,
    ]
    if tokens_installed():
        schemes.insert(0, StrictTokenAuthentication)
    return schemes


#: How the 401 names a scheme, and how to use it.
_HOW = {
    "Token": "Authorization: Token <key>",
    "Basic": "Authorization: Basic <base64 of user:password>",
    "Session": "a logged-in session (with its CSRF token for writes)",
}


def scheme_name(authenticator: BaseAuthentication) -> str:
    """``Token``, ``Basic``, ``Session`` or the challenge (else class name) of one."""
    if isinstance(authenticator, SessionAuthentication):
        return "Session"
    header = authenticator.authenticate_header(None)  # type: ignore[arg-type]
    if header:
        return str(header).split()[0]
    return type(authenticator).__name__


def accepted_schemes(authenticators: list[BaseAuthentication]) -> tuple[list[str], str]:
    """The names of the accepted schemes, and a sentence on how to use each."""
    names = [scheme_name(a) for a in authenticators]
    how = "; ".join(f"{name} ({_HOW[name]})" if name in _HOW else name for name in names)
    return names, f"This API accepts: {how}."
