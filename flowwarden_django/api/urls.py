"""URLs of the REST API: ``path("api/", include("flowwarden_django.api.urls"))``.

Everything is under ``v1/`` (namespace ``flowwarden-api``):

* ``v1/``: links to the rest (``api-root``)
* ``v1/runs/``, ``v1/runs/<coordination_id>/``, ``v1/runs/<coordination_id>/cancel/``
* ``v1/runs/<coordination_id>/messages/`` (``GET`` the mailbox, ``POST`` a message),
  ``v1/runs/<coordination_id>/events/``
* ``v1/snapshots/``, ``v1/snapshots/<id>/``, ``v1/snapshots/<id>/fork/``
* ``v1/approvals/``, ``v1/approvals/mine/``, ``v1/approvals/<id>/``,
  ``v1/approvals/<id>/approve/``, ``v1/approvals/<id>/reject/``
* ``v1/schema/``: the OpenAPI 3 schema; ``v1/docs/`` (Swagger UI) and ``v1/redoc/``
  (Redoc) show it to people
* ``v1/token/``: ``POST`` a username and password, get an API token (when
  ``rest_framework.authtoken`` is installed)
"""

from django.urls import include, path
from rest_framework.routers import SimpleRouter

from .authentication import tokens_installed
from .docs import ApiDocsView, ApiRedocView
from .run_messages import RunEventViewSet, RunMessageViewSet
from .views import ApiRootView, ApprovalViewSet, RunViewSet, SchemaView, SnapshotViewSet

app_name = "flowwarden-api"

router = SimpleRouter()
router.register("runs", RunViewSet, basename="run")
#: A run's sub-resources: the same coordination id segment as the run's own URL.
RUN = r"runs/(?P<coordination_id>[^/]+)"
router.register(f"{RUN}/messages", RunMessageViewSet, basename="run-message")
router.register(f"{RUN}/events", RunEventViewSet, basename="run-event")
router.register("snapshots", SnapshotViewSet, basename="snapshot")
router.register("approvals", ApprovalViewSet, basename="approval")

urlpatterns = [
    path("v1/", ApiRootView.as_view(), name="api-root"),
    path("v1/schema/", SchemaView.as_view(), name="schema"),
    path("v1/docs/", ApiDocsView.as_view(), name="docs"),
    path("v1/redoc/", ApiRedocView.as_view(), name="redoc"),
    path("v1/", include(router.urls)),
]
if tokens_installed():
    from .tokens import TokenView

    urlpatterns.append(path("v1/token/", TokenView.as_view(), name="token"))
