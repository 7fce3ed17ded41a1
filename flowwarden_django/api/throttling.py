"""A limit on password guessing: failed password attempts (``POST v1/token/``, HTTP
Basic) counted per client IP and per username tried.

``FLOWWARDEN["API_PASSWORD_THROTTLE"]`` sets the rates in DRF's form (``"20/min"``,
``"10/hour"``): ``{"ip": ..., "username": ...}``, a key left out keeping its default,
``None`` turning that half (or, for the whole setting, the limit) off. Once either
count is reached, every password attempt of that client or for that username is
refused with 429 (``throttled``, with ``Retry-After``) before the password is
checked, the right password too, until the oldest failure leaves the window.

Only failures count, so a script that signs in correctly is never held back. The
client IP is DRF's (``REST_FRAMEWORK["NUM_PROXIES"]`` says how many proxies'
``X-Forwarded-For`` entries to trust; unset, a client can name itself, which the
per-username count still catches). The counts live in Django's ``default`` cache,
like DRF's own throttles: share it between processes (Redis, Memcached) for the
limit to hold across them.
"""

from __future__ import annotations

import hashlib
from typing import Any

from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle, SimpleRateThrottle

from ..conf import DEFAULTS, fw_settings

SETTING = "API_PASSWORD_THROTTLE"
#: The halves of the limit: what each counts failures by.
KINDS = ("ip", "username")


def password_throttle_rates() -> dict[str, str | None]:
    """The configured rate of each half (``None``: that half is off)."""
    configured = fw_settings.API_PASSWORD_THROTTLE
    if configured is None:
        return dict.fromkeys(KINDS)
    return {**DEFAULTS[SETTING], **configured}


class FailedPasswordThrottle(SimpleRateThrottle):
    """DRF's rate throttle over the failed password attempts under one key: asking
    (``allow_request``) counts nothing, :meth:`record_failure` counts one."""

    cache_format = "flowwarden:password-failures:%(scope)s:%(ident)s"

    def __init__(self, scope: str, rate: str, ident: str) -> None:
        self.scope = scope
        self.rate = rate
        self.num_requests, self.duration = self.parse_rate(rate)
        # Hashed: a username or X-Forwarded-For text may be long, or hold spaces.
        digest = hashlib.sha256(ident.encode("utf-8", "surrogatepass")).hexdigest()
        self.key = self.cache_format % {"scope": scope, "ident": digest}

    def get_cache_key(self, request: Request, view: Any) -> str:
        return self.key

    def throttle_success(self) -> bool:
        return True  # counted only when it fails

    def record_failure(self) -> None:
        """Count one failed attempt now."""
        now = self.timer()
        history = [at for at in self.cache.get(self.key, []) if at > now - self.duration]
        history.insert(0, now)
        self.cache.set(self.key, history, self.duration)


class PasswordAttempts:
    """The counts one password attempt answers to: its client's IP and the username
    it tries (case-folded: a case-insensitive database finds one account for both)."""

    def __init__(self, request: Request | None, username: Any) -> None:
        rates = password_throttle_rates()
        self.throttles: list[FailedPasswordThrottle] = []
        if rates["ip"] and request is not None:
            ident = BaseThrottle().get_ident(request) or ""
            self.throttles.append(FailedPasswordThrottle("ip", rates["ip"], ident))
        if rates["username"] and username not in (None, ""):
            name = str(username).casefold()
            self.throttles.append(FailedPasswordThrottle("username", rates["username"], name))

    def check(self) -> None:
        """Raise ``Throttled`` (429) if the client or the username is over its limit."""
        waits = [t.wait() for t in self.throttles if not t.allow_request(None, None)]  # type: ignore[arg-type]
        if waits:
            known = [wait for wait in waits if wait is not None]
            raise exceptions.Throttled(wait=max(known) if known else None)

    def failed(self) -> None:
        """Count this attempt as a failure, for the client and for the username."""
        for throttle in self.throttles:
            throttle.record_failure()
