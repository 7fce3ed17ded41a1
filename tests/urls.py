from django.apps import apps
from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("flowwarden/", include("flowwarden_django.urls")),
    path("approvals/", include("flowwarden_django.inbox.urls")),
]

if apps.is_installed("rest_framework"):  # the "drf" extra
    urlpatterns.append(path("api/", include("flowwarden_django.api.urls")))
