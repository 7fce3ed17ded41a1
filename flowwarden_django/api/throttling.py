"""A limit on password guessing: failed password attempts (``POST v1/token/``, HTTP
Basic) counted per client IP and per username tried.

``FLOWWARDEN["API_PASSWORD_THROTTLE"]`` sets the rates in DRF's form (``"20/min"``,
``"10/hour"``): ``{"ip": ..., "username": ...}``, a key left out keeping its default,
``None`` turning that half (or, for the whole setting, the limit) off. Once either
count is reached, every password attempt of that client or for that username is
refused with 429 (``throttled``, with ``Retry-After``) before the password is
checked, the right password too, until the window ends (fixed windows: a rate
``"10/hour"`` counts from each hour of the epoch clock).

Each attempt is counted atomically *before* its password is checked (``cache.add``,
then ``cache.incr``) and taken back unless the password was wrong, so N parallel
guesses get at most the limit's worth of answers other than 429. Only failures stay
counted, so a script that signs in correctly is never held back. The
client IP is DRF's (``REST_FRAMEWORK["NUM_PROXIES"]`` says how many proxies'
``X-Forwarded-For`` entries to trust; unset, a client can name itself, which the
per-username count still catches). The counts live in Django's ``default`` cache,
like DRF's own throttles: share it between processes (Redis, Memcached) for the
limit to hold across them.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import unicodedata
from collections.abc import Iterator
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
    """DRF's rate over the password attempts under one key, counted in fixed windows
    (one cache counter per window): :meth:`reserve` counts an attempt atomically
    (``cache.add`` then ``cache.incr``) *before* its password is checked, so parallel
    guesses cannot all pass a check of a count none of them has raised yet;
    :meth:`release` takes back an attempt that did not fail."""

    cache_format = "flowwarden:password-attempts:%(scope)s:%(ident)s"

    def __init__(self, scope: str, rate: str, ident: str) -> None:
        self.scope = scope
        self.rate = rate
        self.num_requests, self.duration = self.parse_rate(rate)
        # Hashed: a username or X-Forwarded-For text may be long, or hold spaces.
        digest = hashlib.sha256(ident.encode("utf-8", "surrogatepass")).hexdigest()
        self.key = self.cache_format % {"scope": scope, "ident": digest}
        self.window_key: str | None = None
        self.window_end = 0.0

    def get_cache_key(self, request: Request, view: Any) -> str:
        return self.key

    def reserve(self) -> bool:
        """Count one attempt in the current window; ``False`` if that puts the key
        over its limit (the attempt is counted all the same: :meth:`release` it)."""
        now = self.timer()
        window = int(now // self.duration)
        self.window_key = f"{self.key}:{window}"
        self.window_end = (window + 1) * self.duration
        # The counter outlives its window by a second, never less than the window.
        timeout = math.ceil(self.window_end - now) + 1
        self.cache.add(self.window_key, 0, timeout=timeout)
        try:
            count = self.cache.incr(self.window_key)
        except ValueError:  # evicted between add and incr: start it again
            self.cache.add(self.window_key, 1, timeout=timeout)
            count = 1
        return count <= self.num_requests

    def release(self) -> None:
        """Take back the attempt :meth:`reserve` counted (it did not fail)."""
        if self.window_key is None:
            return
        with contextlib.suppress(ValueError):  # the window has gone: nothing to undo
            self.cache.decr(self.window_key)
        self.window_key = None

    def wait(self) -> float:
        """Seconds until the current window ends."""
        return max(self.window_end - self.timer(), 0.0)


def username_key(username: Any) -> str:
    """The form of *username* its count is kept under: NFKC-normalised, stripped and
    case-folded, accents dropped, so that ``"admin "``, ``"ADMIN"``, ``"ADMİN"`` and
    full-width letters count together (a case- or accent-insensitive database
    collation can find one account for all of them)."""
    text = unicodedata.normalize("NFKC", str(username)).strip().casefold()
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(char for char in decomposed if not unicodedata.combining(char))


class PasswordAttempts:
    """The counts one password attempt answers to: its client's IP and the username
    it tries (:func:`username_key`). Use :meth:`checking` around the password check
    (or :meth:`reserve` before it, then :meth:`failed` or :meth:`succeeded`)."""

    def __init__(self, request: Request | None, username: Any) -> None:
        rates = password_throttle_rates()
        self.throttles: list[FailedPasswordThrottle] = []
        if rates["ip"] and request is not None:
            ident = BaseThrottle().get_ident(request) or ""
            self.throttles.append(FailedPasswordThrottle("ip", rates["ip"], ident))
        if rates["username"] and username not in (None, ""):
            name = username_key(username)
            self.throttles.append(FailedPasswordThrottle("username", rates["username"], name))

    def reserve(self) -> None:
        """Count this attempt for the client and the username; raise ``Throttled``
        (429, counting nothing) if either is then over its limit."""
        over = [throttle for throttle in self.throttles if not throttle.reserve()]
        if over:
            self.succeeded()  # a refused attempt is not a failure: take it back
            raise exceptions.Throttled(wait=max(throttle.wait() for throttle in over))

    def failed(self) -> None:
        """The password was wrong: the reserved attempt stays counted."""
        for throttle in self.throttles:
            throttle.window_key = None

    def succeeded(self) -> None:
        """The attempt did not fail (or was refused): take it back."""
        for throttle in self.throttles:
            throttle.release()

    @contextlib.contextmanager
    def checking(self, wrong_password: type[Exception]) -> Iterator[None]:
        """Reserve the attempt, run the password check in the block, and keep the
        attempt counted only when the block raises *wrong_password*: any other
        outcome (success, another error) takes it back."""
        self.reserve()
        try:
            yield
        except wrong_password:
            self.failed()
            raise
        except BaseException:
            self.succeeded()  # not a wrong password
            raise
        self.succeeded()
