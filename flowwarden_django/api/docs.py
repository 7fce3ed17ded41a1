"""The API's pages for people: Swagger UI (``v1/docs/``) and Redoc (``v1/redoc/``),
both reading this API's schema (``v1/schema/``) in whatever namespace it is mounted.

Their scripts come from ``drf-spectacular-sidecar`` (part of the ``drf`` extra) when
``drf_spectacular_sidecar`` is in ``INSTALLED_APPS``, so the pages work without
reaching a CDN; without it, from the project's ``SPECTACULAR_SETTINGS``
(``SWAGGER_UI_DIST``, ``REDOC_DIST``: a CDN by default). Open to anyone, like the
schema.
"""

from __future__ import annotations

from django.apps import apps
from drf_spectacular.settings import spectacular_settings
from drf_spectacular.views import SpectacularRedocView, SpectacularSwaggerView
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.reverse import reverse

TITLE = "flowwarden-django API"
SIDECAR = "drf_spectacular_sidecar"


def _static(path: str) -> str | None:
    """The sidecar's copy of *path*, when the sidecar app is installed."""
    if not apps.is_installed(SIDECAR):
        return None
    from django.templatetags.static import static

    return static(f"{SIDECAR}/{path}")


def _schema_url(request: Request) -> str:
    namespace = request.resolver_match.namespace if request.resolver_match else ""
    return reverse(f"{namespace}:schema" if namespace else "schema")


class _SchemaPage:
    """Mixin of the two pages: open to anyone, titled, reading this API's schema."""

    permission_classes = [AllowAny]
    title = TITLE

    def _get_schema_url(self, request: Request) -> str:
        return _schema_url(request)


class ApiDocsView(_SchemaPage, SpectacularSwaggerView):
    """``GET v1/docs/``: Swagger UI, to read the API and try it (with your session)."""

    @staticmethod
    def _swagger_ui_resource(filename: str) -> str:
        return _static(f"swagger-ui-dist/{filename}") or (
            f"{spectacular_settings.SWAGGER_UI_DIST}/{filename}"
        )

    @staticmethod
    def _swagger_ui_favicon() -> str:
        return _static("swagger-ui-dist/favicon-32x32.png") or (
            spectacular_settings.SWAGGER_UI_FAVICON_HREF
        )


class ApiRedocView(_SchemaPage, SpectacularRedocView):
    """``GET v1/redoc/``: the API's reference, as Redoc lays it out."""

    @staticmethod
    def _redoc_standalone() -> str:
        return _static("redoc/bundles/redoc.standalone.js") or (
            f"{spectacular_settings.REDOC_DIST}/bundles/redoc.standalone.js"
        )
