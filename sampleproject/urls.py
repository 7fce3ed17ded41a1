from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("flowwarden_django.api.urls")),
    path("approvals/", include("flowwarden_django.inbox.urls")),
    path("flowwarden/", include("flowwarden_django.urls")),
    path("shop/", include("sampleproject.shop.urls")),
]
