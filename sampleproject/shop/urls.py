"""The shop's async endpoints (``views.py``), under ``/shop/``."""

from django.urls import path

from . import views

app_name = "shop"

urlpatterns = [
    path("orders/<int:order_id>/start/", views.start_order_workflow, name="start-order-workflow"),
    path(
        "approvals/<uuid:approval_id>/approve/",
        views.decide_order_approval,
        {"decision": "approve"},
        name="approve-order",
    ),
    path(
        "approvals/<uuid:approval_id>/reject/",
        views.decide_order_approval,
        {"decision": "reject"},
        name="reject-order",
    ),
]
