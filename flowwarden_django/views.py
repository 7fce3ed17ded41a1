"""Operational endpoints: the JSON health view and the Prometheus metrics.

Include them with ``path("flowwarden/", include("flowwarden_django.urls"))``.

``/flowwarden/health/`` is open, like a liveness probe, but gives anonymous
callers status and counts only: health, stream states, ages, counts and opaque
instance keys; never event data, error texts, instance ids (host names) or
connection strings. Those details go to the callers ``FLOWWARDEN["HEALTH_DETAILS"]``
names: active staff users by default (see :func:`may_see_details`).

``/flowwarden/metrics/`` is open by default, like a scrape target: its samples are
names, states, ages and counts, with opaque instance keys instead of host names.
``FLOWWARDEN["METRICS_TOKEN"]`` makes it ask for ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from importlib.util import find_spec

from django.http import HttpRequest, HttpResponse, HttpResponseNotFound, JsonResponse
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.cache import never_cache

from .conf import fw_settings
from .streams.operations.status import health_report
from .workflows.queues.health import queue_health

#: ``FLOWWARDEN["HEALTH_DETAILS"]`` values other than a permission name.
HEALTH_DETAILS_STAFF = "staff"
HEALTH_DETAILS_NONE = "none"
HEALTH_DETAILS_ALL = "all"
HEALTH_DETAILS_RULES = (HEALTH_DETAILS_STAFF, HEALTH_DETAILS_NONE, HEALTH_DETAILS_ALL)


def may_see_details(request: HttpRequest) -> bool:
    """Whether *request* gets the detailed health report (``FLOWWARDEN["HEALTH_DETAILS"]``).

    ``"staff"``: active staff users. ``"none"``: nobody (operators use
    ``manage.py flowwarden_streams status``). ``"all"``: everybody, anonymous
    callers too. ``"app_label.codename"``: active users holding that permission
    (superusers hold every permission). Any other value: nobody.
    """
    rule = fw_settings.HEALTH_DETAILS
    if rule == HEALTH_DETAILS_ALL:
        return True
    user = getattr(request, "user", None)
    if user is None or not user.is_active or rule == HEALTH_DETAILS_NONE:
        return False
    if rule == HEALTH_DETAILS_STAFF:
        return bool(user.is_staff)
    return is_permission_name(rule) and user.has_perm(rule)


def is_permission_name(value: object) -> bool:
    """Whether *value* is shaped like ``"app_label.codename"``."""
    if not isinstance(value, str):
        return False
    app_label, dot, codename = value.partition(".")
    return bool(dot and app_label and codename) and "." not in codename


def metrics_tokens() -> list[str] | None:
    """The bearer tokens ``FLOWWARDEN["METRICS_TOKEN"]`` accepts; ``None``: metrics are open.

    A value that is set but holds no usable token (``""``, a number) accepts no
    token at all rather than opening the metrics (the system check reports it).
    """
    value = fw_settings.METRICS_TOKEN
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple):
        return []
    return [token for token in value if isinstance(token, str) and token]


def bearer_token(request: HttpRequest) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else ``None``."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def token_matches(given: str, accepted: Iterable[str]) -> bool:
    """Whether *given* is one of *accepted*, compared in constant time (each one)."""
    given_bytes = given.encode()
    matches = [hmac.compare_digest(given_bytes, token.encode()) for token in accepted]
    return any(matches)


def unauthorized(request: HttpRequest) -> HttpResponse:
    """401 with the ``WWW-Authenticate: Bearer`` challenge of RFC 6750."""
    challenge = 'Bearer realm="flowwarden"'
    if bearer_token(request) is not None:
        challenge += ', error="invalid_token"'
    response = HttpResponse(
        "Unauthorized: send Authorization: Bearer <token>\n",
        status=401,
        content_type="text/plain; charset=utf-8",
    )
    response["WWW-Authenticate"] = challenge
    return response


@method_decorator(never_cache, name="dispatch")
class HealthView(View):
    """``GET`` → ``{"healthy": bool, "streams": {...}}``: 200 when healthy, else 503.

    Healthy when every enabled, auto-start stream runs in some process (see
    ``streams.status.health_report``). A store that cannot be read shows up in the
    stream's ``error``; a database that cannot be read gives 503 with an ``error``.
    With workflow queues configured, ``"queues"`` counts the steps waiting for a slot
    and the stale queues, and ``"degraded"`` is true while one is stale (see
    ``workflows.queues.health``): the status code does not change for that.

    Open to anyone (a probe needs no login). Callers :func:`may_see_details`
    allows get the detailed report: instance ids, each instance's
    ``last_error`` and the errors' texts. Everyone else gets status and counts:
    instance keys instead of ids, no ``last_error``, and errors reduced to what
    failed and the exception's class (``"database unavailable
    (OperationalError)"``).
    """

    http_method_names = ["get", "head", "options"]

    def get(self, request: HttpRequest) -> JsonResponse:
        details = may_see_details(request)
        report = health_report(details=details)
        queues = queue_health(details=details)
        if queues is not None:
            report["queues"] = queues
            report["degraded"] = bool(queues.get("stale")) or "error" in queues
        return JsonResponse(report, status=200 if report["healthy"] else 503)


@method_decorator(never_cache, name="dispatch")
class MetricsView(View):
    """``GET`` → the Prometheus exposition of the flowwarden registry
    (``flowwarden_django.integrations.prometheus.REGISTRY``).

    OpenMetrics when the scraper asks for it, else the text format 0.0.4. 404 with
    the install hint when prometheus-client is not installed.

    Open by default, like a scrape target: samples carry stream names, states,
    ages and counts, and opaque instance keys, never error texts or host names.
    With ``FLOWWARDEN["METRICS_TOKEN"]`` set, a request needs ``Authorization:
    Bearer <token>`` (compared in constant time), else 401 with a
    ``WWW-Authenticate: Bearer`` challenge; a logged-in session is not enough,
    so scrapers and people use the same token.
    """

    http_method_names = ["get", "head", "options"]

    def get(self, request: HttpRequest) -> HttpResponse:
        accepted = metrics_tokens()
        if accepted is not None:
            given = bearer_token(request)
            if given is None or not token_matches(given, accepted):
                return unauthorized(request)
        if find_spec("prometheus_client") is None:
            return HttpResponseNotFound(
                "Prometheus metrics need the prometheus-client package: "
                'pip install "flowwarden-django[prometheus]"\n',
                content_type="text/plain; charset=utf-8",
            )
        from prometheus_client.exposition import choose_encoder

        from .integrations.prometheus import REGISTRY

        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return HttpResponse(encoder(REGISTRY), content_type=content_type)
