"""Operational endpoints: the JSON health view and the Prometheus metrics.

Include them with ``path("flowwarden/", include("flowwarden_django.urls"))``.
Both are open, like a liveness probe or a scrape target: they show stream names,
states, ages and counts, never event data. Put them behind your proxy's access
rules (or wrap the views) where even that must stay private.
"""

from __future__ import annotations

from importlib.util import find_spec

from django.http import HttpRequest, HttpResponse, HttpResponseNotFound, JsonResponse
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.cache import never_cache

from .streams.status import health_report


@method_decorator(never_cache, name="dispatch")
class HealthView(View):
    """``GET`` → ``{"healthy": bool, "streams": {...}}``: 200 when healthy, else 503.

    Healthy when every enabled, auto-start stream runs in some process (see
    ``streams.status.health_report``). A store that cannot be read shows up in the
    stream's ``error``; a database that cannot be read gives 503 with an ``error``.
    """

    http_method_names = ["get", "head", "options"]

    def get(self, request: HttpRequest) -> JsonResponse:
        report = health_report()
        return JsonResponse(report, status=200 if report["healthy"] else 503)


@method_decorator(never_cache, name="dispatch")
class MetricsView(View):
    """``GET`` → the Prometheus exposition of ``flowwarden_django.prometheus.REGISTRY``.

    OpenMetrics when the scraper asks for it, else the text format 0.0.4. 404 with
    the install hint when prometheus-client is not installed.
    """

    http_method_names = ["get", "head", "options"]

    def get(self, request: HttpRequest) -> HttpResponse:
        if find_spec("prometheus_client") is None:
            return HttpResponseNotFound(
                "Prometheus metrics need the prometheus-client package: "
                'pip install "flowwarden-django[prometheus]"\n',
                content_type="text/plain; charset=utf-8",
            )
        from prometheus_client.exposition import choose_encoder

        from .prometheus import REGISTRY

        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return HttpResponse(encoder(REGISTRY), content_type=content_type)
