"""A URL conf with the approver's inbox only, at ``approvals/`` as in ``tests/urls.py``:
for worker subprocesses that email links to approvals (and have no admin)."""

from django.urls import include, path

urlpatterns = [path("approvals/", include("flowwarden_django.inbox.urls"))]
