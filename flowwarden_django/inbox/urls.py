"""URLs of the approver's inbox (see the package docstring), namespace
``flowwarden-inbox``."""

from django.contrib.auth import views as auth_views
from django.urls import path

from .bulk import BulkDecisionView
from .claims import ClaimView
from .views import ApprovalPage, InboxLoginView, MyApprovals

app_name = "flowwarden-inbox"

urlpatterns = [
    path("", MyApprovals.as_view(), name="list"),
    path("bulk/", BulkDecisionView.as_view(), name="bulk"),
    path("login/", InboxLoginView.as_view(), name="login"),
    path(
        "logout/",
        auth_views.LogoutView.as_view(template_name="flowwarden_django/inbox/logged_out.html"),
        name="logout",
    ),
    path("<uuid:pk>/", ApprovalPage.as_view(), name="approval"),
    path("<uuid:pk>/claim/", ClaimView.as_view(action="claim"), name="claim"),
    path("<uuid:pk>/release/", ClaimView.as_view(action="release"), name="release"),
]
