"""The REST API of flowwarden-django (Django REST framework, the ``drf`` extra).

Include it in a project's URLconf::

    path("api/", include("flowwarden_django.api.urls"))

Everything lives under ``v1/`` (URL namespace ``flowwarden-api``): workflow runs
(read, cancel, send a message, read their messages and events), their snapshots
(read, fork), approvals (read, decide) and the OpenAPI schema at
``v1/schema/``. Authentication is by session (CSRF enforced) or DRF token, set on
the views themselves, so a project's ``REST_FRAMEWORK`` defaults do not change it.
"""

from importlib.util import find_spec

from ..exceptions import MissingExtraError

for _package, _module in (
    ("djangorestframework", "rest_framework"),
    ("drf-spectacular", "drf_spectacular"),
    ("django-filter", "django_filters"),
):
    if find_spec(_module) is None:
        raise MissingExtraError(_package, "drf", "The flowwarden-django REST API")
