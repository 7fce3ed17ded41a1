"""URLs of the operational endpoints: ``path("flowwarden/", include("flowwarden_django.urls"))``
gives ``/flowwarden/health/`` and ``/flowwarden/metrics/``."""

from django.urls import path

from .views import HealthView, MetricsView

app_name = "flowwarden"

urlpatterns = [
    path("health/", HealthView.as_view(), name="health"),
    path("metrics/", MetricsView.as_view(), name="metrics"),
]
